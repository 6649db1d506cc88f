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
from rlcore.rollout import response_mask
from rlshell.rollout import RolloutBatch, SamplingParams

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
        if not prompts:
            raise ValueError("generate() needs at least one prompt")
        encoded = self.tokenizer(list(prompts), return_tensors="pt", padding=True)
        prompt_ids = encoded["input_ids"].repeat_interleave(params.n, dim=0)
        prompt_mask = encoded["attention_mask"].repeat_interleave(params.n, dim=0).bool()
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
        if params.min_new_tokens:  # else the model's generation config decides
            sampling["min_new_tokens"] = params.min_new_tokens
        with torch.random.fork_rng(devices=[] if self.device.type == "cpu" else [self.device]):
            if seed is not None:
                torch.manual_seed(seed)
            with torch.inference_mode():  # lighter than no_grad per op; outputs copied below
                out = self.model.generate(  # type: ignore[operator]
                    input_ids=prompt_ids.to(self.device),
                    attention_mask=prompt_mask.to(self.device).long(),
                    max_new_tokens=params.max_new_tokens,
                    pad_token_id=self.pad_id,
                    eos_token_id=self.eos_id,
                    return_dict_in_generate=True,
                    output_logits=True,
                    **sampling,
                )
        width = prompt_ids.shape[1]
        # Inference tensors cannot be saved for backward: a trainer will index with these.
        responses = out.sequences[:, width:].cpu().clone()
        logits = torch.stack(out.logits, dim=1).float().cpu()
        temperature = 1.0 if params.greedy else params.temperature
        logprobs = token_logprobs(logits, responses, temperature)
        mask = response_mask(responses, self.eos_id)
        texts = self.tokenizer.batch_decode(
            [row[valid & (row != self.eos_id)] for row, valid in zip(responses, mask, strict=True)],
            skip_special_tokens=True,
        )
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=responses,
            response_mask=mask,
            logprobs=torch.where(mask, logprobs, 0.0),
            response_texts=tuple(texts),
            group_size=params.n,
        )
