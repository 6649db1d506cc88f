"""Rollout with Hugging Face ``generate``: runs on any device, the CPU included.

`HFRolloutEngine` holds a full (unsharded) copy of the policy and samples
``n`` responses per prompt with temperature, top-p and top-k. The behaviour
log-probs come from the logits ``generate`` returns, scaled by the sampling
temperature exactly as the actor recomputes them (`rlcore.logprobs`);
top-p/top-k truncation is not reflected in them, as in verl. Weights arrive
from the actor through `weight_targets` (`rlshell.sync.codec`), or are lent
for each rollout by `HFRolloutEngine.borrowing` (``weight_sync='shared'``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from rlcore.logprobs import token_logprobs
from rlcore.tokens import response_mask
from rlshell.engines.rollout import WeightSwitch
from rlshell.rollout import RolloutBatch, SamplingParams, left_padded

__all__ = ["HFRolloutEngine"]


class HFRolloutEngine:
    """Samples from a Hugging Face causal LM; weights are replaced in place by syncs."""

    def __init__(self, model: nn.Module, tokenizer: object, device: torch.device) -> None:
        from transformers import PreTrainedTokenizerBase

        if not isinstance(tokenizer, PreTrainedTokenizerBase):
            raise TypeError(f"expected a transformers tokenizer, got {type(tokenizer).__name__}")
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the rollout tokenizer needs a pad token and an EOS token")
        tokenizer.padding_side = "left"
        self.model = model.to(device).eval()
        for param in self.model.parameters():
            param.requires_grad_(False)
        # What `borrowing` checks lent weights against (the parameters may be released).
        self.param_specs = {
            name: (param.shape, param.dtype) for name, param in self.model.named_parameters()
        }
        self.tokenizer = tokenizer
        self.device = device
        self.pad_id = int(tokenizer.pad_token_id)
        self.eos_id = int(tokenizer.eos_token_id)

    def weight_targets(self) -> dict[str, Tensor]:
        """The model's own tensors by state-dict name (not detached copies): syncs write into them.

        They may be re-homed (``tensor.data = ...``, `rlshell.sync.codec.FlatBuckets`).
        """
        return dict(self.model.state_dict(keep_vars=True))

    def weights_updated(self) -> None:
        """Nothing to do: ``generate`` reads the very tensors the sync wrote."""

    @contextmanager
    def borrowing(self, weights: Mapping[str, Tensor]) -> Iterator[None]:
        """Generate with ``weights`` (full tensors by parameter name) instead of weights of its own.

        ``rollout.weight_sync='shared'``: inside, each parameter of the
        engine's model is an alias of the tensor of its name (for FSDP2, the
        unsharded parameters of `FSDPModelManager.unsharded`), so nothing is
        copied; on exit they are released again (`release_weights`). Names,
        shapes and dtypes must match exactly.
        """
        params = dict(self.model.named_parameters())
        problems = [f"{name!r} missing" for name in params if name not in weights]
        problems += [f"{name!r} unexpected" for name in weights if name not in params]
        for name, (shape, dtype) in self.param_specs.items():
            lent = weights.get(name)
            if lent is not None and (lent.shape != shape or lent.dtype != dtype):
                problems.append(
                    f"{name!r} is {tuple(lent.shape)} {lent.dtype}, the engine's "
                    f"{tuple(shape)} {dtype}"
                )
        if problems:
            raise ValueError(
                "the borrowed weights do not fit the engine's model: " + "; ".join(problems[:5])
            )
        try:
            for name, param in params.items():
                param.data = weights[name].detach()
            yield
        finally:
            self.release_weights()

    def release_weights(self) -> None:
        """Drop the model's weights (parameters become empty) until `borrowing` lends others."""
        for param in self.model.parameters():
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)

    def offload(self) -> None:
        """Move the model to host memory while the actor updates on the GPU they share.

        Each tensor moves in place (``tensor.data``), so the sync targets
        (`weight_targets`) stay the engine's own and a weight sync can land
        while it is offloaded.
        """
        self._move(torch.device("cpu"))

    def reload(self) -> None:
        """Move the model back to the engine's device before it generates."""
        self._move(self.device)

    def _move(self, device: torch.device) -> None:
        leaving = next((t.device for t in self.model.parameters() if t.device.type == "cuda"), None)
        for tensor in self.weight_targets().values():
            tensor.data = tensor.data.to(device)
        self.model.to(device)  # what no sync writes: non-persistent buffers (rotary tables)
        if leaving is not None and device != leaving:
            torch.cuda.synchronize(leaving)
            torch.cuda.empty_cache()

    @torch.no_grad()
    def generate(
        self, prompts: Sequence[str], params: SamplingParams, seed: int | None = None
    ) -> RolloutBatch:
        """``params.n`` responses per prompt, grouped: rows g·n … g·n+n−1 answer prompt g.

        ``seed`` makes the sampling reproducible without touching the
        process's global random state (a resumed run samples what the
        uninterrupted run sampled).
        """
        batch, _ = self._generate(self._encode(prompts), params, seed, None)
        return batch

    @torch.no_grad()
    def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, seed: int | None = None
    ) -> RolloutBatch:
        """`generate` for prompts given as token ids, left-padded here (a multi-turn
        rollout's contexts: what was sampled stays the very tokens sampled)."""
        batch, _ = self._generate(left_padded(prompt_ids, self.pad_id), params, seed, None)
        return batch

    @torch.no_grad()
    def generate_partial(
        self,
        prompts: Sequence[str],
        params: SamplingParams,
        seed: int | None,
        switch: WeightSwitch,
    ) -> tuple[RolloutBatch, Tensor]:
        """`generate`, interrupted whenever ``switch`` has new weights waiting
        (``rollout.partial_rollouts``): the tokens so far are kept, the weights
        applied (`WeightSwitch.apply`) and the unfinished responses continued
        from where they stopped (their prefix encoded again by the new weights).

        Returns the batch and each response token's version (the weights that
        sampled it; -1 past a response's end). A token's behaviour log-prob is
        that of the weights that sampled it. Without an interruption this is
        `generate`, token for token.
        """
        batch, versions = self._generate(self._encode(prompts), params, seed, switch)
        assert versions is not None
        return batch, versions

    def _encode(self, prompts: Sequence[str]) -> tuple[Tensor, Tensor]:
        if not prompts:
            raise ValueError("generate() needs at least one prompt")
        encoded = self.tokenizer(list(prompts), return_tensors="pt", padding=True)
        return encoded["input_ids"], encoded["attention_mask"].bool()

    def _generate(
        self,
        encoded: tuple[Tensor, Tensor],
        params: SamplingParams,
        seed: int | None,
        switch: WeightSwitch | None,
    ) -> tuple[RolloutBatch, Tensor | None]:
        from transformers import StoppingCriteriaList

        prompt_ids = encoded[0].repeat_interleave(params.n, dim=0)
        prompt_mask = encoded[1].repeat_interleave(params.n, dim=0)
        ends = params.end_ids(self.eos_id)
        sampling: dict[str, object] = (
            {"do_sample": False}
            if params.greedy
            else {
                "do_sample": True,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k,
            }
        )
        temperature = 1.0 if params.greedy else params.temperature
        rows, budget = prompt_ids.shape[0], params.max_new_tokens
        responses = torch.full((rows, budget), self.pad_id, dtype=torch.long)
        logprobs = torch.zeros(rows, budget)
        versions = torch.full((rows, budget), -1, dtype=torch.long)
        active = torch.arange(rows)  # the rows still generating
        done = 0  # tokens generated so far by every active row (they advance in lockstep)
        with torch.random.fork_rng(devices=[] if self.device.type == "cpu" else [self.device]):
            if seed is not None:
                torch.manual_seed(seed)
            while True:
                version = -1 if switch is None else switch.version
                interrupt = _Interrupt(switch)
                extra: dict[str, object] = dict(sampling)
                if params.min_new_tokens > done:  # else the model's generation config decides
                    extra["min_new_tokens"] = params.min_new_tokens - done
                ids = torch.cat([prompt_ids[active], responses[active, :done]], dim=1)
                mask = torch.cat(
                    [prompt_mask[active], torch.ones(len(active), done, dtype=torch.bool)], dim=1
                )
                with torch.inference_mode():  # lighter than no_grad per op; outputs copied below
                    out = self.model.generate(  # type: ignore[operator]
                        input_ids=ids.to(self.device),
                        attention_mask=mask.to(self.device).long(),
                        max_new_tokens=budget - done,
                        pad_token_id=self.pad_id,
                        eos_token_id=list(ends),
                        return_dict_in_generate=True,
                        output_logits=True,
                        stopping_criteria=StoppingCriteriaList([interrupt]),
                        **extra,
                    )
                # Inference tensors cannot be saved for backward: a trainer will index these.
                new = out.sequences[:, ids.shape[1] :].cpu().clone()
                logits = torch.stack(out.logits, dim=1).float().cpu()
                width = new.shape[1]
                span = slice(done, done + width)
                responses[active, span] = new
                logprobs[active, span] = token_logprobs(logits, new, temperature)
                versions[active, span] = version
                done += width
                active = active[~torch.isin(new, torch.tensor(ends)).any(dim=1)]
                if not interrupt.fired or done >= budget or len(active) == 0:
                    break  # (weights that came with the last token wait for the next request)
                assert switch is not None
                switch.apply()  # the new weights, between two tokens of the same responses
        responses, logprobs, versions = responses[:, :done], logprobs[:, :done], versions[:, :done]
        mask = response_mask(responses, ends)
        texts = self.tokenizer.batch_decode(
            [row[valid & (row != self.eos_id)] for row, valid in zip(responses, mask, strict=True)],
            skip_special_tokens=True,
        )
        batch = RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=responses,
            response_mask=mask,
            logprobs=torch.where(mask, logprobs, 0.0),
            response_texts=tuple(texts),
            group_size=params.n,
        )
        return batch, None if switch is None else torch.where(mask, versions, -1)


class _Interrupt:
    """A ``generate`` stopping criterion that stops every row once new weights are waiting."""

    def __init__(self, switch: WeightSwitch | None) -> None:
        self.switch = switch
        self.fired = False

    def __call__(self, input_ids: Tensor, scores: Tensor, **kwargs: object) -> Tensor:
        self.fired = self.fired or (self.switch is not None and self.switch.pending())
        return torch.full(
            (input_ids.shape[0],), self.fired, dtype=torch.bool, device=input_ids.device
        )
