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
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from rlcore.registry import ADVANTAGES, POLICY_LOSSES, Registry
from rlshell.checkpoint import (
    CheckpointError,
    list_checkpoints,
    queue_problem,
    read_trainer_state,
    verify_checkpoint,
)
from rlshell.cluster.placement import ClusterSpec, ComponentRequest, PlacementError, PlacementPlan
from rlshell.config import (
    COMPONENTS,
    Config,
    PlacementEntry,
    all_key_paths,
    field_problems,
    read_config,
)
from rlshell.engines.plugins import Package, missing_packages, options_problems
from rlshell.engines.rollout import ENGINE_KEYS, ROLLOUT_ENGINES
from rlshell.engines.training import BACKEND_KEYS, TRAINING_BACKENDS
from rlshell.rundir import run_dir_of
from rlshell.runners.spec import RunSpec, resolve_spec

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
    problems = list(field_problems(config))
    problems += _registry_problems(spec)
    problems += _algorithm_problems(config)
    problems += _task_problems(config)
    problems += _rollout_problems(config)
    problems += _cluster_problems(config)
    requests, request_problems = placement_requests(config)
    problems += request_problems
    cluster, cluster_spec_problems = _cluster_spec(config)
    problems += cluster_spec_problems
    plan: PlacementPlan | None = None
    if not request_problems and cluster is not None:
        plan, plan_problems = _plan(cluster, requests)
        problems += plan_problems
    problems += unread_problems(spec, plan)
    if spec.rules is not None:
        problems += spec.rules.problems(config, plan)
    problems += _engine_problems(spec, plan)
    if for_run:
        problems += _run_only_problems(config)
    return problems


def unread_problems(spec: RunSpec, plan: PlacementPlan | None = None) -> list[str]:
    """A line for each key set (to other than its default) where the run does not read it.

    ``plan`` (when known) adds the keys the placement leaves unread.
    """
    config = spec.config
    unread = unread_leaves(spec, plan)
    return [
        f"{leaf}: {unread[leaf]}" for leaf in _KEY_ORDER if leaf in unread and _is_set(config, leaf)
    ]


def unread_leaves(spec: RunSpec, plan: PlacementPlan | None = None) -> dict[str, str]:
    """Every key (leaf) the run does not read, set or not, with the reason: `unread_keys`
    and the trainer's `rlshell.runners.rules.TrainerRules.unread`, sections expanded (the
    trainer's reason wins for a key both name)."""
    declared = unread_keys(spec, plan)
    if spec.rules is not None:
        declared.update(spec.rules.unread(spec.config))
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
    if "wandb" not in config.logger.backends:
        unread["logger.wandb_project"] = (
            "names the project of the wandb backend, and logger.backends has no 'wandb'"
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
    if config.runner.runner_type == "embodied":
        unread["actor.model.checkpoint"] = (
            "starts a language model from an earlier run's checkpoint (the reasoning and sft "
            "runners); the embodied runners build actor.model as configured"
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


def _engine_problems(spec: RunSpec, plan: PlacementPlan | None) -> list[str]:
    """What the named rollout engine and training backend refuse (their entries' rules), for
    a run that reads the key naming them; the rollout engine's options checked against its
    record."""
    config = spec.config
    unread = unread_leaves(spec, plan)
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


def _registry_problems(spec: RunSpec) -> list[str]:
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
    unread = unread_leaves(spec)
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
        wanted = "reasoning" if runner == "sft" else runner  # both train language models
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


def required_components(config: Config) -> tuple[str, ...]:
    """The components a run of this config starts."""
    runner = config.runner.runner_type
    needed: list[str] = []
    if runner == "reasoning":
        needed = ["actor", "rollout", "reward"]
    elif runner == "sft":
        needed = ["actor"]
    elif runner == "embodied":
        needed = ["actor", "rollout", "env"]
    if runner == "reasoning" and config.algorithm.kl_coef > 0:
        needed.append("reference")  # only the reasoning runner has a KL term
    if runner == "reasoning" and config.algorithm.adv_type == "gae":
        needed.append("critic")  # the embodied policies carry their own value heads
    return tuple(needed)


def placement_requests(config: Config) -> tuple[list[ComponentRequest], list[str]]:
    """One planner request per placed component, and the problems in ``component_placement``."""
    key_root = "cluster.component_placement"
    entries: dict[str, tuple[str, PlacementEntry]] = {}
    problems = []
    for key, value in config.cluster.component_placement.items():
        entry = value if isinstance(value, PlacementEntry) else PlacementEntry(value)
        for raw_name in key.split(","):
            name = raw_name.strip()
            if name not in COMPONENTS:
                close = difflib.get_close_matches(name, COMPONENTS, n=1, cutoff=0.5)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                problems.append(
                    f"{key_root}.{key}: unknown component '{name}'{hint}; "
                    f"components: {', '.join(COMPONENTS)}"
                )
            elif name in entries:
                problems.append(
                    f"{key_root}.{key}: component '{name}' is already placed by "
                    f"'{entries[name][0]}'"
                )
            else:
                entries[name] = (key, entry)
    required = required_components(config)
    # The frozen reference and the critic default to the actor's devices, in processes of
    # their own.
    for beside in ("reference", "critic"):
        if beside in required and beside not in entries and "actor" in entries:
            entries[beside] = entries["actor"]
    if "critic" in entries and "critic" not in required:
        problems.append(
            f"{key_root}.{entries['critic'][0]}: places a critic, which only a reasoning run "
            "with algorithm.adv_type='gae' trains (embodied policies carry their own value "
            "heads)"
        )
    for name in required:
        if name not in entries:
            problems.append(
                f"{key_root}: a {config.runner.runner_type} run needs a placement for '{name}'"
            )
    if not entries:
        problems.append(f"{key_root}: place at least one component")
    requests = [_request(config, name, entries[name][1]) for name in COMPONENTS if name in entries]
    return requests, problems


def _request(config: Config, name: str, entry: PlacementEntry) -> ComponentRequest:
    sections: dict[str, Any] = {
        "actor": config.actor,
        "reference": config.actor,
        "critic": config.critic,
        "rollout": config.rollout,
        "reward": config.reward,
        "env": config.env,
    }
    own = config.actor.reference_cpus_per_worker if name == "reference" else None
    cpus = entry.cpus_per_worker or own or float(sections[name].cpus_per_worker)
    return ComponentRequest(
        name=name,
        placement=entry.placement,
        node_group=entry.node_group,
        cpus_per_worker=cpus,
        uses_gpus=name in ("actor", "reference", "critic", "rollout")
        or (name == "env" and config.env.uses_gpus),
        tensor_parallel_size=config.rollout.tensor_parallel_size if name == "rollout" else 1,
        shares_devices=_shares_devices(config, name),
    )


def _shares_devices(config: Config, name: str) -> bool:
    # Time-sharing GPUs with another component means moving out of the way between phases:
    # null (where the plan shares) and true allow it, false refuses it.
    if name == "actor":
        return config.actor.enable_offload is not False
    if name == "rollout":
        return config.rollout.enable_offload is not False
    return True


def cluster_spec_for(config: Config) -> ClusterSpec | None:
    """The cluster a plan is checked against before anything starts.

    The simulated cluster when ``cluster.simulate`` is set; this machine for
    an embedded Ray; None when attaching to a running cluster (its plan is
    checked once connected, before any worker starts).
    """
    from rlshell.cluster.placement import cluster_spec, local_cluster_spec, simulated_cluster

    groups = config.cluster.node_groups or None
    if config.cluster.simulate is not None:
        return simulated_cluster(config.cluster.simulate, groups)
    if config.cluster.address is not None:
        return None
    local = local_cluster_spec()
    nodes = list(local.nodes)
    if config.cluster.num_cpus is not None:
        nodes = [attrs.evolve(nodes[0], cpus=float(config.cluster.num_cpus))]
    return cluster_spec(nodes, groups)


def _cluster_spec(config: Config) -> tuple[ClusterSpec | None, list[str]]:
    """`cluster_spec_for`, or the problems of the strings that describe the cluster
    (``cluster.simulate``, ``cluster.node_groups``) that keep it from being made. An attached
    cluster's node groups are checked against its nodes once connected; here, their syntax."""
    from rlshell.cluster.placement import DEFAULT_NODE_GROUP, label_selector, parse_ranks

    try:
        spec = cluster_spec_for(config)
    except PlacementError as error:  # the node groups
        return None, [f"cluster.node_groups: {problem}" for problem in error.problems]
    except ValueError as error:  # a malformed simulate string
        return None, [f"cluster.simulate: {error}"]
    problems = []
    if spec is None:
        for label, ranks in config.cluster.node_groups.items():
            if ranks.strip() == DEFAULT_NODE_GROUP:
                continue
            try:
                if label_selector(ranks) is None:  # a Ray label is matched once connected
                    parse_ranks(ranks)
            except ValueError as error:
                problems.append(f"cluster.node_groups: node group '{label}': {error}")
    return spec, problems


def plan_for(config: Config, spec: ClusterSpec) -> PlacementPlan:
    """The placement plan of ``config`` on ``spec`` (raises `PlacementError`)."""
    from rlshell.cluster.placement import plan_placement

    requests, problems = placement_requests(config)
    if problems:
        raise PlacementError(problems)
    return plan_placement(spec, requests)


def _plan(
    cluster: ClusterSpec, requests: list[ComponentRequest]
) -> tuple[PlacementPlan | None, list[str]]:
    """The plan of ``requests`` on ``cluster``, or the problems that keep it from being made."""
    from rlshell.cluster.placement import plan_placement

    try:
        return plan_placement(cluster, requests), []
    except PlacementError as error:
        return None, [f"cluster.component_placement: {_in_config_terms(p)}" for p in error.problems]
    except ValueError as error:  # a malformed simulate or node-group string
        return None, [f"cluster: {error}"]


def _in_config_terms(problem: str) -> str:
    # The planner speaks of its request fields; a config user knows the offload switches.
    return re.sub(
        r"\b(actor|rollout) has shares_devices=False",
        r"\1.enable_offload is false (collocated components offload between phases)",
        problem,
    )


def _task_problems(config: Config) -> list[str]:
    """``data.task='conversations'`` (demonstrations) outside the sft runner. (The sft
    runner refuses the other tasks: `rlshell.runners.sft.SFTTrainer.problems`.)"""
    if config.data.task == "conversations" and config.runner.runner_type == "reasoning":
        return [
            "data.task: 'conversations' are demonstrations for runner.runner_type='sft'; the "
            "reasoning runner samples responses to prompts ('arithmetic', or 'file' with "
            "prompt and answer columns)"
        ]
    return []


def _data_problems(config: Config) -> list[str]:
    """Dataset files, folders or Hub datasets that are missing, cannot be had offline, or lack
    a column: found before anything starts."""
    from rlshell.conversation import read_conversations
    from rlshell.data import Split, read_split
    from rlshell.hub import hub_id

    data = config.data
    problems = []
    if data.task == "file" and data.train_path is None:
        problems.append("data.train_path: data.task is 'file' but no training file is given")
    splits: tuple[tuple[Split, str | None], ...] = (
        ("train", data.train_path),
        ("val", data.val_path),
    )
    for split, path in splits:
        key = f"data.{split}_path"
        if path is None:
            continue
        if hub_id(path, "dataset") is None and not Path(path).exists():
            problems.append(f"{key}: {path} does not exist")
        elif data.task in ("file", "conversations"):
            try:
                if data.task == "file":
                    read_split(key, path, split, data.prompt_key, data.answer_key)
                else:
                    read_conversations(path)
            except (OSError, ValueError) as error:
                message = str(error)
                problems.append(message if message.startswith(f"{key}: ") else f"{key}: {message}")
    return problems


def _model_problems(config: Config) -> list[str]:
    """Model and tokenizer directories or Hub ids that cannot be loaded (`rlshell.hub`)."""
    from rlshell.hub import hub_problem

    model = config.actor.model
    sources = (
        ("actor.model.path", model.path, "config.json"),
        ("actor.model.tokenizer_path", model.tokenizer_path, "tokenizer_config.json"),
    )
    found = (hub_problem(key, value, needs) for key, value, needs in sources if value is not None)
    problems = [problem for problem in found if problem is not None]
    if model.checkpoint is not None:
        problems += _initial_checkpoint_problems(config)
    return problems


def _initial_checkpoint_problems(config: Config) -> list[str]:
    """``actor.model.checkpoint``: a checkpoint directory with policy weights and, unless
    ``actor.model.tokenizer_path`` gives one, the tokenizer they were trained with."""
    from rlshell.checkpoint import CheckpointError, policy_layout

    model = config.actor.model
    checkpoint = Path(str(model.checkpoint))
    try:
        policy_layout(checkpoint)
    except CheckpointError as error:
        return [
            f"actor.model.checkpoint: {error} (expected <run dir>/checkpoints/global_step_N of "
            "an earlier run)"
        ]
    if model.tokenizer_path is None and not (checkpoint / "tokenizer").is_dir():
        return [
            f"actor.model.checkpoint: {checkpoint} holds no tokenizer/ (a reasoning or sft "
            "run's checkpoints hold the tokenizer it trained with); set "
            "actor.model.tokenizer_path to the tokenizer its model was trained with"
        ]
    return []


def _run_only_problems(config: Config) -> list[str]:
    problems = _data_problems(config)
    problems += _package_problems(config)
    engine = config.rollout.backend
    if "rollout.backend" in _named_engine_keys(config) and engine in ROLLOUT_ENGINES:
        problems += ROLLOUT_ENGINES.get(engine).run_problems(config, None)
    if config.cluster.simulate is not None:
        problems.append(
            f"cluster.simulate: '{config.cluster.simulate}' is a simulated cluster; "
            "it can only be planned (--dry-run), not run"
        )
    problems += _model_problems(config)
    resume = config.checkpoint.resume
    if resume not in (None, "auto") and not Path(resume).is_dir():
        problems.append(f"checkpoint.resume: no checkpoint directory at {resume}")
    elif resume is not None:
        # An async run's checkpoint resumed synchronously would skip its queued rollouts.
        problem = (
            _auto_resume_queue_problem(run_dir_of(config), config.runner.mode)
            if resume == "auto"
            else queue_problem(Path(resume), config.runner.mode)
        )
        if problem:
            problems.append(problem)
    return problems


def _auto_resume_queue_problem(run_dir: Path, mode: str) -> str | None:
    """`queue_problem` of the checkpoint ``checkpoint.resume=auto`` will take, as far as it
    can be known without reading every checkpoint twice.

    Newest first, a checkpoint that fails the quick check (its manifest, its files' sizes, its
    trainer state) is skipped, as resume=auto skips it. The first that passes decides: without
    a queue there is nothing to refuse (were it damaged all the same, the run resumes an
    older one and checks that one before its workers start); with one, it is verified in full
    (SHA-256) first, so that a damaged checkpoint the run would skip is never the reason a
    run is refused.
    """
    for _, path in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(path, digests=False)
            read_trainer_state(path)
        except CheckpointError:
            continue
        problem = queue_problem(path, mode)
        if problem is None:
            return None
        try:
            verify_checkpoint(path)
        except CheckpointError:
            continue
        return problem
    return None


# What a config value needs installed, besides the engines' own `Package` records:
# (key, the value that needs it, the package).
_MANISKILL = "`pip install -e '.[maniskill]'`"
_WANDB = "run `make install` (or `pip install wandb`)"
_OPTIONAL_PACKAGES: tuple[tuple[str, str, Package], ...] = (
    ("logger.backends", "wandb", Package("wandb", "wandb", _WANDB)),
    ("env.env_type", "maniskill", Package("mani_skill", "mani-skill", _MANISKILL)),
    ("env.env_type", "maniskill", Package("sapien", "sapien", _MANISKILL)),
)


def _named_engine_keys(config: Config) -> tuple[str, ...]:
    """The keys naming an engine that this run builds: the reasoning runner's rollout
    engine, every trainer's training backend (the probe trains nothing)."""
    runner = config.runner.runner_type
    return ("rollout.backend",) * (runner == "reasoning") + ("actor.backend",) * (runner != "probe")


def _missing_packages(config: Config) -> list[tuple[str, str, Package]]:
    """(key, its value, a package) for each package a set key needs and this Python cannot
    import. The engines and envs are looked up only for an embedded Ray: the processes of a
    cluster one attaches to may have packages the driver lacks."""
    needs: list[tuple[str, str, Package]] = [
        (key, value, package)
        for key, value, package in _OPTIONAL_PACKAGES
        if key == "logger.backends" and value in config.logger.backends
    ]
    if config.cluster.address is None:
        for key in _named_engine_keys(config):
            name = config.rollout.backend if key == "rollout.backend" else config.actor.backend
            registry: Registry[Any] = (
                ROLLOUT_ENGINES if key == "rollout.backend" else TRAINING_BACKENDS
            )
            if name in registry:
                needs += [(key, name, package) for package in registry.get(name).packages]
        if config.runner.runner_type == "embodied":
            env = config.env.env_type or ""
            needs += [
                (key, env, package)
                for key, value, package in _OPTIONAL_PACKAGES
                if key == "env.env_type" and value == env
            ]
    missing = set(missing_packages(tuple(package for _, _, package in needs)))
    return [(key, value, package) for key, value, package in needs if package in missing]


def _package_problems(config: Config) -> list[str]:
    """A line for each key whose value needs packages this Python cannot import."""
    missing: dict[tuple[str, str], list[Package]] = {}
    for key, value, package in _missing_packages(config):
        missing.setdefault((key, value), []).append(package)
    problems = []
    for (key, value), packages in missing.items():
        names = [package.distribution for package in packages]
        which = (
            f"the {names[0]} package, which is"
            if len(names) == 1
            else f"the {' and '.join(names)} packages, which are"
        )
        remedy = ", or remove 'wandb' from logger.backends" if key == "logger.backends" else ""
        problems.append(
            f"{key}: '{value}' needs {which} not installed: {packages[-1].install}{remedy}"
        )
    return problems
