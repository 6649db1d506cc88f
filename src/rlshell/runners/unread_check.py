"""The unread-key check: every key a run does not read, with the reason, and the
problems of those set to other than their defaults (a key accepted and ignored is a bug).

The trainers' own unread keys come from their rules (`rlshell.runners.rules`, built from
the pieces in `rlshell.runners.unread`); `unread_keys` holds those that depend on other
settings whatever the trainer, and the engines' (their registry entries say).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from rlshell.cluster.placement import PlacementPlan
from rlshell.config import (
    Config,
    all_key_paths,
)
from rlshell.engines.rollout import ENGINE_KEYS, ROLLOUT_ENGINES
from rlshell.engines.training import BACKEND_KEYS, TRAINING_BACKENDS
from rlshell.runners.spec import RunSpec

__all__ = [
    "set_unread_problems",
    "unread_keys",
    "unread_leaves",
    "unread_problems",
]


def unread_problems(spec: RunSpec, plan: PlacementPlan | None = None) -> list[str]:
    """A line for each key set (to other than its default) where the run does not read it.

    ``plan`` (when known) adds the keys the placement leaves unread.
    """
    return set_unread_problems(spec.config, unread_leaves(spec, plan))


def set_unread_problems(config: Config, unread: Mapping[str, str]) -> list[str]:
    """A line for each key of ``unread`` (`unread_leaves`) that ``config`` sets to other than
    its default, in the schema's order."""
    return [
        f"{leaf}: {unread[leaf]}" for leaf in _KEY_ORDER if leaf in unread and _is_set(config, leaf)
    ]


def unread_leaves(spec: RunSpec, plan: PlacementPlan | None = None) -> dict[str, str]:
    """Every key (leaf) the run does not read, set or not, with the reason: `unread_keys`
    and the trainer's `rlshell.runners.rules.TrainerRules.unread`, sections expanded (the
    trainer's reason wins for a key both name)."""
    declared = unread_keys(spec, plan)
    if spec.rules is not None:
        declared.update(spec.rules.unread(spec))
    return {leaf: reason for key, reason in declared.items() for leaf in _leaves(key)}


def unread_keys(spec: RunSpec, plan: PlacementPlan | None = None) -> dict[str, str]:
    """Keys a run does not read in some settings of others, whatever its trainer, with the
    reason (a trainer's own are `rlshell.runners.rules.TrainerRules.unread`)."""
    config = spec.config
    unread: dict[str, str] = {}
    if not config.actor.model.is_lora:
        for key, what in (
            ("lora_rank", "the rank of"),
            ("lora_alpha", "the scale α / rank of"),
            ("lora_target_modules", "the layers that get"),
        ):
            unread[f"actor.model.{key}"] = (
                f"{what} the LoRA adapters that actor.model.is_lora adds; without them "
                "nothing reads it"
            )
    unread.update(_engine_unread(config, plan))
    if config.algorithm.rollout_is is None:
        unread["algorithm.rollout_is_threshold"] = (
            "the cap of the rollout importance weights; algorithm.rollout_is is null, so there "
            "are none"
        )
    for tracker in ("wandb", "swanlab"):
        if tracker not in config.logger.backends:
            unread[f"logger.{tracker}_project"] = (
                f"names the project of the {tracker} backend, and logger.backends has no "
                f"'{tracker}'"
            )
    if config.runner.runner_type != "reasoning" or config.runner.mode != "async":
        unread["rollout.partial_rollouts"] = (
            "interrupts the reasoning runner's generations in flight when new weights arrive, "
            "in runner.mode='async'; "
            + (
                "runner.mode is 'sync'"
                if config.runner.runner_type == "reasoning"
                else f"the {config.runner.runner_type} runner has no such generations"
            )
        )
    runner = config.runner.runner_type
    if runner in ("embodied", "probe") or (runner == "reasoning" and not config.agent.tools):
        unread["agent"] = "configures the reasoning runner's multi-turn, tool-using rollouts; " + (
            "agent.tools is empty, so a rollout is one prompt and one completion"
            if runner == "reasoning"
            else f"the {runner} runner has no text rollouts"
        )
    if config.runner.runner_type == "probe":
        unread["runner.mode"] = (
            "runs a trainer's rollout ahead of its update; the probe trains nothing"
        )
        unread["algorithm.max_staleness"] = (
            "bounds an asynchronous run's staleness; the probe trains nothing"
        )
    if config.checkpoint.interval == 0:
        never = "checkpoint.interval is 0: the run saves no checkpoint"
        unread["checkpoint.keep_last"] = f"{never} to keep or prune"
        unread["checkpoint.export_hf"] = f"{never} to export"
        unread["checkpoint.save_on_interrupt"] = f"{never}, also on Ctrl-C"
    if plan is not None and spec.rules is not None and _unsharded_actor(config, plan):
        fsdp = config.actor.fsdp_config
        alone = (
            f"one actor rank whose model is already in fsdp_config.mixed_precision "
            f"({fsdp.mixed_precision}) is not sharded (there is nothing to shard or cast), "
            "so FSDP wraps nothing; place the actor on more ranks or leave it at its default"
        )
        unread["actor.fsdp_config.wrap_policy"] = alone
        unread["actor.fsdp_config.reshard_after_forward"] = alone
    return unread


def _engine_unread(config: Config, plan: PlacementPlan | None) -> dict[str, str]:
    """The engine keys (`ENGINE_KEYS`, `BACKEND_KEYS`) the named rollout engine and training
    backend do not read, and what their entries say they leave unread where."""
    unread: dict[str, str] = {}
    sections = (
        (config.rollout.backend, ROLLOUT_ENGINES, ENGINE_KEYS, "engine"),
        (config.actor.backend, TRAINING_BACKENDS, BACKEND_KEYS, "backend"),
    )
    for name, registry, keys, kind in sections:
        if name not in registry:
            continue  # refused by name (_registry_problems)
        entry = registry.get(name)
        for key, what in keys.items():
            if entry.reads_key(key):
                continue
            readers = [other for other in registry.names() if registry.get(other).reads_key(key)]
            engines = " or ".join(readers) or "plug-in"
            unread[key] = (
                f"{what.format(engines=engines)}; the '{name}' {kind} reads no such setting"
            )
        unread.update(entry.unread(config, plan))
    return unread


def _unsharded_actor(config: Config, plan: PlacementPlan) -> bool:
    # What rlshell.engines.training.fsdp.FSDPModelManager decides from the model's dtypes.
    actor = next((c for c in plan.components if c.name == "actor"), None)
    return (
        actor is not None
        and actor.world_size == 1
        and config.actor.model.precision == config.actor.fsdp_config.mixed_precision
    )


_DEFAULT = Config()


_KEY_ORDER = tuple(all_key_paths())  # problems about unread keys are listed in schema order


def _leaves(key: str) -> list[str]:
    """``key`` itself, or every key under it when it names a section."""
    value: Any = _DEFAULT
    for part in key.split("."):
        value = getattr(value, part)
    if attrs.has(type(value)):
        return [
            leaf for item in attrs.fields(type(value)) for leaf in _leaves(f"{key}.{item.name}")
        ]
    return [key]


def _is_set(config: Config, key: str) -> bool:
    """Whether ``key`` holds other than its default in ``config``."""
    value: Any = config
    default: Any = _DEFAULT
    for part in key.split("."):
        value, default = getattr(value, part), getattr(default, part)
    return bool(value != default)
