"""RLinf's Hydra YAML configs, read with Hydra and mapped key by key onto rlstack's `Config`.

RLinf configures a run with a Hydra YAML file (``examples/embodiment/config/*.yaml``,
``examples/reasoning/config/math/*.yaml``): a ``defaults:`` list composes files of
config groups into sections (``model/mlp_policy@actor.model``) and ``${...}``
interpolations refer to other keys. `read_rlinf_config` composes the file with
Hydra's compose API and resolves it with OmegaConf (RLinf's resolvers ``subtract``,
``multiply``, ``int_div`` and ``not`` included), then maps every key through `RULES`,
the one table of RLinf keys and what each is here:

- a key with an rlstack key (``runner.save_interval`` → ``checkpoint.interval``) is
  set there, its value converted where the two spell it differently (RLinf's ``-1``
  for "never" is rlstack's ``0``, its precision ``"32"`` is ``"fp32"``);
- a key with no rlstack key is accepted where its value asks for what rlstack does
  anyway (``actor.group_name``: rlstack names its worker groups itself;
  ``rollout.enable_cuda_graph``: a speed switch, the results do not depend on it) and
  refused otherwise, with the reason;
- a key the table does not know is refused.

Every refused key is reported at once, one line per key: the RLinf key, its value,
and rlstack's key or why there is none (`RLinfConfigError`). A model section's keys
the table does not name are the model builder's options and go to
``actor.model.model_kwargs``, where the builder checks them.

`rlinf_hint` answers an unknown rlstack key that is an RLinf key with its rlstack
name ("RLinf's `runner.save_interval` is `checkpoint.interval` here");
`rlshell.config.loading` adds it to the unknown-key message of Python configs and
overrides too.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attrs import frozen

__all__ = [
    "RULES",
    "YAML_SUFFIXES",
    "RLinfConfigError",
    "Refusal",
    "Rule",
    "map_rlinf",
    "markdown_table",
    "read_rlinf_config",
    "read_rlinf_yaml",
    "refusal_lines",
    "rlinf_hint",
    "rule_for",
]

YAML_SUFFIXES = (".yaml", ".yml")

# The RLinf config, flattened: 'runner.max_steps' -> its resolved value.
Context = Mapping[str, Any]
Convert = Callable[[Any, Context], Any]
Accepts = Callable[[Any, Context], bool]


class RLinfConfigError(ValueError):
    """An RLinf config that cannot be read or mapped: one line per problem in ``problems``."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class _Refused(Exception):
    """A value a rule cannot convert; the message says why."""


class _Omit:
    """A converted value that sets nothing (the RLinf value is rlstack's default behaviour)."""


OMIT = _Omit()


@frozen
class _Many:
    """A converted value that sets several rlstack keys."""

    values: dict[str, Any]


@frozen
class Rule:
    """What becomes of one RLinf key.

    ``target``: rlstack's key, set to ``convert(value, context)`` (the value as it is
    without ``convert``; `OMIT` sets nothing). Without a target the key has no rlstack
    key: ``accepts(value, context)`` says whether its value asks for nothing rlstack
    does not do anyway, and ``reason`` says why (shown when the value is refused).
    """

    target: str | None
    reason: str = ""
    convert: Convert | None = None
    accepts: Accepts | None = None

    def apply(self, value: Any, context: Context) -> Any:
        """The rlstack value (`OMIT`, or `_Many`), or `_Refused` with the reason."""
        if self.target is None:
            if self.accepts is not None and self.accepts(value, context):
                return OMIT
            raise _Refused(self.reason)
        return value if self.convert is None else self.convert(value, context)


@frozen
class Refusal:
    """An RLinf key that stops the run: its value, rlstack's key (if any) and why."""

    key: str
    value: Any
    target: str | None
    reason: str

    def line(self, key_width: int = 0, value_width: int = 0) -> str:
        answer = f"`{self.target}`: {self.reason}" if self.target else f"none: {self.reason}"
        return f"{self.key:<{key_width}}  {_shown(self.value):<{value_width}}  → {answer}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --- value conversions ---------------------------------------------------------------------------


def _model_precision(value: Any, context: Context) -> Any:
    return OMIT if value is None else _precision(value, context)


def _precision(value: Any, _: Context) -> str:
    names = {
        "32": "fp32",
        "fp32": "fp32",
        "float32": "fp32",
        "bf16": "bf16",
        "bfloat16": "bf16",
        "16": "fp16",
        "fp16": "fp16",
        "float16": "fp16",
    }
    precision = names.get(str(value).lower())
    if precision is None:
        raise _Refused(f"expected a precision ({', '.join(sorted(names))}), got {value!r}")
    return precision


def _interval(value: Any, _: Context) -> Any:
    """RLinf's -1 ("never") is rlstack's 0."""
    return 0 if isinstance(value, int) and not isinstance(value, bool) and value < 0 else value


def _path(value: Any, _: Context) -> Any:
    return OMIT if value in ("", None) else value


def _placement(value: Any, _: Context) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _choice(names: Mapping[Any, Any], what: str) -> Convert:
    def convert(value: Any, _: Context) -> Any:
        if value in names:
            return names[value]
        raise _Refused(f"{what}: rlstack takes {', '.join(repr(n) for n in names)}")

    return convert


def _rollout_backend(value: Any, _: Context) -> Any:
    return {"huggingface": "hf", "hf": "hf"}.get(value, value)


def _one_path(value: Any, _: Context) -> Any:
    if isinstance(value, list | tuple):
        if len(value) == 1:
            return value[0]
        raise _Refused("rlstack reads one file (or one folder or Hub dataset) per split")
    return value


def _task(value: Any, _: Context) -> Any:
    if value not in ("embodied", "reasoning"):
        raise _Refused("rlstack's runners here are 'embodied' and 'reasoning'")
    category = "embodied" if value == "embodied" else "reasoning"
    return _Many({"runner.runner_type": value, "actor.model.category": category})


def _task_type(context: Context) -> str:
    return str(context.get("runner.task_type", "reasoning"))


def _embodied(context: Context) -> bool:
    return _task_type(context) == "embodied"


def _max_steps(value: Any, context: Context) -> Any:
    if isinstance(value, int) and value > 0:
        return value
    epochs = context.get("runner.max_epochs")
    if _embodied(context) and isinstance(epochs, int) and epochs > 0:
        return epochs  # an embodied "epoch" is one rollout and its update: one step here
    raise _Refused(
        "rlstack counts optimizer steps and does not derive them from max_epochs and the "
        "dataset's size: set runner.max_steps"
    )


def _evaluates(context: Context) -> bool:
    interval = context.get("runner.val_check_interval", -1)
    return isinstance(interval, int) and interval > 0


def _log_path(value: Any, context: Context) -> Any:
    """RLinf's reasoning configs write ``log_path: <output_dir>/<experiment_name>``; the run
    directory is ``runner.output_dir / runner.experiment_name`` here."""
    if value is None:
        return OMIT
    name = context.get("runner.experiment_name") or context.get("runner.logger.experiment_name")
    if isinstance(value, str) and isinstance(name, str) and value.rstrip("/").endswith("/" + name):
        return value.rstrip("/")[: -len(name) - 1]
    return value


def _backends(value: Any, _: Context) -> Any:
    if not isinstance(value, list | tuple):
        raise _Refused(f"expected a list of backends, got {value!r}")
    return tuple(dict.fromkeys(["console", "jsonl", *value]))


def _project(value: Any, context: Context) -> Any:
    """RLinf's one project name, for each of its project-naming backends that is on."""
    backends = context.get("runner.logger.logger_backends") or ()
    named = {f"logger.{name}_project": value for name in ("wandb", "swanlab") if name in backends}
    return _Many(named)


def _kl_kind(value: Any, context: Context) -> Any:
    if not context.get("algorithm.kl_beta"):
        return OMIT  # no KL term: RLinf does not estimate it either
    kinds = {"kl": "k1", "abs": "abs", "mse": "k2", "low_var_kl": "k3"}
    return _choice(kinds, "RLinf's KL estimators")(value, context)


def _adv_type(value: Any, context: Context) -> Any:
    if value == "grpo" and context.get("algorithm.normalize_advantages") is False:
        return "dr_grpo"  # group-mean baseline without the std division
    return {"reinpp": "reinforce_pp"}.get(value, value)


def _normalize_advantages(value: Any, context: Context) -> Any:
    if _embodied(context):
        return value
    return OMIT  # reasoning: read by algorithm.adv_type (grpo, or dr_grpo when false)


def _loss_type(value: Any, _: Context) -> Any:
    return {"actor": "ppo", "actor_critic": "ppo"}.get(value, value)


def _clip(fallback: str) -> Convert:
    def convert(value: Any, context: Context) -> Any:
        if value is None:
            value = context.get(fallback)
        return OMIT if value is None else value

    return convert


def _optional(value: Any, _: Context) -> Any:
    return OMIT if value is None else value


def _bootstrap(value: Any, context: Context) -> Any:
    return _choice({"standard": "truncated", "always": "always"}, "RLinf's bootstrap types")(
        value, context
    )


def _old_logprobs(value: Any, _: Context) -> Any:
    return "recompute" if value else "rollout"


def _top_k(value: Any, _: Context) -> Any:
    return 0 if isinstance(value, int) and value < 0 else value


def _embodied_rollout_samples(context: Context) -> int | None:
    counts = [
        context.get("env.train.total_num_envs"),
        context.get("env.train.max_steps_per_rollout_epoch"),
        context.get("env.train.rollout_epoch", 1),
    ]
    if not all(isinstance(n, int) and n > 0 for n in counts):
        return None
    return int(math.prod(counts))


def _global_batch_size(value: Any, context: Context) -> Any:
    if not _embodied(context):
        return OMIT  # the optimizer step's share of the batch is algorithm.n_minibatches here
    samples = _embodied_rollout_samples(context)
    if samples is None or not isinstance(value, int) or value <= 0 or samples % value:
        raise _Refused(
            "rlstack splits each rollout into algorithm.num_minibatches equal minibatches; "
            f"the rollout's {samples} samples (total_num_envs × max_steps_per_rollout_epoch "
            f"× rollout_epoch) must be a multiple of it"
        )
    return samples // value


def _n_minibatches(value: Any, context: Context) -> Any:
    prompts = context.get("data.rollout_batch_size")
    if not isinstance(prompts, int) or not isinstance(value, int) or value <= 0 or prompts % value:
        raise _Refused(
            "actor.mini_batch_size is the prompts per optimizer step here: "
            f"data.rollout_batch_size ({prompts}) must be a multiple of n_minibatches"
        )
    return prompts // value


def _model_type(value: Any, context: Context) -> Any:
    if _embodied(context):
        return value
    # A reasoning model is a Transformers causal LM whose architecture its config names.
    return "hf_causal_lm"


def _tokenizer_path(value: Any, context: Context) -> Any:
    return OMIT if value in ("", None, context.get("actor.model.model_path")) else value


def _warmup_iters(value: Any, context: Context) -> Any:
    if not value and context.get("actor.lr_sched.lr_warmup_fraction"):
        return OMIT  # the fraction sets the warm-up
    return value


def _warmup_fraction(value: Any, context: Context) -> Any:
    if not value:
        return OMIT
    steps = _max_steps(context.get("runner.max_steps"), context)
    return round(float(value) * int(steps))


def _min_lr(value: Any, context: Context) -> Any:
    lr = context.get("actor.optim.lr")
    if not isinstance(lr, int | float) or lr <= 0:
        raise _Refused("min_lr_ratio is min_lr / actor.optim.lr, and actor.optim.lr is not set")
    return float(value) / float(lr)


def _value_lr(value: Any, context: Context) -> Any:
    if context.get("algorithm.adv_type") != "gae":
        return OMIT  # no critic, in RLinf as here
    if not _embodied(context):
        return value
    if value != context.get("actor.optim.lr"):
        raise _Refused(
            "an embodied policy's value head trains with its actor, one optimizer at "
            "actor.optim.lr: set value_lr equal to lr"
        )
    return OMIT


def _critic_warmup(value: Any, context: Context) -> Any:
    if not _embodied(context):
        return value
    if value:
        raise _Refused("an embodied policy's value head trains with its actor from the start")
    return OMIT


def _reward_scale(value: Any, context: Context) -> Any:
    if value == 1:
        return OMIT
    name = context.get("reward.reward_type", "math")
    return {str(name): float(value)}


def _bucket_mb(value: Any, context: Context) -> Any:
    return _synced(float(value) / 2**20, context)


def _synced(value: Any, context: Context) -> Any:
    # An embodied runner hands the policy's state to its rollout its own way; RLinf's
    # syncer choice there changes how the weights travel, not what arrives.
    return OMIT if _embodied(context) else value


def _critic_only(convert: Convert | None = None) -> Convert:
    """A critic's setting: without GAE there is no critic, in RLinf as here."""

    def wrapped(value: Any, context: Context) -> Any:
        if context.get("algorithm.adv_type") != "gae":
            return OMIT
        return value if convert is None else convert(value, context)

    return wrapped


def _group_size(value: Any, context: Context) -> Any:
    if value == 1 and context.get("algorithm.adv_type") == "gae":
        return OMIT  # no groups: GAE compares none
    return value


def _rollout_precision(value: Any, context: Context) -> Any:
    if value is None:
        return OMIT  # null: the actor model's precision, as here
    precision = _precision(value, context)
    actor = context.get("actor.model.precision")
    if precision == ("fp32" if actor is None else _precision(actor, context)):
        return OMIT  # null here: the actor model's precision
    return precision


def _uses_gpus(value: Any, context: Context) -> Any:
    return _choice({"gpu": True, "cuda": True, "cpu": False}, "ManiSkill's sim backends")(
        value, context
    )


def _control_mode(value: Any, _: Context) -> Any:
    return OMIT if value in (None, "None", "") else value


def _node_groups(value: Any, _: Context) -> Any:
    """RLinf's list of groups as rlstack's mapping: label → node ranks, or the long form
    (``node_ranks``, ``env_configs``, ``hardware``), which rlstack's schema checks."""
    groups: dict[str, Any] = {}
    for entry in value or ():
        if not isinstance(entry, Mapping) or "label" not in entry or "node_ranks" not in entry:
            raise _Refused(f"expected entries with a label and node_ranks, got {entry!r}")
        extra = set(entry) - {"label", "node_ranks", "env_configs", "hardware"}
        if extra:
            raise _Refused(f"{sorted(extra)} of a node group have no key here")
        ranks = _rank_text(entry["node_ranks"])
        rest: dict[str, Any] = {}
        if "env_configs" in entry:
            rest["env_configs"] = [_env_config(env) for env in entry["env_configs"] or ()]
        if "hardware" in entry:
            rest["hardware"] = entry["hardware"]
        groups[str(entry["label"])] = {"node_ranks": ranks, **rest} if rest else ranks
    return groups


def _rank_text(value: Any) -> str:
    """RLinf's node ranks (``"0-1"``, ``3`` or ``[0, 2]``) as rlstack's range text."""
    if isinstance(value, list | tuple):
        return ",".join(str(rank) for rank in value)
    return str(value)


def _env_config(entry: Any) -> Any:
    """One ``env_configs`` entry with RLinf's spellings made rlstack's: ``node_ranks`` as
    range text, ``env_vars`` given as a list of one-key mappings merged into one mapping
    (a name given twice refused). Anything else is left for rlstack's schema to check."""
    if not isinstance(entry, Mapping):
        return entry
    out = dict(entry)
    if out.get("node_ranks") is not None:
        out["node_ranks"] = _rank_text(out["node_ranks"])
    variables = out.get("env_vars")
    if isinstance(variables, list | tuple):
        merged: dict[str, Any] = {}
        for item in variables:
            if not isinstance(item, Mapping):
                raise _Refused(f"env_vars: expected NAME: value entries, got {item!r}")
            for name, value in item.items():
                if name in merged:
                    raise _Refused(f"env_vars: {name} is set twice")
                merged[str(name)] = value
        out["env_vars"] = merged
    return out


# --- what rlstack accepts without a key ----------------------------------------------------------


def _any(value: Any, _: Context) -> bool:
    return True


def _is(*accepted: Any) -> Accepts:
    def accepts(value: Any, _: Context) -> bool:
        return any(value == option and type(value) is type(option) for option in accepted)

    return accepts


def _equals_key(key: str, *also: Any) -> Accepts:
    def accepts(value: Any, context: Context) -> bool:
        return value in also or value == context.get(key)

    return accepts


def _unless_evaluating(value: Any, context: Context) -> bool:
    return not _evaluates(context)


def _video_off(value: Any, context: Context) -> bool:
    return not context.get("env.train.video_cfg.save_video")


def _no_inference_group(value: Any, context: Context) -> bool:
    return not any(
        "inference" in key.split(".")[-1].split(",")
        for key in context
        if key.startswith("cluster.component_placement.")
    )


def _critic_model(value: Any, context: Context) -> bool:
    if not value:
        return True
    return context.get("algorithm.adv_type") == "gae" and not _embodied(context)


def _lr_decay_iters(value: Any, context: Context) -> bool:
    if value is None or context.get("actor.lr_sched.lr_decay_style") == "constant":
        return True
    return bool(value == context.get("runner.max_steps"))


SPEED = (
    "a speed or memory setting with no rlstack key; rlstack's results do not depend on it, "
    "whatever its value"
)
NAMED = "rlstack names its worker groups itself"


def _to(target: str, convert: Convert | None = None, note: str = "") -> Rule:
    return Rule(target, note, convert)


def _none(reason: str, accepts: Accepts = _any) -> Rule:
    return Rule(None, reason, None, accepts)


def _sampling(prefix: str) -> dict[str, Rule]:
    return {
        f"{prefix}.do_sample": _none("rlstack's rollouts always sample", _is(True)),
        f"{prefix}.temperature": _to("rollout.temperature"),
        f"{prefix}.temperature_train": _to("rollout.temperature"),
        f"{prefix}.temperature_eval": _none(
            "rlstack evaluates with rollout.temperature",
            lambda v, c: not _evaluates(c) or v == c.get(f"{prefix}.temperature_train"),
        ),
        f"{prefix}.top_k": _to("rollout.top_k", _top_k, "-1 (off) is 0"),
        f"{prefix}.top_p": _to("rollout.top_p"),
        f"{prefix}.repetition_penalty": _none(
            "rlstack's rollouts apply no repetition penalty", _is(1.0, 1)
        ),
        f"{prefix}.max_new_tokens": _to("rollout.max_new_tokens"),
        f"{prefix}.min_new_tokens": _to("rollout.min_new_tokens"),
    }


def _env(prefix: str) -> dict[str, Rule]:
    p = prefix
    return {
        f"{p}.env_type": _to("env.env_type"),
        f"{p}.total_num_envs": _to("env.num_envs", _optional, "null: rlstack's default"),
        f"{p}.max_episode_steps": _to("env.max_episode_steps", _optional, "null: the task's"),
        f"{p}.max_steps_per_rollout_epoch": _to("runner.rollout_steps"),
        f"{p}.ignore_terminations": _to("env.ignore_terminations"),
        f"{p}.seed": _to("runner.seed", note="env copies are seeded from runner.seed"),
        f"{p}.rollout_epoch": _none(
            "rlstack collects one rollout window (runner.rollout_steps) per step", _is(1)
        ),
        f"{p}.auto_reset": _none("rlstack's env workers always reset ended episodes", _is(True)),
        f"{p}.group_size": _none(
            "the group is algorithm.group_size here", _equals_key("algorithm.group_size")
        ),
        f"{p}.wrap_obs_mode": _none(
            "rlstack hands the policy ManiSkill's state as 'states' (RLinf's 'simple')",
            _is("simple"),
        ),
        f"{p}.use_full_state": _none("rlstack reads the task's own observation", _is(False)),
        f"{p}.use_rel_reward": _none("rlstack trains on the env's own reward", _is(False)),
        f"{p}.reward_coef": _none("rlstack trains on the env's reward unscaled", _is(1, 1.0)),
        f"{p}.is_eval": _none("the training env", _is(False)),
        f"{p}.use_ordered_reset_state_ids": _none(
            "rlstack resets envs from seeds (runner.seed), not ordered state ids", _is(False)
        ),
        f"{p}.reward_mode": _none(
            "rlstack trains on the env's own reward (RLinf's 'raw')", _is("raw")
        ),
        f"{p}.use_fixed_reset_state_ids": _none(
            "rlstack resets envs from seeds (runner.seed), not fixed state ids", _is(False)
        ),
        f"{p}.enable_offload": _none("rlstack's env workers keep their envs loaded", _is(False)),
        f"{p}.video_cfg.save_video": _none("rlstack records no videos during training", _is(False)),
        f"{p}.video_cfg.info_on_video": _none("read only for videos", _video_off),
        f"{p}.video_cfg.video_base_dir": _none("read only for videos", _video_off),
        f"{p}.init_params.id": _to("env.env_id"),
        f"{p}.init_params.num_envs": _none(
            "the copies per worker follow from env.num_envs and the placement", _is(None)
        ),
        f"{p}.init_params.obs_mode": _to("env.obs_mode", _optional, "null: state"),
        f"{p}.init_params.control_mode": _to(
            "env.control_mode", _control_mode, "None: the task's default"
        ),
        f"{p}.init_params.sim_backend": _to("env.uses_gpus", _uses_gpus, "'gpu' is true"),
        f"{p}.init_params.max_episode_steps": _to(
            "env.max_episode_steps", _optional, "null: the task's"
        ),
        f"{p}.init_params.sim_config.sim_freq": _none(
            "rlstack builds ManiSkill envs at the task's own frequencies (100 Hz)", _is(100)
        ),
        f"{p}.init_params.sim_config.control_freq": _none(
            "rlstack builds ManiSkill envs at the task's own frequencies (20 Hz control)",
            _is(20),
        ),
        f"{p}.init_params.sensor_configs.shader_pack": _none(
            "rlstack renders with ManiSkill's default shaders", _is("default")
        ),
        f"{p}.init_params.render_mode": _none("read only for videos", _video_off),
    }


RULES: dict[str, Rule] = {
    # cluster
    "cluster.num_nodes": _to("cluster.num_nodes"),
    "cluster.node_groups": _to(
        "cluster.node_groups", _node_groups, "RLinf's list, by label (env_configs, hardware kept)"
    ),
    # runner
    "runner.task_type": _to("runner.runner_type", _task, "and actor.model.category"),
    "runner.logger.log_path": _to(
        "runner.output_dir", _log_path, "less a trailing /<experiment_name>"
    ),
    "runner.logger.project_name": _to(
        "logger.wandb_project", _project, "and logger.swanlab_project, for the backends on"
    ),
    "runner.logger.experiment_name": _to("runner.experiment_name"),
    "runner.logger.logger_backends": _to(
        "logger.backends", _backends, "console and jsonl are always on"
    ),
    "runner.experiment_name": _to("runner.experiment_name"),
    "runner.output_dir": _to("runner.output_dir"),
    "runner.max_steps": _to("runner.max_steps", _max_steps, "-1: max_epochs (embodied)"),
    "runner.max_epochs": _none(
        "rlstack runs runner.max_steps steps; an embodied run's max_epochs is its max_steps "
        "when runner.max_steps is -1",
    ),
    "runner.only_eval": _none("evaluate a checkpoint with python -m rlshell.evaluate", _is(False)),
    "runner.val_check_interval": _to("runner.eval_interval", _interval, "-1 is 0"),
    "runner.save_interval": _to("checkpoint.interval", _interval, "-1 is 0"),
    "runner.resume_dir": _to("checkpoint.resume"),
    "runner.ckpt_path": _none(
        "rlstack starts a model from a run's checkpoint directory (actor.model.checkpoint), "
        "not a .pt file",
        _is(None),
    ),
    "runner.seq_length": _none(
        "a sequence is its prompt and at most rollout.max_new_tokens here, unpadded", _any
    ),
    "runner.enable_dynamic_batch_size": _none(
        "rlstack always forms micro-batches by a token budget (actor.micro_batch_max_tokens)"
    ),
    "runner.max_tokens_per_mbs": _to("actor.micro_batch_max_tokens"),
    # algorithm
    "algorithm.adv_type": _to("algorithm.adv_type", _adv_type, "reinpp is reinforce_pp"),
    "algorithm.loss_type": _to("algorithm.loss_type", _loss_type, "actor, actor_critic: ppo"),
    "algorithm.loss_agg_func": _to("algorithm.loss_agg_mode"),
    "algorithm.group_size": _to("algorithm.group_size", _group_size, "gae's 1: unset"),
    "algorithm.update_epoch": _to("algorithm.ppo_epochs"),
    "algorithm.n_minibatches": _to(
        "actor.mini_batch_size", _n_minibatches, "rollout_batch_size / n_minibatches prompts"
    ),
    "algorithm.normalize_advantages": _to(
        "algorithm.norm_adv", _normalize_advantages, "reasoning: grpo, or dr_grpo when false"
    ),
    "algorithm.kl_beta": _to("algorithm.kl_coef"),
    "algorithm.kl_penalty": _to("algorithm.kl_kind", _kl_kind, "kl k1, mse k2, low_var_kl k3"),
    "algorithm.kl_penalty_type": _to("algorithm.kl_kind", _kl_kind, "kl k1, mse k2, low_var_kl k3"),
    "algorithm.entropy_bonus": _to("algorithm.entropy_coef"),
    "algorithm.ratio_clip_eps": _none(
        "read as algorithm.clip_low / clip_high where clip_ratio_low / high are null"
    ),
    "algorithm.clip_ratio_low": _to(
        "algorithm.clip_low", _clip("algorithm.ratio_clip_eps"), "null: ratio_clip_eps"
    ),
    "algorithm.clip_ratio_high": _to(
        "algorithm.clip_high", _clip("algorithm.ratio_clip_eps"), "null: ratio_clip_eps"
    ),
    "algorithm.clip_ratio_c": _to("algorithm.dual_clip", _optional, "null: none"),
    "algorithm.value_clip": _to("algorithm.value_clip", _critic_only(), "gae only"),
    "algorithm.huber_delta": _none(
        "rlstack's value loss is the squared error, clipped by algorithm.value_clip",
        lambda v, c: v is None or c.get("algorithm.adv_type") != "gae",
    ),
    "algorithm.gamma": _to("algorithm.gamma"),
    "algorithm.gae_lambda": _to("algorithm.lam", _critic_only(), "gae only"),
    "algorithm.bootstrap_type": _to(
        "algorithm.bootstrap_at_done", _critic_only(_bootstrap), "standard is truncated"
    ),
    "algorithm.recompute_logprobs": _to(
        "algorithm.old_logprobs", _old_logprobs, "true: recompute, false: rollout"
    ),
    "algorithm.reward_type": _none(
        "rlstack's embodied runners reward each action step", _is("action_level")
    ),
    "algorithm.logprob_type": _none(
        "an embodied action's log-prob is summed over its dimensions here", _is("action_level")
    ),
    "algorithm.entropy_type": _none(
        "an embodied action's entropy is summed over its dimensions here", _is("action_level")
    ),
    "algorithm.early_stop_imp_ratio": _none(
        "rlstack caps importance weights with algorithm.rollout_is / behavior_weight_cap",
        _is(None),
    ),
    "algorithm.use_valid_token_scale": _none(
        "tokens are aggregated by algorithm.loss_agg_mode", _is(False)
    ),
    "algorithm.shuffle_rollout": _none("rlstack's update keeps the rollout's order", _is(False)),
    "algorithm.reward_coef": _none("rlstack trains on the env's reward unscaled", _is(1, 1.0)),
    "algorithm.filter_rewards": _none(
        "rlstack keeps every group (the reasoning runner's algorithm.dynamic_sampling drops "
        "the uninformative ones)",
        _is(False),
    ),
    "algorithm.rewards_lower_bound": _none(
        "read only with filter_rewards", lambda v, c: not c.get("algorithm.filter_rewards")
    ),
    "algorithm.rewards_upper_bound": _none(
        "read only with filter_rewards", lambda v, c: not c.get("algorithm.filter_rewards")
    ),
    "algorithm.calculate_entropy": _none("rlstack always reports the entropy"),
    "algorithm.training_batch_size_per_gpu": _none(SPEED),
    "algorithm.rollout_batch_size_per_gpu": _none(SPEED),
    "algorithm.logprob_forward_micro_batch_size": _none(SPEED),
    "algorithm.val_rollout_batch_size_per_gpu": _none(SPEED),
    **_sampling("algorithm.sampling_params"),
    **_sampling("rollout.sampling_params"),
    # env
    "env.group_name": _none(NAMED),
    **_env("env.train"),
    # rollout
    "rollout.group_name": _none(NAMED),
    "rollout.backend": _to("rollout.backend", _rollout_backend, "huggingface is hf"),
    "rollout.generation_backend": _to("rollout.backend", _rollout_backend, "huggingface is hf"),
    "rollout.rollout_backend": _to("rollout.backend", _rollout_backend, "huggingface is hf"),
    "rollout.enable_offload": _to("rollout.enable_offload"),
    "rollout.recompute_logprobs": _none(
        "the embodied runners take π_old from the log-probs the rollout recorded", _is(False)
    ),
    "rollout.collect_prev_infos": _none("read by RLinf's off-policy runners only", _is(False)),
    "rollout.pipeline_stage_num": _to("rollout.pipeline_stage_num"),
    "rollout.enable_torch_compile": _to("rollout.compile"),
    "rollout.enable_cuda_graph": _none(SPEED),
    "rollout.gpu_memory_utilization": _to("rollout.gpu_memory_utilization"),
    "rollout.tensor_parallel_size": _to("rollout.tensor_parallel_size"),
    "rollout.pipeline_parallel_size": _none(
        "rlstack's rollout engines shard by rollout.tensor_parallel_size only", _is(1)
    ),
    "rollout.model.model_path": _none(
        "the rollout serves the actor's weights (actor.model.path)",
        _equals_key("actor.model.model_path", "", None),
    ),
    "rollout.model.model_type": _none(
        "the rollout serves the actor's model", _equals_key("actor.model.model_type", None)
    ),
    "rollout.model.precision": _to("rollout.precision", _rollout_precision, "the actor's: null"),
    "rollout.return_logprobs": _none(
        "rlstack's engines always report log-probs; algorithm.old_logprobs says which are used"
    ),
    "rollout.enforce_eager": _none(SPEED),
    "rollout.detokenize": _none(SPEED),
    "rollout.distributed_executor_backend": _none(SPEED),
    "rollout.disable_log_stats": _none(SPEED),
    "rollout.max_running_requests": _none(SPEED),
    "rollout.cuda_graph_max_bs": _none(SPEED),
    "rollout.padding": _none("rlstack reads padding from the tokenizer", _is(None)),
    "rollout.eos": _none("rlstack reads the end of a response from the tokenizer", _is(None)),
    "rollout.validate_weight": _none("rlstack's weight sync is tested, not compared", _is(False)),
    "rollout.validate_save_dir": _none("read only with validate_weight", _is(None)),
    "rollout.print_outputs": _none("a debugging print", _is(False)),
    # weight sync
    "weight_syncer.type": _to(
        "rollout.weight_sync",
        lambda v, c: _synced(_choice({"bucket": "bucket", "patch": "patch"}, "syncers")(v, c), c),
        "embodied: unset",
    ),
    "weight_syncer.bucket.bucket_size": _to("rollout.bucket_size_mb", _bucket_mb, "bytes → MiB"),
    "weight_syncer.bucket.bucket_dtype": _none(
        "the synced weights' precision is rollout.precision", _is(None)
    ),
    "weight_syncer.bucket.is_agent": _none("rlstack syncs to its own engines", _is(False)),
    "weight_syncer.bucket.load_instant": _none(SPEED),
    "weight_syncer.patch.snapshot_device": _none(SPEED),
    "weight_syncer.patch.delta_encoding": _none(SPEED),
    "weight_syncer.patch.compression": _none(SPEED),
    # data (reasoning)
    "data.type": _to("data.task", _choice({"math": "file"}, "RLinf's dataset types"), "math: file"),
    "data.dataset_name": _none("a label; the files are data.train_path / val_path"),
    "data.max_prompt_length": _none(
        "rlstack neither truncates nor filters prompts by length (only RLinf's sequence "
        "length arithmetic reads it)"
    ),
    "data.filter_prompt_by_length": _none("rlstack does not filter prompts by length", _is(False)),
    "data.rollout_batch_size": _to("runner.prompts_per_step"),
    "data.val_rollout_batch_size": _none(SPEED),
    "data.num_workers": _none(SPEED),
    "data.shuffle": _none("rlstack draws the prompts in shuffled epochs", _is(True)),
    "data.validation_shuffle": _none("the held-out prompts' order does not change a metric"),
    "data.seed": _to("runner.seed", note="the prompt sampler's seed"),
    "data.train_data_paths": _to("data.train_path", _one_path, "a list of one"),
    "data.val_data_paths": _to("data.val_path", _one_path, "a list of one"),
    "data.prompt_key": _to("data.prompt_key"),
    "data.answer_key": _to("data.answer_key"),
    "data.apply_chat_template": _to("data.chat_template"),
    # actor
    "actor.group_name": _none(NAMED),
    "actor.training_backend": _to("actor.backend"),
    "actor.micro_batch_size": _none(
        "rlstack forms micro-batches by a token budget (actor.micro_batch_max_tokens); " + SPEED
    ),
    "actor.global_batch_size": _to(
        "algorithm.num_minibatches",
        _global_batch_size,
        "embodied: rollout samples / global_batch_size",
    ),
    "actor.seed": _to("actor.seed"),
    "actor.enable_offload": _to("actor.enable_offload"),
    "actor.calculate_flops": _none("a metric; rlstack reports its own throughput"),
    "actor.model.model_type": _to("actor.model.model_type", _model_type, "reasoning: hf_causal_lm"),
    "actor.model.model_path": _to("actor.model.path", _path, "'': none"),
    "actor.model.precision": _to(
        "actor.model.precision", _model_precision, "'32' is fp32; null: rlstack's fp32"
    ),
    "actor.model.is_lora": _to("actor.model.is_lora"),
    "actor.model.lora_rank": _to("actor.model.lora_rank"),
    "actor.model.lora_path": _none("rlstack's LoRA adapters start fresh", _is(None)),
    "actor.model.seq_length": _none("a sequence is its prompt and its response here", _any),
    "actor.model.encoder_seq_length": _none("a sequence is its prompt and its response here"),
    "actor.optim.optimizer": _none(
        "rlstack's optimizer is AdamW (decoupled weight decay)", _is("adam", "adamw")
    ),
    "actor.optim.lr": _to("actor.optim.lr"),
    "actor.optim.value_lr": _to("critic.optim.lr", _value_lr, "embodied: equal to lr"),
    "actor.optim.adam_beta1": _to("actor.optim.adam_beta1"),
    "actor.optim.adam_beta2": _to("actor.optim.adam_beta2"),
    "actor.optim.adam_eps": _to("actor.optim.adam_eps"),
    "actor.optim.weight_decay": _to("actor.optim.weight_decay"),
    "actor.optim.clip_grad": _to("actor.optim.clip_grad"),
    "actor.optim.use_distributed_optimizer": _to("actor.megatron.use_distributed_optimizer"),
    "actor.optim.lr_scheduler": _to(
        "actor.optim.lr_scheduler",
        _choice(
            {
                "torch_constant": "constant",
                "constant": "constant",
                "torch_cosine": "cosine",
                "cosine": "cosine",
                "torch_linear": "linear",
                "linear": "linear",
            },
            "schedules",
        ),
        "torch_constant: constant, torch_cosine: cosine",
    ),
    "actor.optim.critic_warmup_steps": _to(
        "critic.warmup_steps", _critic_warmup, "reasoning; embodied: 0 only"
    ),
    "actor.optim.bf16": _none("the precision is actor.model.precision here"),
    "actor.optim.fp16": _none("the precision is actor.model.precision here"),
    "actor.optim.loss_scale": _none(SPEED),
    "actor.optim.overlap_grad_reduce": _none(SPEED),
    "actor.optim.overlap_param_gather": _none(SPEED),
    "actor.optim.overlap_param_gather_with_optimizer_step": _none(SPEED),
    "actor.optim.optimizer_enable_pin": _none(SPEED),
    "actor.lr_sched.lr_decay_style": _to(
        "actor.optim.lr_scheduler",
        _choice({"constant": "constant", "linear": "linear", "cosine": "cosine"}, "decays"),
        "the same names",
    ),
    "actor.lr_sched.lr_warmup_iters": _to(
        "actor.optim.lr_warmup_steps", _warmup_iters, "0 with a fraction: the fraction's"
    ),
    "actor.lr_sched.lr_warmup_fraction": _to(
        "actor.optim.lr_warmup_steps", _warmup_fraction, "× runner.max_steps"
    ),
    "actor.lr_sched.lr_warmup_init": _none("rlstack's warm-up starts from 0", _is(0, 0.0)),
    "actor.lr_sched.max_lr": _none(
        "the peak learning rate is actor.optim.lr", _equals_key("actor.optim.lr", None)
    ),
    "actor.lr_sched.min_lr": _to("actor.optim.min_lr_ratio", _min_lr, "min_lr / lr"),
    "actor.lr_sched.lr_decay_iters": _none("rlstack decays over runner.max_steps", _lr_decay_iters),
    "actor.tokenizer.tokenizer_model": _to(
        "actor.model.tokenizer_path", _tokenizer_path, "the model's own: null"
    ),
    "actor.tokenizer.use_fast": _none("rlstack loads the tokenizer's fast version"),
    "actor.tokenizer.trust_remote_code": _none(
        "rlstack does not run a model repository's own code", _is(False)
    ),
    "actor.tokenizer.padding_side": _none("rlstack pads each batch itself"),
    "actor.fsdp_config.strategy": _none("rlstack's FSDP is FSDP2", _is("fsdp", "fsdp2")),
    "actor.fsdp_config.sharding_strategy": _none(SPEED),
    "actor.fsdp_config.gradient_checkpointing": _to("actor.model.gradient_checkpointing"),
    "actor.fsdp_config.cpu_offload": _none(
        "rlstack moves the actor to host memory between phases (actor.enable_offload)",
        _is(False),
    ),
    "actor.fsdp_config.offload_pin_memory": _none(SPEED),
    "actor.fsdp_config.reshard_after_forward": _to("actor.fsdp_config.reshard_after_forward"),
    "actor.fsdp_config.enable_gradient_accumulation": _none(SPEED),
    "actor.fsdp_config.forward_prefetch": _none(SPEED),
    "actor.fsdp_config.limit_all_gathers": _none(SPEED),
    "actor.fsdp_config.backward_prefetch": _none(SPEED),
    "actor.fsdp_config.use_orig_params": _none(SPEED),
    "actor.fsdp_config.use_liger_kernel": _none(SPEED),
    "actor.fsdp_config.mixed_precision.param_dtype": _to(
        "actor.fsdp_config.mixed_precision", _model_precision, "null: rlstack's fp32"
    ),
    "actor.fsdp_config.mixed_precision.reduce_dtype": _none(
        "one precision, actor.fsdp_config.mixed_precision",
        _equals_key("actor.fsdp_config.mixed_precision.param_dtype", None),
    ),
    "actor.fsdp_config.mixed_precision.buffer_dtype": _none(
        "one precision, actor.fsdp_config.mixed_precision",
        _equals_key("actor.fsdp_config.mixed_precision.param_dtype", None),
    ),
    "actor.fsdp_config.amp_autocast.enabled": _none(
        "rlstack's mixed precision is FSDP2's (actor.fsdp_config.mixed_precision), not autocast",
        _is(False),
    ),
    "actor.fsdp_config.amp_autocast.precision": _none(
        "read only with amp_autocast",
        lambda v, c: not c.get("actor.fsdp_config.amp_autocast.enabled"),
    ),
    "actor.fsdp_config.grad_scaler.enabled": _none("read only with amp_autocast", _is(False)),
    # reward and critic
    "reward.group_name": _none(NAMED),
    "reward.use_reward_model": _none(
        "rlstack's rewards are registered functions (reward.reward_type)", _is(False)
    ),
    "reward.reward_type": _to("reward.reward_type"),
    "reward.reward_scale": _to("reward.weights", _reward_scale, "{reward_type: scale}"),
    "critic.use_critic_model": _none(
        "a reasoning run trains a critic when algorithm.adv_type is gae; an embodied policy "
        "carries its own value head",
        _critic_model,
    ),
}

# Keys under these prefixes not named in RULES: rule for the rest of the key.
_PREFIX_RULES: dict[str, Callable[[str], Rule]] = {
    "cluster.component_placement.": lambda rest: _to(
        f"cluster.component_placement.{rest}", _placement
    ),
    "env.eval.": lambda rest: _none(
        "rlstack's embodied runners do not evaluate during training (evaluate a checkpoint "
        "with python -m rlshell.evaluate); RLinf builds no eval env when "
        "runner.val_check_interval is -1",
        _unless_evaluating,
    ),
    "reward.tokenizer.": lambda rest: _none("rewards read the decoded text here"),
    "inference.": lambda rest: _none(
        "rlstack computes π_old in the actor (algorithm.old_logprobs); no placement names "
        "'inference'",
        _no_inference_group,
    ),
    "weight_syncer.patch.init_sync.": lambda rest: _none(SPEED),
    "rollout.sglang.": lambda rest: _none(SPEED),
    "rollout.vllm.": lambda rest: _none(SPEED),
    "actor.model.": lambda rest: _to(
        f"actor.model.model_kwargs.{rest.partition('.')[0]}",
        note="the model builder's own options",
    ),
}

UNKNOWN = "not in rlstack's table of RLinf keys (docs/from_rlinf.md): nothing here reads it"


def rule_for(key: str) -> Rule | None:
    """The rule for a (flattened) RLinf key, or None when the table does not know it."""
    rule = RULES.get(key)
    if rule is not None:
        return rule
    for prefix, make in _PREFIX_RULES.items():
        if key.startswith(prefix):
            return make(key[len(prefix) :])
    return None


# --- mapping -------------------------------------------------------------------------------------


def _flatten(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, value in data.items():
        key = f"{prefix}{name}"
        # A model option's value is the builder's, whole (actor.model.vision: {...}).
        if isinstance(value, Mapping) and value and not key.startswith("actor.model."):
            yield from _flatten(value, key + ".")
        else:
            yield key, value


def _assign(data: dict[str, Any], target: str, value: Any) -> None:
    *sections, name = target.split(".")
    node = data
    for section in sections:
        node = node.setdefault(section, {})
    node[name] = value


def map_rlinf(resolved: Mapping[str, Any]) -> tuple[dict[str, Any], list[Refusal]]:
    """rlstack config data for a resolved RLinf config, and the keys refused (with why).

    A model section's nested option (``actor.model.vision: {...}``) goes to
    ``model_kwargs`` whole. Two RLinf keys that set one rlstack key to different
    values are both reported.
    """
    flat = dict(_flatten(resolved))
    data: dict[str, Any] = {}
    set_by: dict[str, tuple[str, Any]] = {}
    refusals: list[Refusal] = []
    for key, value in flat.items():
        rule = rule_for(key)
        if rule is None:
            refusals.append(Refusal(key, value, None, UNKNOWN))
            continue
        try:
            converted = rule.apply(value, flat)
        except _Refused as refused:
            refusals.append(Refusal(key, value, rule.target, str(refused)))
            continue
        values = converted.values if isinstance(converted, _Many) else {rule.target: converted}
        for target, new in values.items():
            if isinstance(new, _Omit) or target is None:
                continue
            earlier = set_by.get(target)
            if earlier is not None and earlier[1] != new:
                refusals.append(
                    Refusal(
                        key,
                        value,
                        target,
                        f"sets it to {new!r}, but {earlier[0]} sets it to {earlier[1]!r}",
                    )
                )
                continue
            set_by[target] = (key, new)
            _assign(data, target, new)
    return data, refusals


def refusal_lines(refusals: list[Refusal]) -> list[str]:
    """The refused keys as table rows: RLinf key, value, rlstack's key or why there is none."""
    key_width = max((len(r.key) for r in refusals), default=0)
    value_width = max((len(_shown(r.value)) for r in refusals), default=0)
    return [r.line(key_width, value_width) for r in refusals]


# --- reading -------------------------------------------------------------------------------------


def _register_resolvers() -> None:
    """RLinf's own OmegaConf resolvers (``rlinf.utils.omega_resolver``), written again."""
    from omegaconf import OmegaConf

    resolvers: dict[str, Callable[..., Any]] = {
        "multiply": lambda x, y: x * y,
        "int_div": lambda x, y: x // y,
        "subtract": lambda x, y: x - y,
        "not": lambda x: not bool(x),
    }
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


@contextmanager
def _hydra_of_its_own() -> Iterator[None]:
    """Hydra's compose API in a process that is itself a Hydra app (a script under
    ``@hydra.main`` calling `rlshell.api.load_config`): its Hydra is set aside while the
    RLinf config is composed, and put back."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    outer = get_gh_backup()  # what Hydra's own initialize_config_dir saves and restores
    GlobalHydra.instance().clear()
    try:
        yield
    finally:
        restore_gh_from_backup(outer)


@contextmanager
def _rlinf_search_path(config_dir: Path) -> Iterator[None]:
    """RLinf's configs add ``${oc.env:EMBODIED_PATH}/config/`` (or ``REASONING_PATH``) to
    Hydra's search path, set by RLinf's launch scripts to the folder above ``config/``;
    unset, it is set to that folder while the config is composed."""
    added = []
    for name in ("EMBODIED_PATH", "REASONING_PATH"):
        if name not in os.environ:
            os.environ[name] = str(config_dir.parent)
            added.append(name)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def read_rlinf_yaml(path: str | Path) -> dict[str, Any]:
    """An RLinf Hydra config composed (its ``defaults:``) and resolved (its ``${...}``) as
    plain data; `RLinfConfigError` names the file and what failed."""
    import yaml  # type: ignore[import-untyped]
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    source = Path(path).resolve()
    if not source.is_file():
        raise RLinfConfigError([f"config file {path} does not exist"])
    _register_resolvers()
    config_dir = source.parent
    try:
        with (
            _hydra_of_its_own(),
            _rlinf_search_path(config_dir),
            warnings.catch_warnings(),
            initialize_config_dir(config_dir=str(config_dir), version_base=None),
        ):
            # RLinf's configs leave `_self_` out of their defaults lists (Hydra warns):
            # the file's own keys then override its defaults, as RLinf reads them.
            warnings.simplefilter("ignore", UserWarning)
            composed = compose(config_name=source.stem)
            resolved = OmegaConf.to_container(composed, resolve=True)
    except HydraException as error:
        raise RLinfConfigError(
            [f"{path}: Hydra could not compose it: {_first_line(error)}"]
        ) from None
    except OmegaConfBaseException as error:
        raise RLinfConfigError([f"{path}: {_interpolation_message(error)}"]) from None
    except yaml.YAMLError as error:
        raise RLinfConfigError([f"{path}: not valid YAML: {_first_line(error)}"]) from None
    if not isinstance(resolved, dict):
        raise RLinfConfigError([f"{path}: expected a mapping of sections, got {resolved!r}"])
    return {str(key): value for key, value in resolved.items()}


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _interpolation_message(error: Exception) -> str:
    key = getattr(error, "full_key", None)
    message = getattr(error, "msg", None) or _first_line(error)
    where = f"{key}: " if key else ""
    return f"{where}{message.strip().splitlines()[0]} ({type(error).__name__})"


def read_rlinf_config(path: str | Path) -> dict[str, Any]:
    """rlstack config data for an RLinf YAML config; `RLinfConfigError` lists every key
    refused, one line each (RLinf key, value, rlstack's key or why there is none)."""
    data, refusals = map_rlinf(read_rlinf_yaml(path))
    if refusals:
        raise RLinfConfigError([f"RLinf key {line}" for line in refusal_lines(refusals)])
    return data


# --- suggestions ---------------------------------------------------------------------------------


def rlinf_hint(key: str) -> str | None:
    """What an RLinf key is here ("RLinf's `runner.save_interval` is `checkpoint.interval`
    here"), for a key rlstack does not know; None when it is not an RLinf key either."""
    rule = RULES.get(key)
    if rule is not None:
        if rule.target is not None and rule.target != key:
            return f"RLinf's `{key}` is `{rule.target}` here"
        if rule.target is None:
            return f"RLinf's `{key}` has no rlstack key: {rule.reason}"
        return None
    renamed = sorted(
        name for name, rule in RULES.items() if name.startswith(key + ".") and rule.target
    )
    if renamed:
        shown = ", ".join(f"`{name}` is `{RULES[name].target}`" for name in renamed[:4])
        more = f" (and {len(renamed) - 4} more)" if len(renamed) > 4 else ""
        return f"RLinf's `{key}` section is spread over rlstack's keys: {shown}{more}"
    return None


def markdown_table() -> str:
    """`RULES` as the Markdown table of docs/from_rlinf.md ("Renamed keys")."""
    lines = ["| RLinf key | rlstack key | note |", "|---|---|---|"]
    for key, rule in RULES.items():
        target = f"`{rule.target}`" if rule.target else "none"
        lines.append(f"| `{key}` | {target} | {rule.reason.replace('|', '/')} |")
    for prefix, make in _PREFIX_RULES.items():
        rule = make("<name>")
        target = f"`{rule.target}`" if rule.target else "none"
        lines.append(f"| `{prefix}<name>` | {target} | {rule.reason.replace('|', '/')} |")
    return "\n".join(lines)
