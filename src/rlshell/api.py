"""The Python API: what the command lines do, as functions a script or a notebook calls.

    from rlshell.api import evaluate, export, load_config, load_policy, train

    def brief(response: str, answer: str) -> float:
        return float(response.strip() == answer) - 0.01 * len(response)

    config = load_config("configs/grpo.py", ["runner.max_steps=5", "reward.reward_type=brief"],
                         rewards=brief)
    result = train(config, rewards=brief)
    result.run_dir, result.metrics["reward/mean"], result.checkpoint
    evaluate(result, rewards=brief)["eval/accuracy"]

Reward functions, env builders and model builders are passed as Python
objects (``rewards=``, ``envs=``, ``models=``): each call registers them in
this process for its duration, so the config can name them, and sends them
pickled to every process the run starts (Ray workers, their reward
processes) in ``RLSHELL_EXT_OBJECTS`` (`rlshell.extensions`). A function
defined in a notebook, a script or a test module, a lambda and a closure all
travel; extension modules named by ``RLSHELL_EXT_MODULE`` load as they do for
the command line. The config names the object to use (``reward.reward_type``, or the names
of ``reward.weights``; ``env.env_type``, ``actor.model.model_type``); an
object it does not name is refused, so what runs is what the config says.

The command line is a thin wrapper over these functions (`rlshell.train`):
the same validation, the same run directory, the same run loop. Where the
command line prints an error and exits with a status, these raise:
`rlshell.config.ConfigError` for everything found before start (a run
directory that holds a run or is in use: `rlshell.rundir.RunDirError`), and
the worker, checkpoint and cluster errors for a run that failed. The first
Ctrl-C finishes the step, saves a checkpoint and raises
`rlshell.runners.loop.Interrupted`, a KeyboardInterrupt.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import frozen

from rlshell.checkpoint import TRAINER_STATE, CheckpointError, list_checkpoints, run_config_path
from rlshell.config import Config, ConfigError, read_config, write_config
from rlshell.extensions import Registration, encode_registrations, load_extensions, shipping
from rlshell.models import ModelEntry
from rlshell.models.base import BasePolicy
from rlshell.rundir import run_dir_of
from rlshell.runners.loop import TrainResult
from rlshell.runners.validation import load_config as _load_config
from rlshell.runners.validation import validate

if TYPE_CHECKING:
    from rlshell.cluster.placement import ClusterSpec
    from rlshell.cluster.ray_cluster import Cluster
    from rlshell.envs import EnvBuilder
    from rlshell.models import ModelBuilder
    from rlshell.rewards import RewardFn

__all__ = [
    "ConfigSource",
    "TrainResult",
    "evaluate",
    "export",
    "load_config",
    "load_policy",
    "run_dir_of",
    "train",
    "train_validated",
]

ConfigSource = Config | Mapping[str, Any] | str | Path


# --- Python objects ---------------------------------------------------------------------------


@frozen
class _Objects:
    """The rewards, envs and models one API call was given, by the name they register under."""

    rewards: dict[str, RewardFn]
    envs: dict[str, EnvBuilder]
    models: dict[str, ModelEntry]

    @classmethod
    def of(
        cls,
        rewards: RewardFn | Mapping[str, RewardFn] | None,
        envs: Mapping[str, EnvBuilder] | None,
        models: Mapping[str, ModelBuilder | ModelEntry] | None,
    ) -> _Objects:
        return cls(
            rewards=_reward_mapping(rewards),
            envs=_checked_mapping("envs", envs),
            models={
                name: entry if isinstance(entry, ModelEntry) else ModelEntry(entry, "embodied")
                for name, entry in _checked_mapping("models", models).items()
            },
        )

    def __bool__(self) -> bool:
        return bool(self.rewards or self.envs or self.models)

    def registrations(self) -> dict[str, tuple[Registration, Registration]]:
        """``label -> (register, unregister)`` for each object; the first travels to workers."""
        from rlshell.envs import ENVS, register_env
        from rlshell.models import MODELS, register_model
        from rlshell.rewards import REWARDS, register_reward

        calls: dict[str, tuple[Registration, Registration]] = {}
        for name, fn in self.rewards.items():
            calls[f"rewards[{name!r}] ({_describe(fn)})"] = (
                functools.partial(register_reward, name, fn),
                functools.partial(REWARDS.unregister, name),
            )
        for name, builder in self.envs.items():
            calls[f"envs[{name!r}] ({_describe(builder)})"] = (
                functools.partial(register_env, name, builder),
                functools.partial(ENVS.unregister, name),
            )
        for name, entry in self.models.items():
            calls[f"models[{name!r}] ({_describe(entry.builder)})"] = (
                functools.partial(register_model, name, entry.builder, entry.category),
                functools.partial(MODELS.unregister, name),
            )
        return calls

    def clashes(self) -> list[str]:
        """Names already registered here (built-ins, extension modules, earlier registrations)."""
        from rlshell.envs import ENVS
        from rlshell.models import MODELS
        from rlshell.rewards import REWARDS

        found = []
        for keyword, names, registry in (
            ("rewards", self.rewards, REWARDS),
            ("envs", self.envs, ENVS),
            ("models", self.models, MODELS),
        ):
            for name in names:
                if name in registry:
                    found.append(
                        f"{keyword}: {registry.kind} {name!r} is already registered "
                        f"({_describe(registry.get(name))}); give yours another name"
                    )
        return found

    def unnamed(self, config: Config) -> list[str]:
        """An object the config does not name: the run would not use it."""
        problems = []
        reward = config.reward
        for keyword, names, key, named in (
            ("rewards", self.rewards, "reward.reward_type", reward.reward_type),
            ("envs", self.envs, "env.env_type", config.env.env_type),
            ("models", self.models, "actor.model.model_type", config.actor.model.model_type),
        ):
            for name in names:
                if keyword == "rewards" and reward.weights:
                    if name not in reward.weights:
                        problems.append(
                            f"reward.weights: {list(reward.weights)}, while rewards= passes "
                            f"{name!r}, which this run would never call; give it a weight in "
                            "reward.weights"
                        )
                elif name != named:
                    problems.append(
                        f"{key}: {named!r}, while {keyword}= passes {name!r}, which this run "
                        f"would never call; set {key}={name!r}"
                        + (
                            " (or, to combine several rewards, name each with its weight in "
                            "reward.weights)"
                            if keyword == "rewards"
                            else ""
                        )
                    )
        return problems


def _describe(entry: object) -> str:
    if isinstance(entry, ModelEntry):
        entry = entry.builder
    module = getattr(entry, "__module__", None) or type(entry).__module__
    name = getattr(entry, "__qualname__", None) or type(entry).__qualname__
    return f"{module}.{name}"


def _checked_mapping(keyword: str, objects: Mapping[str, Any] | None) -> dict[str, Any]:
    if objects is None:
        return {}
    if not isinstance(objects, Mapping):
        raise TypeError(
            f"{keyword}: expected a mapping from the name the config uses to the object, "
            f"got {type(objects).__name__}"
        )
    for name, entry in objects.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{keyword}: names must be non-empty strings, got {name!r}")
        if not callable(entry) and not isinstance(entry, ModelEntry):
            raise TypeError(f"{keyword}[{name!r}]: expected a callable, got {type(entry).__name__}")
    return dict(objects)


def _reward_mapping(rewards: RewardFn | Mapping[str, RewardFn] | None) -> dict[str, RewardFn]:
    """A mapping as given; one function under its ``__name__`` (a lambda has none)."""
    if rewards is None or isinstance(rewards, Mapping):
        return _checked_mapping("rewards", rewards)
    if not callable(rewards):
        raise TypeError(
            "rewards: expected a function fn(response, answer) -> float or a mapping from "
            f"names to such functions, got {type(rewards).__name__}"
        )
    name = getattr(rewards, "__name__", None)
    if not isinstance(name, str) or not name.isidentifier():
        what = "a lambda" if name == "<lambda>" else f"a {type(rewards).__name__} object"
        raise ValueError(
            f"rewards: {what} has no name to register it under; pass "
            "rewards={'my_reward': fn} and set reward.reward_type='my_reward'"
        )
    return {name: rewards}


@contextmanager
def _registered(
    rewards: RewardFn | Mapping[str, RewardFn] | None = None,
    envs: Mapping[str, EnvBuilder] | None = None,
    models: Mapping[str, ModelBuilder | ModelEntry] | None = None,
) -> Iterator[_Objects]:
    """Extension modules loaded; the objects registered here and shipped to the processes
    started in the block; the registrations undone on the way out."""
    load_extensions(where="driver")
    objects = _Objects.of(rewards, envs, models)
    if not objects:
        yield objects
        return
    clashes = objects.clashes()
    if clashes:
        raise ValueError("\n".join(clashes))
    calls = objects.registrations()
    # Pickled first: an object that cannot travel fails before anything is registered.
    payload = encode_registrations({label: register for label, (register, _) in calls.items()})
    registered: list[Registration] = []
    try:
        for register, unregister in calls.values():
            register()
            registered.append(unregister)
        with shipping(payload):
            yield objects
    finally:
        for unregister in reversed(registered):
            unregister()


# --- configs and training ---------------------------------------------------------------------


def load_config(
    source: ConfigSource,
    overrides: Sequence[str] = (),
    *,
    for_run: bool = True,
    rewards: RewardFn | Mapping[str, RewardFn] | None = None,
    envs: Mapping[str, EnvBuilder] | None = None,
    models: Mapping[str, ModelBuilder | ModelEntry] | None = None,
) -> Config:
    """A validated config from a config file, a resolved ``config.json``, an RLinf YAML
    config (`rlshell.config.rlinf`), a `Config` or a plain mapping, with ``key.path=value``
    overrides applied; `ConfigError` lists every problem. ``for_run=False`` leaves out
    the checks that only matter when the run starts (files on disk, installed
    backends), as ``--dry-run`` does.

    ``rewards``, ``envs`` and ``models`` are registered while the config is
    checked, so it may name them (pass the same objects to `train`).
    """
    with _registered(rewards, envs, models) as objects:
        return _validated(source, overrides, objects, for_run=for_run)


def _validated(
    source: ConfigSource, overrides: Sequence[str], objects: _Objects, *, for_run: bool
) -> Config:
    if isinstance(source, str | Path):
        config = _load_config(source, overrides, for_run=for_run)
    else:
        config = read_config(
            source, overrides, check=lambda config: validate(config, for_run=for_run)
        )
    unnamed = objects.unnamed(config)
    if unnamed:
        raise ConfigError(unnamed)
    return config


def train(
    config: ConfigSource,
    overrides: Sequence[str] = (),
    *,
    rewards: RewardFn | Mapping[str, RewardFn] | None = None,
    envs: Mapping[str, EnvBuilder] | None = None,
    models: Mapping[str, ModelBuilder | ModelEntry] | None = None,
    overwrite: bool = False,
) -> TrainResult:
    """Train as ``config`` says and return what the run left (`TrainResult`).

    ``rewards``: a reward function ``fn(response, answer) -> float``
    (registered under its ``__name__``) or a mapping ``{name: fn}``;
    ``envs``: ``{name: builder(env_config, seed) -> VectorEnv}``; ``models``:
    ``{name: builder(model_config, torch_dtype) -> nn.Module}`` (an embodied
    model) or ``{name: ModelEntry(builder, "reasoning")}``. They are known
    to this process and every worker of the run, and only during this call.

    Validates first (`ConfigError` before anything starts), then locks and
    claims the run directory (`rlshell.rundir`: one that holds a run is
    refused unless ``checkpoint.resume`` continues it or ``overwrite`` clears
    it first), then starts Ray (or attaches to ``cluster.address``), plans the
    placement, writes the resolved ``config.json`` and ``placement.json`` to
    the run directory and runs the loop. Ray is shut down and the lock
    released on the way out, also on error and Ctrl-C.
    """
    with _registered(rewards, envs, models) as objects:
        validated = _validated(config, overrides, objects, for_run=True)
        return train_validated(validated, overwrite=overwrite)


def train_validated(config: Config, *, overwrite: bool = False) -> TrainResult:
    """`train` for a config that `load_config` has just validated (the command line's path)."""
    from rlshell.cluster.placement import PlacementError, render_table, write_plan
    from rlshell.cluster.ray_cluster import Cluster
    from rlshell.rundir import claimed_run_dir
    from rlshell.runners import run
    from rlshell.runners.spec import resolve_spec
    from rlshell.runners.validation import cluster_spec_for, plan_for

    run_dir = run_dir_of(config)
    spec = resolve_spec(config)
    embedded = config.cluster.address is None
    resume = config.checkpoint.resume
    with (
        claimed_run_dir(run_dir, resume=resume, overwrite=overwrite),
        Cluster(
            address=config.cluster.address,
            num_cpus=config.cluster.num_cpus if embedded else None,
            runtime_env_vars=config.cluster.worker_env_vars,
        ) as cluster,
    ):
        spec_of_nodes = wait_for_nodes(cluster, config)
        try:
            plan = plan_for(config, spec_of_nodes)
        except PlacementError as error:
            raise ConfigError([f"cluster.component_placement: {error}"]) from None
        if cluster_spec_for(config) is None and spec.rules is not None:
            # An attached cluster is planned only now: the trainer's rules on the plan.
            problems = spec.rules.problems(spec, plan)
            if problems:
                raise ConfigError(problems)
        print(render_table(plan), flush=True)
        write_config(config, run_dir / "config.json")
        write_plan(plan, run_dir / "placement.json")
        return run(spec, cluster, plan, run_dir)


def wait_for_nodes(cluster: Cluster, config: Config) -> ClusterSpec:
    """The attached cluster's spec once ``cluster.num_nodes`` nodes are alive."""
    import time

    deadline = time.monotonic() + config.cluster.startup_timeout_s
    while True:
        try:
            spec = cluster.spec(config.cluster.node_groups or None)
        except ValueError as error:  # node groups that do not fit the cluster's nodes
            raise ConfigError([f"cluster.node_groups: {error}"]) from None
        if len(spec.nodes) >= config.cluster.num_nodes or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    if len(spec.nodes) < config.cluster.num_nodes:
        raise TimeoutError(
            f"cluster.num_nodes: expected {config.cluster.num_nodes} nodes, but the Ray cluster "
            f"at '{config.cluster.address}' has {len(spec.nodes)} after "
            f"{config.cluster.startup_timeout_s:g} s (cluster.startup_timeout_s)"
        )
    return spec


# --- after training: evaluate, export, deploy -------------------------------------------------


def _checkpoint_of(run: TrainResult | str | Path) -> Path:
    """A run's newest checkpoint (a `TrainResult` or a run directory), or the path given."""
    if isinstance(run, TrainResult):
        if run.checkpoint is None:
            raise CheckpointError(
                f"the run in {run.run_dir} saved no checkpoint (checkpoint.interval=0): "
                "there is no policy to read"
            )
        return run.checkpoint
    path = Path(run)
    if (path / "checkpoints").is_dir():
        checkpoints = list_checkpoints(path)
        if not checkpoints:
            raise CheckpointError(f"run directory {path} holds no complete checkpoint")
        return checkpoints[-1][1]
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    return path


def _run_config_source(run: TrainResult | str | Path, checkpoint: Path) -> Path:
    """The resolved config of the run that wrote ``checkpoint``."""
    source = (
        run.run_dir / "config.json" if isinstance(run, TrainResult) else run_config_path(checkpoint)
    )
    if not source.is_file():
        raise CheckpointError(
            f"{checkpoint}: no run config at {source} (a run writes its resolved config.json "
            "there); pass config= (the run's config.json, a config file or a Config)"
        )
    return source


def evaluate(
    run: TrainResult | str | Path,
    config: ConfigSource | None = None,
    overrides: Sequence[str] = (),
    *,
    limit: int | None = None,
    episodes: int | None = None,
    num_envs: int | None = None,
    seed: int | None = None,
    gif: bool | None = None,
    no_tools: bool | None = None,
    samples: int | None = None,
    rewards: RewardFn | Mapping[str, RewardFn] | None = None,
    envs: Mapping[str, EnvBuilder] | None = None,
    models: Mapping[str, ModelBuilder | ModelEntry] | None = None,
) -> dict[str, Any]:
    """Evaluate a run's policy as ``python -m rlshell.evaluate`` does; return its report.

    ``run``: a `TrainResult`, a run directory (its newest checkpoint), a
    checkpoint directory or, for a reasoning run, an exported Hugging Face
    directory. ``config`` defaults to the run's resolved ``config.json``.
    A reasoning run is scored greedily on its held-out split by its reward
    (``limit``: the first N examples; ``eval/accuracy``; ``no_tools``: a run with
    ``agent.tools`` scored without them, as ``--no-tools``; ``samples``: also that many
    samples a prompt, ``eval/pass@K`` and ``eval/sample_accuracy``, as ``--samples``); an
    embodied run
    plays ``episodes`` episodes on ``num_envs`` envs (``seed``, ``gif``;
    ``eval/episode_return``, ``eval/success``). The other family's options
    are refused. ``rewards``, ``envs`` and ``models`` as in `train`.
    """
    from rlshell.evaluate import EVALUATORS

    checkpoint = _checkpoint_of(run)
    source = _run_config_source(run, checkpoint) if config is None else config
    options = {
        "limit": limit,
        "no_tools": no_tools,
        "samples": samples,
        "episodes": episodes,
        "num_envs": num_envs,
        "seed": seed,
        "gif": gif,
    }
    with _registered(rewards, envs, models) as objects:
        resolved = _validated(source, overrides, objects, for_run=True)
        runner = resolved.runner.runner_type
        evaluator = EVALUATORS.get(runner)
        if evaluator is None:
            raise ConfigError([f"runner.runner_type: '{runner}' runs have no evaluation"])
        foreign = sorted(
            name
            for name, value in options.items()
            if value is not None and name not in evaluator.options
        )
        if foreign:
            raise ValueError(
                f"{', '.join(foreign)}: not an option of the evaluation of {runner} runs "
                f"(it reads {', '.join(sorted(evaluator.options))})"
            )
        return evaluator.run(checkpoint, resolved, argparse.Namespace(**options))


def export(
    checkpoint: TrainResult | str | Path,
    out_dir: str | Path,
    config: ConfigSource | None = None,
    overrides: Sequence[str] = (),
    *,
    models: Mapping[str, ModelBuilder | ModelEntry] | None = None,
) -> Path:
    """Write a checkpoint's policy to ``out_dir`` as ``python -m rlshell.export`` does.

    A transformers model becomes a Hugging Face directory (load it with
    ``AutoModelForCausalLM.from_pretrained``); any other model
    ``model.safetensors`` and ``rlshell_model.json``, which `load_policy`
    reads. ``checkpoint``: a checkpoint directory, a run directory or a
    `TrainResult` (their newest checkpoint). ``config`` defaults to the run's
    resolved ``config.json``; ``models`` as in `train`.
    """
    from rlshell.export import export_checkpoint, run_config

    path = _checkpoint_of(checkpoint)
    with _registered(models=models):
        if config is None or isinstance(config, str | Path):
            resolved = run_config(path, None if config is None else Path(config), overrides)
        else:
            resolved = read_config(config, overrides)
        return export_checkpoint(path, Path(out_dir), resolved)


def load_policy(
    path: TrainResult | str | Path,
    *,
    models: Mapping[str, ModelBuilder | ModelEntry] | None = None,
) -> BasePolicy:
    """An embodied policy ready to act: its weights loaded, in eval mode.

    ``path``: an export directory (``<run dir>/policy``, or what `export`
    wrote), a checkpoint directory, a run directory (its ``policy/`` export,
    else its newest checkpoint) or a `TrainResult`. Act with
    ``policy.predict_action_batch({"states": obs}, mode="eval")`` under
    ``torch.no_grad()``. A reasoning run's policy is a language model, not a
    `BasePolicy`: its export is a Hugging Face directory that transformers
    loads, and this refuses it with that advice. ``models`` as in `train`.
    """
    from rlshell.export import MODEL_CONFIG_FILE, POLICY_EXPORT_DIR, load_exported
    from rlshell.export import load_policy as load_checkpoint_policy

    if isinstance(path, TrainResult):
        source = path.exported if path.exported is not None else _checkpoint_of(path)
    else:
        source = Path(path)
        if (source / POLICY_EXPORT_DIR / MODEL_CONFIG_FILE).is_file():
            source = source / POLICY_EXPORT_DIR
        elif (source / "checkpoints").is_dir():
            source = _checkpoint_of(source)
    with _registered(models=models):
        if (source / MODEL_CONFIG_FILE).is_file():
            model = load_exported(source)
        elif (source / TRAINER_STATE).is_file():
            model = load_checkpoint_policy(source).model
        elif (source / "config.json").is_file():
            raise CheckpointError(_hugging_face_advice(source))
        else:
            raise CheckpointError(
                f"{source} is neither an export ({MODEL_CONFIG_FILE}), a checkpoint "
                f"({TRAINER_STATE}) nor a run directory (checkpoints/)"
            )
    if not isinstance(model, BasePolicy):
        raise CheckpointError(
            f"{source}: the model is a {type(model).__name__}, not an rlshell BasePolicy "
            "(a reasoning run's language model): export it with rlshell.api.export and load "
            "the Hugging Face directory with transformers.AutoModelForCausalLM.from_pretrained"
        )
    return model.eval()


def _hugging_face_advice(path: Path) -> str:
    return (
        f"{path} is a Hugging Face directory (a reasoning run's language model), not an "
        "embodied policy: load it with transformers.AutoModelForCausalLM.from_pretrained and "
        "AutoTokenizer.from_pretrained"
    )
