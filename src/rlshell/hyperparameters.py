"""Which config key sets which of rlcore's hyperparameters: the actor reads them through
these maps, and validation refuses those the chosen estimator or loss does not use
(`rlshell.runners.unread.hyperparameters_unread`). Nothing here imports torch.

Not in `rlshell.config`: the config-read tracer (`rlshell.config.tracing`) counts no read
made inside that package (copies, validation), and `read_for` is where the actor reads
the hyperparameters of its loss and estimator."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlcore.registry import Registry
from rlshell.config import Config

__all__ = ["ESTIMATOR_KEYS", "LOSS_KEYS", "read_for"]

ESTIMATOR_KEYS = {
    "algorithm.gamma": "gamma",
    "algorithm.lam": "lam",
    "algorithm.baseline_form": "baseline_form",
}
"""Config keys → the `rlcore.advantages.AdvantageConfig` field each sets."""

LOSS_KEYS = {
    "algorithm.clip_low": "clip_low",
    "algorithm.clip_high": "clip_high",
    "algorithm.dual_clip": "dual_clip",
    "algorithm.behavior_weight_cap": "behavior_weight_cap",
}
"""Config keys → the `rlcore.losses.PolicyLossConfig` field each sets (``loss_agg_mode``
sets ``agg`` for every loss: the actor aggregates the KL and entropy terms with it too)."""


def read_for(
    registry: Registry[Any], name: str, config: Config, keys: Mapping[str, str]
) -> dict[str, Any]:
    """The hyperparameters of ``keys`` (config key → field) that entry ``name`` reads, from
    ``config``; the others are left unread (validation refused them set)."""
    reads = registry.reads(name)
    values: dict[str, Any] = {}
    for key, hyperparameter in keys.items():
        if reads is None or hyperparameter in reads:
            section, _, field = key.partition(".")
            values[hyperparameter] = getattr(getattr(config, section), field)
    return values
