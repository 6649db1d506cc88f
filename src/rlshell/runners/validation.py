"""Checks on a structured config: each field's constraint, names in registries, and the plan.

`validate` returns every problem as a line that starts with the key path it
concerns. Three kinds:

- field constraints declared in `rlshell.config` (``lr`` positive, ...);
- cross-field rules: registered names (with did-you-mean), a group size a
  group baseline can use, a rollout TP that fits its backend, a placement
  that names known components and fits the cluster (`rlshell.cluster.placement`);
- run-only checks (``for_run=True``): files and checkpoints that must exist,
  GPUs that a backend needs, no simulated cluster. ``--dry-run`` skips them.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from rlcore.registry import ADVANTAGES, POLICY_LOSSES, Registry
from rlshell.cluster.placement import ClusterSpec, ComponentRequest, PlacementError, PlacementPlan
from rlshell.config import CHECK_KEY, COMPONENTS, Config, PlacementEntry, read_config
from rlshell.runners import available_runners

__all__ = [
    "cluster_spec_for",
    "field_problems",
    "load_config",
    "placement_requests",
    "plan_for",
    "required_components",
    "validate",
]

# Estimators whose baseline is the other samples of the same prompt.
GROUP_ESTIMATORS = {"grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"}
# What the reasoning runner cannot feed: value estimates, teacher or proximal log-probs.
REASONING_UNSUPPORTED = {
    "algorithm.adv_type": {"gae": "a value model", "opd": "teacher log-probs"},
    "algorithm.loss_type": {"decoupled_ppo": "proximal log-probs"},
}
GPU_ROLLOUT_BACKENDS = {"vllm", "sglang"}


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
    problems = list(field_problems(config))
    problems += _registry_problems(config)
    problems += _algorithm_problems(config)
    problems += _embodied_algorithm_problems(config)
    problems += _rollout_problems(config)
    problems += _compile_problems(config)
    problems += _cluster_problems(config)
    requests, request_problems = placement_requests(config)
    problems += request_problems
    if not request_problems:
        spec = cluster_spec_for(config)
        if spec is not None:
            problems += _plan_problems(spec, requests)
    if for_run:
        problems += _run_only_problems(config)
    return problems


def field_problems(value: Any, path: str = "") -> Iterator[str]:
    """Walk the config; yield '{key}: expected ..., got ...' for each violated field constraint."""
    if attrs.has(type(value)):
        for item in attrs.fields(type(value)):
            child = getattr(value, item.name)
            key = f"{path}.{item.name}" if path else item.name
            check = item.metadata.get(CHECK_KEY)
            if check is not None:
                predicate, expected = check
                if not _holds(predicate, child):
                    yield f"{key}: expected {expected}, got {child!r}"
            yield from field_problems(child, key)
    elif isinstance(value, dict):
        for name, child in value.items():
            yield from field_problems(child, f"{path}.{name}")


def _holds(predicate: Any, value: Any) -> bool:
    try:
        return bool(predicate(value))
    except TypeError:
        return False


def _registry_problems(config: Config) -> list[str]:
    from rlshell.envs import ENVS
    from rlshell.models import MODELS
    from rlshell.rewards import REWARDS

    problems = []
    runner = config.runner.runner_type
    checks: list[tuple[str, str | None, Registry[Any]]] = [
        ("actor.model.model_type", config.actor.model.model_type, MODELS)
    ]
    if not _is_sac(config):  # SAC has its own losses and no advantages
        checks.append(("algorithm.adv_type", config.algorithm.adv_type, ADVANTAGES))
        checks.append(("algorithm.loss_type", config.algorithm.loss_type, POLICY_LOSSES))
    if runner == "reasoning":
        checks.append(("reward.reward_type", config.reward.reward_type, REWARDS))
    if runner == "embodied" or config.env.env_type is not None:
        checks.append(("env.env_type", config.env.env_type, ENVS))
    for key, name, registry in checks:
        if name is None:
            problems.append(f"{key}: required for a {runner} run; registered: {registry.names()}")
        elif name not in registry:
            problems.append(f"{key}: {registry.unknown_message(name)}")
    model = config.actor.model
    if model.model_type in MODELS:
        registered = MODELS.get(model.model_type).category
        if runner in ("reasoning", "embodied") and registered != runner:
            problems.append(
                f"actor.model.model_type: '{model.model_type}' is a {registered} model; "
                f"a {runner} run needs a {runner} model"
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
    if config.runner.runner_type == "reasoning":
        for key in ("update_epochs", "num_minibatches"):
            if getattr(algorithm, key) != 1:
                problems.append(
                    f"algorithm.{key}: the reasoning runner makes one optimizer step per batch; "
                    f"{getattr(algorithm, key)} needs the embodied runner's PPO update"
                )
        if algorithm.value_clip is not None:
            problems.append("algorithm.value_clip: the reasoning runner has no critic to clip")
        for key, unsupported in REASONING_UNSUPPORTED.items():
            name = algorithm.adv_type if key.endswith("adv_type") else algorithm.loss_type
            if name in unsupported:
                problems.append(
                    f"{key}: '{name}' needs {unsupported[name]}, which the reasoning runner "
                    "does not compute"
                )
    if algorithm.dual_clip is not None and algorithm.dual_clip <= 1:
        problems.append(f"algorithm.dual_clip: expected a number > 1, got {algorithm.dual_clip}")
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


def _rollout_problems(config: Config) -> list[str]:
    rollout = config.rollout
    problems = []
    if rollout.tensor_parallel_size > 1 and rollout.backend == "hf":
        problems.append(
            f"rollout.tensor_parallel_size: the hf backend runs one device per process; "
            f"tensor_parallel_size {rollout.tensor_parallel_size} needs backend vllm or sglang"
        )
    if rollout.weight_sync == "shared":
        problems += _shared_weight_problems(config)
    if rollout.pipeline_stage_num > 1:
        problems += _pipeline_problems(config)
    return problems


def _compile_problems(config: Config) -> list[str]:
    """``actor.compile`` / ``rollout.compile``: read by the collocated embodied PPO runner."""
    flags = {"actor.compile": config.actor.compile, "rollout.compile": config.rollout.compile}
    keys = [key for key, on in flags.items() if on]
    if not keys:
        return []
    if config.runner.runner_type != "embodied" or _is_sac(config):
        what = "SAC" if _is_sac(config) else f"the {config.runner.runner_type} runner"
        reason = f"{what} does not read it"
    else:
        names = {name: key for key in config.cluster.component_placement for name in _names(key)}
        if len({names.get(name) for name in ("actor", "rollout", "env")}) == 1:
            return []
        reason = (
            "only the collocated placement (env, rollout and actor in the same processes, "
            f"e.g. {_COLLOCATED_EXAMPLE}) reads it; the hybrid placement runs eager"
        )
    return [
        f"{key}: compiles embodied PPO's {'update' if key == 'actor.compile' else 'rollout'} "
        f"step; {reason}. Set {key}=false"
        for key in keys
    ]


def _pipeline_problems(config: Config) -> list[str]:
    """``rollout.pipeline_stage_num`` > 1: only embodied PPO's hybrid placement pipelines."""
    stages = config.rollout.pipeline_stage_num
    if config.runner.runner_type != "embodied" or _is_sac(config):
        what = "SAC" if _is_sac(config) else f"the {config.runner.runner_type} runner"
        return [
            f"rollout.pipeline_stage_num: {stages} stages pipeline embodied PPO's env and "
            f"rollout workers; {what} does not use it (leave it at 1)"
        ]
    keys = {name: key for key in config.cluster.component_placement for name in _names(key)}
    if "actor" in keys and keys.get("rollout") == keys.get("env") == keys["actor"]:
        return [
            f"rollout.pipeline_stage_num: {stages} stages pipeline env workers and rollout "
            f"workers of their own, but '{keys['actor']}' places env, rollout and actor in "
            f"the same processes; use 1 there, or the hybrid placement, e.g. {_HYBRID_EXAMPLE}"
        ]
    return []


def _shared_weight_problems(config: Config) -> list[str]:
    """``weight_sync='shared'``: the hf engine must live in the actor's processes, in its dtype."""
    rollout, actor_dtype = config.rollout, config.actor.fsdp_config.mixed_precision
    engine_dtype = rollout.precision or config.actor.model.precision
    problems = []
    if rollout.backend != "hf":
        problems.append(
            f"rollout.weight_sync: 'shared' generates with the actor's own module, which only "
            f"the hf backend can do; the {rollout.backend} engine needs 'bucket' or 'patch'"
        )
    keys = [key for key in config.cluster.component_placement if "rollout" in _names(key)]
    if keys and "actor" not in _names(keys[0]):
        problems.append(
            f"rollout.weight_sync: 'shared' needs the rollout in the actor's processes "
            f"(one placement key such as 'actor,rollout'), but the rollout is placed by "
            f"'{keys[0]}'; use 'bucket' or 'patch' for a rollout of its own"
        )
    if engine_dtype != actor_dtype:
        problems.append(
            f"rollout.precision: 'shared' generates with the actor's gathered parameters, "
            f"which are {actor_dtype} (actor.fsdp_config.mixed_precision), not {engine_dtype} "
            "(rollout.precision, else actor.model.precision); make them agree or use "
            "'bucket'/'patch' to cast on sync"
        )
    return problems


def _is_sac(config: Config) -> bool:
    return config.runner.runner_type == "embodied" and config.algorithm.loss_type == "sac"


EMBODIED_ESTIMATORS = {"gae", "grpo", "dr_grpo", "rloo"}


def _embodied_algorithm_problems(config: Config) -> list[str]:
    """PPO's GAE or a group estimator over episode returns (embodied GRPO); SAC has its own."""
    algorithm = config.algorithm
    if config.runner.runner_type != "embodied" or _is_sac(config):
        return []
    problems = []
    if algorithm.adv_type not in EMBODIED_ESTIMATORS:
        grouped = ", ".join(sorted(EMBODIED_ESTIMATORS - {"gae"}))
        problems.append(
            f"algorithm.adv_type: the embodied runner takes 'gae' (PPO with a critic) or a "
            f"group estimator over episode returns ({grouped}), got '{algorithm.adv_type}'"
        )
    elif algorithm.adv_type != "gae" and config.env.num_envs % algorithm.group_size:
        problems.append(
            f"env.num_envs: {config.env.num_envs} envs do not form groups of "
            f"algorithm.group_size={algorithm.group_size}"
        )
    return problems


def _sac_problems(config: Config) -> list[str]:
    """SAC: collectors (rollout and env under one key) apart from the one-process learner."""
    keys = {name: key for key in config.cluster.component_placement for name in _names(key)}
    problems = []
    if keys.get("rollout") != keys.get("env"):
        problems.append(
            "cluster.component_placement: SAC's env workers step the policy themselves; "
            "place 'rollout' and 'env' under one key, e.g. "
            '{"actor": "0", "rollout,env": "0"}'
        )
    if "actor" in keys and keys.get("actor") == keys.get("env"):
        problems.append(
            "cluster.component_placement: SAC runs its learner ('actor') in a process of its "
            "own beside the env workers, so that stepping and training overlap; give it a key "
            'of its own, e.g. {"actor": "0", "rollout,env": "0"}'
        )
    sac = config.algorithm.sac
    if sac.learning_starts < sac.batch_size:
        problems.append(
            f"algorithm.sac.learning_starts: the first update samples batch_size="
            f"{sac.batch_size} transitions, so at least that many must be collected first, "
            f"got {sac.learning_starts}"
        )
    if sac.replay_size < sac.batch_size:
        problems.append(
            f"algorithm.sac.replay_size: {sac.replay_size} is smaller than batch_size "
            f"{sac.batch_size}"
        )
    return problems


_COLLOCATED_EXAMPLE = '{"actor,rollout,env": "0:0-1"}'
_HYBRID_EXAMPLE = '{"actor": "0:0-1", "rollout": "0:0", "env": "0:0"}'


def _embodied_placement_problems(config: Config) -> list[str]:
    """PPO's embodied runner: env, rollout and actor under one key (collocated: each rank
    steps its envs with its own policy copy) or under three keys (hybrid: env and rollout
    workers of their own, pipelined); no other grouping."""
    if _is_sac(config):
        return _sac_problems(config)
    keys = {name: key for key in config.cluster.component_placement for name in _names(key)}
    trio = ("actor", "rollout", "env")
    if any(name not in keys for name in trio):
        return []  # reported as a missing placement
    groups = {keys[name] for name in trio}
    if len(groups) != 2:
        return []
    grouped = next(key for key in groups if sum(name in _names(key) for name in trio) == 2)
    alone = next(name for name in trio if name not in _names(grouped))
    return [
        f"cluster.component_placement: the embodied PPO runner places env, rollout and actor "
        f"either all under one key (collocated, e.g. {_COLLOCATED_EXAMPLE}) or each under "
        f"its own (hybrid, pipelined, e.g. {_HYBRID_EXAMPLE}); '{grouped}' groups two of "
        f"them apart from '{alone}'"
    ]


def _names(placement_key: str) -> list[str]:
    return [name.strip() for name in placement_key.split(",")]


def required_components(config: Config) -> tuple[str, ...]:
    """The components a run of this config starts."""
    runner = config.runner.runner_type
    needed: list[str] = []
    if runner == "reasoning":
        needed = ["actor", "rollout", "reward"]
    elif runner == "embodied":
        needed = ["actor", "rollout", "env"]
    if config.algorithm.kl_coef > 0 and runner != "probe":
        needed.append("reference")
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
    if "reference" in required and "reference" not in entries and "actor" in entries:
        entries["reference"] = entries["actor"]  # the frozen reference shares the actor's devices
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
        uses_gpus=name in ("actor", "reference", "rollout")
        or (name == "env" and config.env.uses_gpus),
        tensor_parallel_size=config.rollout.tensor_parallel_size if name == "rollout" else 1,
        shares_devices=_shares_devices(config, name),
    )


def _shares_devices(config: Config, name: str) -> bool:
    # Time-sharing GPUs with another component means moving out of the way between phases.
    if name == "actor":
        return config.actor.enable_offload
    if name == "rollout":
        return config.rollout.enable_offload
    return True


def cluster_spec_for(config: Config) -> ClusterSpec | None:
    """The cluster a plan is checked against before anything starts.

    The simulated cluster when ``cluster.simulate`` is set; this machine for
    an embedded Ray; None when attaching to a running cluster (its plan is
    checked once connected, before any worker starts).
    """
    from rlshell.cluster.placement import cluster_spec, simulated_cluster
    from rlshell.cluster.ray_cluster import local_cluster_spec

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


def plan_for(config: Config, spec: ClusterSpec) -> PlacementPlan:
    """The placement plan of ``config`` on ``spec`` (raises `PlacementError`)."""
    from rlshell.cluster.placement import plan_placement

    requests, problems = placement_requests(config)
    if problems:
        raise PlacementError(problems)
    return plan_placement(spec, requests)


def _plan_problems(spec: ClusterSpec, requests: list[ComponentRequest]) -> list[str]:
    from rlshell.cluster.placement import plan_placement

    try:
        plan_placement(spec, requests)
    except PlacementError as error:
        return [f"cluster.component_placement: {_in_config_terms(p)}" for p in error.problems]
    except ValueError as error:  # a malformed simulate or node-group string
        return [f"cluster: {error}"]
    return []


def _in_config_terms(problem: str) -> str:
    # The planner speaks of its request fields; a config user knows the offload switches.
    return re.sub(
        r"\b(actor|rollout) has shares_devices=False",
        r"\1.enable_offload is false (collocated components offload between phases)",
        problem,
    )


def _data_problems(config: Config) -> list[str]:
    """Dataset files that are missing or lack a column: found before anything starts."""
    data = config.data
    if config.runner.runner_type != "reasoning" or data.task != "file":
        return []
    from rlshell.data import read_examples

    if data.train_path is None:
        return ["data.train_path: data.task is 'file' but no training file is given"]
    problems = []
    for key, path in (("data.train_path", data.train_path), ("data.val_path", data.val_path)):
        if path is None or not Path(path).exists():
            continue  # a missing file is reported with the other paths
        try:
            read_examples(path, data.prompt_key, data.answer_key)
        except (OSError, ValueError) as error:
            problems.append(f"{key}: {error}")
    return problems


def _run_only_problems(config: Config) -> list[str]:
    problems = []
    runner_module = f"rlshell.runners.{config.runner.runner_type}"
    if importlib.util.find_spec(runner_module) is None:
        problems.append(
            f"runner.runner_type: the '{config.runner.runner_type}' runner ({runner_module}) "
            f"is not in this installation of rlshell; available: {', '.join(available_runners())}"
        )
    problems.extend(_data_problems(config))
    if config.runner.runner_type == "embodied":
        problems += _embodied_placement_problems(config)
    if config.runner.runner_type == "reasoning" and config.rollout.backend != "hf":
        problems.append(
            f"rollout.backend: the reasoning runner of this version samples with 'hf' only; "
            f"its '{config.rollout.backend}' engine is not implemented yet (it comes behind the "
            "same rollout interface): use rollout.backend=hf"
        )
    if config.cluster.simulate is not None:
        problems.append(
            f"cluster.simulate: '{config.cluster.simulate}' is a simulated cluster; "
            "it can only be planned (--dry-run), not run"
        )
    files = {
        "data.train_path": config.data.train_path,
        "data.val_path": config.data.val_path,
        "actor.model.path": config.actor.model.path,
        "actor.model.tokenizer_path": config.actor.model.tokenizer_path,
    }
    for key, value in files.items():
        if value is not None and not Path(value).exists():
            problems.append(f"{key}: {value} does not exist")
    resume = config.checkpoint.resume
    if resume not in (None, "auto") and not Path(resume).is_dir():
        problems.append(f"checkpoint.resume: no checkpoint directory at {resume}")
    if config.cluster.address is None and config.cluster.simulate is None:
        from rlshell.cluster.ray_cluster import local_cluster_spec

        gpus = sum(node.gpus for node in local_cluster_spec().nodes)
        needs = []
        if config.rollout.backend in GPU_ROLLOUT_BACKENDS:
            needs.append(f"rollout.backend: {config.rollout.backend} needs a GPU")
        if config.actor.backend == "megatron":
            needs.append("actor.backend: megatron needs a GPU")
        if gpus == 0:
            problems += [f"{need}, and this machine has none" for need in needs]
    return problems
