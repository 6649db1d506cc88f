"""The checks only a real run needs (``for_run``; ``--dry-run`` skips them): files,
data and checkpoints that must exist, models that must be in the Hub cache, the packages
the named backends and engines need."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlcore.registry import Registry
from rlshell.checkpoint import (
    CheckpointError,
    list_checkpoints,
    queue_problem,
    read_trainer_state,
    verify_checkpoint,
)
from rlshell.config import Config
from rlshell.engines.plugins import Package, missing_packages
from rlshell.engines.rollout import ROLLOUT_ENGINES
from rlshell.engines.training import TRAINING_BACKENDS
from rlshell.rundir import run_dir_of
from rlshell.signing import SigningError, load_key

__all__ = [
    "run_only_problems",
]


def _data_problems(config: Config) -> list[str]:
    """Dataset files, folders or Hub datasets that are missing, cannot be had offline, or lack
    a column: found before anything starts."""
    from rlshell.conversation import read_conversations
    from rlshell.data import Split, read_split
    from rlshell.demonstrations import load_demonstrations
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
        elif data.task in ("file", "conversations", "demonstrations"):
            try:
                if data.task == "file":
                    read_split(key, path, split, data.prompt_key, data.answer_key)
                elif data.task == "conversations":
                    read_conversations(path)
                else:
                    load_demonstrations(path)
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
    """``actor.model.checkpoint``: a checkpoint directory with policy weights and, for a
    language model, unless ``actor.model.tokenizer_path`` gives one, the tokenizer they were
    trained with."""
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
    # An embodied policy reads no tokenizer (tiny_vla builds its characters' from model_kwargs).
    reads_tokenizer = model.category == "reasoning"
    if reads_tokenizer and model.tokenizer_path is None and not (checkpoint / "tokenizer").is_dir():
        return [
            f"actor.model.checkpoint: {checkpoint} holds no tokenizer/ (a reasoning or sft "
            "run's checkpoints hold the tokenizer it trained with); set "
            "actor.model.tokenizer_path to the tokenizer its model was trained with"
        ]
    return []


def run_only_problems(config: Config) -> list[str]:
    try:
        load_key()  # saves sign with it, loads check it: a key that cannot be used stops here
    except SigningError as error:
        return [str(error)]
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
_SWANLAB = "run `pip install -e '.[swanlab]'` (or `pip install swanlab`)"
# MetaWorld pins an older mujoco than the project's: installed without its dependencies.
_METAWORLD = "run `make install` (or `pip install --no-deps metaworld==3.1.1`)"


_OPTIONAL_PACKAGES: tuple[tuple[str, str, Package], ...] = (
    ("logger.backends", "wandb", Package("wandb", "wandb", _WANDB)),
    ("logger.backends", "swanlab", Package("swanlab", "swanlab", _SWANLAB)),
    ("env.env_type", "maniskill", Package("mani_skill", "mani-skill", _MANISKILL)),
    ("env.env_type", "maniskill", Package("sapien", "sapien", _MANISKILL)),
    ("env.env_type", "metaworld", Package("metaworld", "metaworld", _METAWORLD)),
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
        remedy = f", or remove '{value}' from logger.backends" if key == "logger.backends" else ""
        problems.append(
            f"{key}: '{value}' needs {which} not installed: {packages[-1].install}{remedy}"
        )
    return problems
