"""Every check a config passes before anything starts.

`validate` returns every problem as a line that starts with the key path it
concerns:

- field constraints declared in `rlshell.config.schema` (``lr`` positive, ...);
- names in the registries (models, envs, rewards, rlcore's estimators and
  losses), with did-you-mean, and ``reward.weights``' names
  (`rlshell.rewards.weighted.weights_problems`);
- rules every trainer shares: a group size a group baseline can use, clip
  ranges, a rollout TP that fits its engine, a cluster that can be planned and
  a placement that fits it (`rlshell.cluster.placement`);
- the trainer's own rules (`rlshell.runners.rules.TrainerRules.problems`) and
  the keys it does not read (`TrainerRules.unread`, with the keys no run reads
  in some settings, `unread_keys`): a key set to anything but its default where
  it is not read is refused with the reason. The rules are imported, not the
  trainers: validation does not load their workers' stacks;
- run-only checks (``for_run=True``): files and checkpoints that must exist,
  Hub ids that must be in the Hub cache or downloadable (`rlshell.hub`),
  packages the named backends need (wandb, vllm, megatron-core, mani-skill),
  engines this installation has, GPUs that a backend needs, no simulated
  cluster. ``--dry-run`` skips them.

Here: `validate` and the checks of the config itself. The unread-key check is
`rlshell.runners.unread_check`, the placement (requests, cluster spec, plan)
`rlshell.runners.placement_requests`, the run-only checks
`rlshell.runners.run_checks`; this module re-exports their public names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlcore.registry import ADVANTAGES, POLICY_LOSSES, Registry
from rlshell.cluster.placement import PlacementPlan
from rlshell.config import (
    Config,
    field_problems,
    read_config,
)
from rlshell.engines.plugins import options_problems
from rlshell.engines.rollout import ROLLOUT_ENGINES
from rlshell.engines.training import TRAINING_BACKENDS
from rlshell.runners.placement_requests import (
    cluster_spec_and_problems,
    cluster_spec_for,
    placement_requests,
    plan_and_problems,
    plan_for,
    required_components,
)
from rlshell.runners.run_checks import run_only_problems
from rlshell.runners.spec import RunSpec, resolve_spec
from rlshell.runners.unread_check import (
    set_unread_problems,
    unread_keys,
    unread_leaves,
    unread_problems,
)

__all__ = [
    "cluster_spec_for",
    "load_config",
    "placement_requests",
    "plan_for",
    "required_components",
    "unread_keys",
    "unread_leaves",
    "unread_problems",
    "validate",
]


# Estimators whose baseline is the other samples of the same prompt.
GROUP_ESTIMATORS = {"grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"}


def load_config(
    source: str | Path, overrides: Sequence[str] = (), *, for_run: bool = False
) -> Config:
    """Read, override, structure and validate a config; raise `ConfigError` listing every problem.

    ``for_run=True`` (what the CLI passes for a real run) adds the checks that
    only matter when the run really starts: files and checkpoints on disk,
    GPUs on this machine, the runner being installed. ``--dry-run`` and
    tools that only read a config leave it False.
    """
    return read_config(source, overrides, check=lambda config: validate(config, for_run=for_run))


def validate(config: Config, *, for_run: bool = True) -> list[str]:
    """Every problem with ``config``; empty when it is valid."""
    spec = resolve_spec(config)
    requests, request_problems = placement_requests(config)
    cluster, cluster_spec_problems = cluster_spec_and_problems(config)
    plan: PlacementPlan | None = None
    plan_problems: list[str] = []
    if not request_problems and cluster is not None:
        plan, plan_problems = plan_and_problems(cluster, requests)
    unread = unread_leaves(spec, plan)  # every key the run does not read, once
    problems = list(field_problems(config))
    problems += _registry_problems(spec, unread)
    problems += _algorithm_problems(config)
    problems += _task_problems(config)
    problems += _rollout_problems(config)
    problems += _cluster_problems(config)
    problems += request_problems + cluster_spec_problems + plan_problems
    problems += set_unread_problems(config, unread)
    if spec.rules is not None:
        problems += spec.rules.problems(spec, plan)
    problems += _engine_problems(config, plan, unread)
    if for_run:
        problems += run_only_problems(config)
    return problems


def _engine_problems(
    config: Config, plan: PlacementPlan | None, unread: Mapping[str, str]
) -> list[str]:
    """What the named rollout engine and training backend refuse (their entries' rules), for
    a run that reads the key naming them (``unread``: `unread_leaves`); the rollout engine's
    options checked against its record."""
    problems = []
    if "rollout.backend" not in unread and config.rollout.backend in ROLLOUT_ENGINES:
        engine = ROLLOUT_ENGINES.get(config.rollout.backend)
        problems += engine.problems(config, plan)
        if "rollout.engine_options" not in unread:
            problems += options_problems(
                engine.options,
                config.rollout.engine_options,
                "rollout.engine_options",
                config.rollout.backend,
            )
    if "actor.backend" not in unread and config.actor.backend in TRAINING_BACKENDS:
        problems += TRAINING_BACKENDS.get(config.actor.backend).problems(config, plan)
    return problems


def _registry_problems(spec: RunSpec, unread: Mapping[str, str]) -> list[str]:
    from rlshell.envs import ENVS
    from rlshell.models import MODELS
    from rlshell.rewards import REWARDS

    config = spec.config
    registries: dict[str, tuple[str | None, Registry[Any]]] = {
        "actor.model.model_type": (config.actor.model.model_type, MODELS),
        "algorithm.adv_type": (config.algorithm.adv_type, ADVANTAGES),
        "algorithm.loss_type": (config.algorithm.loss_type, POLICY_LOSSES),
        "reward.reward_type": (config.reward.reward_type, REWARDS),
        "env.env_type": (config.env.env_type, ENVS),
    }
    runner = config.runner.runner_type
    named = () if spec.rules is None else spec.rules.registered_names
    problems = []
    for selector, engine, engines in (
        ("rollout.backend", config.rollout.backend, ROLLOUT_ENGINES),
        ("actor.backend", config.actor.backend, TRAINING_BACKENDS),
    ):
        if selector not in unread and engine not in engines:
            problems.append(f"{selector}: {engines.unknown_message(engine)}")
    for key in named:
        name, registry = registries[key]
        if name is None:
            problems.append(f"{key}: required for a {runner} run; registered: {registry.names()}")
        elif name not in registry:
            problems.append(f"{key}: {registry.unknown_message(name)}")
    if "reward.reward_type" in named:
        from rlshell.rewards.weighted import weights_problems

        problems += weights_problems(config.reward, config.algorithm.group_size)
    model = config.actor.model
    if model.model_type in MODELS:
        registered = MODELS.get(model.model_type).category
        # An sft run trains either kind (actor.model.category says which trainer runs it).
        wanted = model.category if runner == "sft" else runner
        if runner in ("reasoning", "sft", "embodied") and registered != wanted:
            problems.append(
                f"actor.model.model_type: '{model.model_type}' is a {registered} model; "
                f"a {runner} run needs a {wanted} model"
            )
        elif model.category != registered:
            problems.append(
                f"actor.model.category: '{model.model_type}' is registered as {registered}, "
                f"got '{model.category}'"
            )
    return problems


def _algorithm_problems(config: Config) -> list[str]:
    algorithm = config.algorithm
    problems = []
    if algorithm.adv_type in GROUP_ESTIMATORS and algorithm.group_size < 2:
        problems.append(
            f"algorithm.group_size: {algorithm.adv_type} compares the samples of one prompt, "
            f"so it needs at least 2 per prompt, got {algorithm.group_size}"
        )
    low, high = algorithm.clip_low, algorithm.clip_high
    if low is not None and low >= 1:
        problems.append(f"algorithm.clip_low: expected a number in (0, 1), got {low}")
    # An unset clip_low takes the loss's default (0.2 for the PPO family).
    effective_low = low if low is not None else 0.2
    if high is not None and algorithm.loss_type == "ppo" and high < effective_low:
        problems.append(f"algorithm.clip_high: expected ≥ clip_low ({effective_low}), got {high}")
    elif high is not None and low is not None and high < low:
        problems.append(f"algorithm.clip_high: expected ≥ clip_low ({low}), got {high}")
    if algorithm.dual_clip is not None and algorithm.dual_clip <= 1:
        problems.append(f"algorithm.dual_clip: expected a number > 1, got {algorithm.dual_clip}")
    if algorithm.rollout_is is not None and algorithm.rollout_is_threshold <= 1:
        problems.append(
            "algorithm.rollout_is_threshold: the cap C of the importance weights (kept in "
            f"[1/C, C]) must be > 1, got {algorithm.rollout_is_threshold}"
        )
    mode = algorithm.rollout_is
    if algorithm.old_logprobs == "rollout" and mode is not None and mode.endswith("_truncate"):
        problems.append(
            f"algorithm.rollout_is: '{mode}' re-weights by π_actor/π_rollout, which the ratio "
            "against old_logprobs='rollout' already holds (it would count twice); truncate with "
            "old_logprobs='recompute', or mask with a *_mask mode"
        )
    return problems


def _rollout_problems(config: Config) -> list[str]:
    rollout = config.rollout
    problems = []
    tp = rollout.tensor_parallel_size
    if rollout.backend in ROLLOUT_ENGINES:
        most = ROLLOUT_ENGINES.get(rollout.backend).max_tensor_parallel_size
        if most is not None and tp > most:
            able = [
                name
                for name in ROLLOUT_ENGINES.names()
                if (ROLLOUT_ENGINES.get(name).max_tensor_parallel_size or tp) >= tp
            ]
            problems.append(
                f"rollout.tensor_parallel_size: the {rollout.backend} backend runs "
                f"{'one device' if most == 1 else f'at most {most} devices'} per process; "
                f"tensor_parallel_size {tp} needs backend "
                f"{' or '.join(able) or 'of an engine that runs tensor parallel'}"
            )
    if config.runner.runner_type == "reasoning" and config.actor.model.path is None:
        problems += _model_fit_problems(config)  # a model from kwargs: its config costs nothing
    return problems


def _model_fit_problems(config: Config) -> list[str]:
    """A reasoning model's length against the rollout's new tokens (the engine's own fit,
    such as vLLM's head sizes on CPUs, is the engine entry's rule)."""
    from rlshell.models import MODELS

    model = config.actor.model
    if model.model_type != "hf_causal_lm" or model.model_type not in MODELS:
        return []
    from rlshell.models.hf_causal_lm import hf_model_config

    try:
        hf_config = hf_model_config(model)
    except (OSError, ValueError, TypeError) as error:
        message = str(error)
        return [message if message.startswith("actor.") else f"actor.model: {message}"]
    problems = []
    length = getattr(hf_config, "max_position_embeddings", None)
    max_new = config.rollout.max_new_tokens
    if isinstance(length, int) and max_new >= length:
        problems.append(
            f"rollout.max_new_tokens: {max_new} new tokens do not fit the model's "
            f"{length} positions (max_position_embeddings) with any prompt"
        )
    return problems


def _cluster_problems(config: Config) -> list[str]:
    cluster = config.cluster
    if cluster.address is not None and cluster.num_cpus is not None:
        return [
            f"cluster.num_cpus: sizes an embedded Ray; the cluster at '{cluster.address}' was "
            "sized by `ray start --num-cpus`"
        ]
    if cluster.address is None and cluster.simulate is None and cluster.num_nodes > 1:
        return [
            f"cluster.num_nodes: an embedded Ray has 1 node, got {cluster.num_nodes}; attach to "
            "a cluster started with `ray start` (cluster.address=auto) or plan with "
            "cluster.simulate"
        ]
    return []


def _task_problems(config: Config) -> list[str]:
    """``data.task='conversations'`` (demonstrations) outside the sft runner. (The sft
    runner refuses the other tasks: `rlshell.runners.sft.SFTTrainer.problems`.)"""
    task = config.data.task
    if task in ("conversations", "demonstrations") and config.runner.runner_type == "reasoning":
        return [
            f"data.task: '{task}' are demonstrations for runner.runner_type='sft'; the "
            "reasoning runner samples responses to prompts ('arithmetic', or 'file' with "
            "prompt and answer columns)"
        ]
    return []
