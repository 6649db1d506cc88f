"""A rollout engine added from outside rlshell: one file, one registration.

``recording_hf`` samples with the Hugging Face engine and writes one JSON line per call
(which method, how many prompts and responses, the sampling parameters, the seed, the
tokens it produced) to the file its option ``record_path`` names. It is what a user
writes to trace what a run asks of its engine, and the shape of any new engine: a
builder, an options record, and `register_rollout_engine` in ``register()``.

    RLSHELL_EXT_MODULE=recording_engine PYTHONPATH=examples .venv/bin/python -m rlshell.train \\
        configs/grpo.py rollout.backend=recording_hf \\
        rollout.engine_options.record_path=/tmp/calls.jsonl

Validation asks the registered entry: the option is checked against `RecordingOptions`
(a missing or misspelt one is refused before start), and the keys only other engines
read (``rollout.cpu_kv_cache_mb``, ...) are refused as unread.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from attrs import frozen
from torch import Tensor, nn

from rlshell.config import Config, RolloutConfig
from rlshell.engines.rollout import (
    RolloutEngine,
    WeightSwitch,
    engine_options,
    register_rollout_engine,
)
from rlshell.engines.rollout.hf import HFRolloutEngine
from rlshell.rollout import RolloutBatch, SamplingParams


@frozen
class RecordingOptions:
    """``rollout.engine_options`` of ``recording_hf``: where its calls are written."""

    record_path: str


class RecordingEngine:
    """The Hugging Face engine, each generating call recorded as a JSON line."""

    def __init__(self, inner: HFRolloutEngine, record_path: Path) -> None:
        self.inner = inner
        self.record_path = record_path

    def _record(
        self,
        method: str,
        prompts: int,
        params: SamplingParams,
        seed: int | None,
        batch: RolloutBatch,
    ) -> RolloutBatch:
        line = {
            "method": method,
            "prompts": prompts,
            "responses": int(batch.response_mask.shape[0]),
            "n": params.n,
            "max_new_tokens": params.max_new_tokens,
            "seed": seed,
            "tokens": int(batch.response_mask.sum()),
        }
        with self.record_path.open("a") as record:
            record.write(json.dumps(line) + "\n")
        return batch

    def weight_targets(self) -> dict[str, Tensor]:
        return self.inner.weight_targets()

    def weights_updated(self) -> None:
        self.inner.weights_updated()

    def generate(
        self, prompts: Sequence[str], params: SamplingParams, seed: int | None = None
    ) -> RolloutBatch:
        batch = self.inner.generate(prompts, params, seed=seed)
        return self._record("generate", len(prompts), params, seed, batch)

    def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, seed: int | None = None
    ) -> RolloutBatch:
        batch = self.inner.generate_from_ids(prompt_ids, params, seed=seed)
        return self._record("generate_from_ids", len(prompt_ids), params, seed, batch)

    def generate_partial(
        self,
        prompts: Sequence[str],
        params: SamplingParams,
        seed: int | None,
        switch: WeightSwitch,
    ) -> tuple[RolloutBatch, Tensor]:
        batch, versions = self.inner.generate_partial(prompts, params, seed, switch)
        return self._record("generate_partial", len(prompts), params, seed, batch), versions

    def offload(self) -> None:
        self.inner.offload()

    def reload(self) -> None:
        self.inner.reload()


def build_recording_engine(
    config: RolloutConfig, model: nn.Module, tokenizer: Any, device: torch.device
) -> RolloutEngine:
    options: RecordingOptions = engine_options(config)
    return RecordingEngine(HFRolloutEngine(model, tokenizer, device), Path(options.record_path))


def record_path_problems(config: Config, plan: object) -> list[str]:
    """Refused before start: a record file whose folder does not exist."""
    path = Path(str(config.rollout.engine_options.get("record_path", "")))
    if path.name and not path.parent.is_dir():
        return [f"rollout.engine_options.record_path: no folder {path.parent} to write it in"]
    return []


def register() -> None:
    register_rollout_engine(
        "recording_hf",
        build_recording_engine,
        options=RecordingOptions,
        problems=record_path_problems,
    )
