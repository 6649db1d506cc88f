"""Training metrics: one `MetricLogger` writing to the backends a run asks for.

A runner logs a flat mapping of named numbers once per step::

    with MetricLogger(run_dir, cfg.logger.backends, cfg.runner.max_steps) as logger:
        for step in range(1, cfg.runner.max_steps + 1):
            ...
            logger.log(step, {"reward/mean": 0.52, "train/kl": 0.013, "perf/tokens_per_s": 812.0})

Steps count completed training steps (step 0, if logged, is before the first
update, e.g. an initial evaluation). Every key lives in a namespace, its
first path segment: ``train/``, ``rollout/``, ``reward/``, ``eval/``,
``time/``, ``perf/`` or ``env/``; so dashboards group alike metrics and a
misspelt key fails on the first step instead of going unnoticed.

Backends (``logger.backends``):

- ``console``: a tqdm progress bar on stderr (stdout stays free for a
  program's output) with the step, the ETA and the headline metrics (reward,
  KL, tokens/s, eval accuracy, and the share of failed reward calls as
  ``fail=12%`` while it is not zero). On a terminal it redraws in place; otherwise
  (a log file, CI) it prints a plain ASCII line at most every
  ``console_interval_s`` seconds, plus one at the start and one at the end.
- ``jsonl``: ``run_dir/metrics.jsonl``, one JSON object per `MetricLogger.log`
  call, flushed as it is written; `read_metrics` reads it back.
- ``tensorboard``: event files under ``run_dir/tensorboard``.
- ``wandb``: a Weights & Biases run with the run's resolved config, its
  files under ``run_dir/wandb`` (``WANDB_MODE=offline`` keeps them there for
  ``wandb sync``). Its id and the last step it received are kept in
  ``run_dir/wandb_run.json`` (`WANDB_RUN_FILE`). wandb is optional: only this
  backend imports it.
- ``swanlab``: a SwanLab experiment, the same way (RLinf's third backend): the
  resolved config, its files under ``run_dir/swanlab`` (``SWANLAB_MODE=offline``
  or ``local`` keeps them there; ``swanlab sync`` uploads an offline one), its
  id and last step in ``run_dir/swanlab_run.json`` (`SWANLAB_RUN_FILE`). swanlab
  is optional (``pip install -e '.[swanlab]'``): only this backend imports it.

Resuming (``start_step > 0``) drops the jsonl records after ``start_step``
and tells TensorBoard to hide its events after it, so the steps replayed
since the checkpoint appear once, as an uninterrupted run would have them.
W&B cannot take a step back (a run's history only grows), so a resumed run
continues the same W&B run (the id in ``wandb_run.json``) and sends it only
the steps after the last one it already has: for the steps replayed since
the checkpoint, W&B keeps the values the first attempt logged. SwanLab's
experiments are kept the same way (``swanlab_run.json``).
"""

from __future__ import annotations

import difflib
import importlib
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, SupportsFloat, TextIO

if TYPE_CHECKING:
    from rlshell.config import Config

__all__ = [
    "BACKENDS",
    "HEADLINE_METRICS",
    "METRICS_FILE",
    "NAMESPACES",
    "SWANLAB_RUN_FILE",
    "WANDB_RUN_FILE",
    "MetricLogger",
    "logger_for_run",
    "merge_rank_metrics",
    "plot_learning_curve",
    "plot_run",
    "read_metrics",
    "tokens_per_second",
]

NAMESPACES = (
    "train/",
    "critic/",
    "rollout/",
    "reward/",
    "eval/",
    "time/",
    "perf/",
    "env/",
    "async/",
    "agent/",
    "tools/",
)
BACKENDS = ("console", "jsonl", "tensorboard", "wandb", "swanlab")
METRICS_FILE = "metrics.jsonl"
WANDB_RUN_FILE = "wandb_run.json"
SWANLAB_RUN_FILE = "swanlab_run.json"
# The experiment trackers: backend -> (how to install it, what one of its runs is called).
_TRACKERS: dict[str, tuple[str, str]] = {
    "wandb": ("`make install` (or `pip install wandb`)", "W&B run"),
    "swanlab": ("`pip install -e '.[swanlab]'` (or `pip install swanlab`)", "SwanLab experiment"),
}

# The metrics the console bar shows when a step has them: key -> short label.
HEADLINE_METRICS: Mapping[str, str] = {
    "reward/mean": "reward",
    "reward/failed_frac": "fail",
    "train/kl": "kl",
    "perf/tokens_per_s": "tok/s",
    "eval/accuracy": "acc",
}
# Headline metrics left off the bar while they are 0: a healthy run's bar stays short.
_SHOWN_WHEN_NOT_ZERO = frozenset({"reward/failed_frac"})


def merge_rank_metrics(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One record from several workers' (ranks, env workers, stages): env episode figures
    weighted by episodes, sums of env steps, episodes and failures, the slowest worker's
    times, means of the rest."""
    merged: dict[str, float] = {}
    keys = {key for metrics in per_rank for key in metrics}
    episodes = [metrics.get("env/episodes", 0.0) for metrics in per_rank]
    for key in sorted(keys):
        values = [metrics[key] for metrics in per_rank if key in metrics]
        if key in ("env/episodes", "env/steps", "env/failures"):
            merged[key] = sum(values)
        elif key.startswith("env/"):
            weights = [e for metrics, e in zip(per_rank, episodes, strict=True) if key in metrics]
            total = sum(weights)
            if total > 0:
                merged[key] = sum(v * w for v, w in zip(values, weights, strict=True)) / total
        elif key.startswith("time/"):
            merged[key] = max(values)
        else:
            merged[key] = sum(values) / len(values)
    return merged


def tokens_per_second(total_tokens: int, step_seconds: float) -> float:
    """Throughput of one step (``perf/tokens_per_s``): verl's ``perf/throughput`` before it
    divides by the number of GPUs.

    tokens/s = (prompt + response tokens processed in the step) ÷ the step's wall time

    >>> tokens_per_second(4096, 2.0)
    2048.0
    """
    if total_tokens < 0:
        raise ValueError(f"total_tokens: expected an integer ≥ 0, got {total_tokens}")
    if not (math.isfinite(step_seconds) and step_seconds > 0):
        raise ValueError(f"step_seconds: expected a positive number, got {step_seconds}")
    return total_tokens / step_seconds


# ---------------------------------------------------------------------------
# Reading and plotting


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """The records of a ``metrics.jsonl`` file, in file order (``{"step": N, key: value, ...}``).

    A last line cut short by a crash is skipped; an unreadable line anywhere
    else raises ValueError naming the file and line. Non-finite values come
    back as they were logged (the file spells them ``NaN``/``Infinity``).
    """
    return [record for _, record in _read_lines(Path(path))]


def _read_lines(path: Path) -> list[tuple[str, dict[str, float]]]:
    """(the line as written, its record) for every complete record of a metrics file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError('expected a JSON object with an integer "step"')
        except ValueError as error:
            if number == len(lines):
                break  # the line being written when the run stopped
            raise ValueError(f"{path}:{number}: not a metrics record ({error}): {line!r}") from None
        records.append((line, record))
    return records


def plot_learning_curve(
    metrics_path: str | Path,
    out_path: str | Path,
    keys: Sequence[str] = ("reward/mean", "eval/accuracy"),
) -> Path:
    """Plot ``keys`` against step from a metrics file into a PNG, one subplot per key.

    Keys the file never logged are left out; ValueError if none is there.
    Returns ``out_path``. Uses matplotlib's `Figure` directly (Agg, no
    pyplot), so it needs no display and leaves matplotlib's global state alone.
    """
    source, target = Path(metrics_path), Path(out_path)
    records = read_metrics(source)
    curves = {
        key: [(r["step"], r[key]) for r in records if key in r] for key in dict.fromkeys(keys)
    }
    present = {key: points for key, points in curves.items() if points}
    if not present:
        logged = sorted({key for record in records for key in record} - {"step"})
        raise ValueError(
            f"{source}: none of the keys to plot ({', '.join(keys) or 'none given'}) was logged; "
            f"the file has {', '.join(logged) or 'no metrics'}"
        )

    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 2.6 * len(present)), layout="constrained")
    axes = figure.subplots(len(present), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (key, points) in zip(axes, present.items(), strict=True):
        steps, values = zip(*points, strict=True)
        ax.plot(steps, values, marker="." if len(points) <= 50 else None)
        ax.set_title(key)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    figure.suptitle(f"learning curve: {source.parent.name or source.name}")
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, format="png", dpi=100)
    return target


# ---------------------------------------------------------------------------
# The logger


class MetricLogger:
    """Validates each step's metrics and hands them to every configured backend.

    ``backends``: some of `BACKENDS` (``LoggerConfig.backends``).
    ``total_steps``: the run's length, for the progress bar's ETA.
    ``start_step``: the step a resumed run continues after (0 for a new run,
    which starts ``metrics.jsonl`` afresh); `log` then takes steps after it.
    ``log_every``: TensorBoard, wandb and swanlab receive the metrics of every
    ``log_every``-th step and of the last one (``total_steps``), plus the
    ``eval/`` metrics of any step, since evaluations are rare; the jsonl file
    records every step, and the console bar advances every step (tqdm limits
    how often it redraws).
    ``wandb_project``, ``experiment_name``, ``config``: the wandb run's
    project, name and config; ``swanlab_project``: the SwanLab experiment's
    project (its name and config are the same); ``experiment_name`` also labels
    the bar. A resumed logger continues the wandb run and SwanLab experiment
    recorded in ``run_dir`` (`WANDB_RUN_FILE`, `SWANLAB_RUN_FILE`).
    ``stream``: where the console writes (default: ``sys.stderr`` at
    construction, so pytest's capture sees it); ``console_interval_s``: the
    least time between two lines when that stream is not a terminal.

    A context manager: leaving the block closes (flushes) every backend.
    """

    def __init__(
        self,
        run_dir: str | Path,
        backends: Sequence[str],
        total_steps: int,
        *,
        start_step: int = 0,
        log_every: int = 1,
        wandb_project: str | None = None,
        swanlab_project: str | None = None,
        experiment_name: str = "run",
        config: Mapping[str, Any] | None = None,
        stream: TextIO | None = None,
        console_interval_s: float = 5.0,
    ) -> None:
        unknown = [name for name in backends if name not in BACKENDS]
        if unknown:
            raise ValueError(
                f"logger.backends: unknown backend {', '.join(map(repr, unknown))}; "
                f"expected some of {', '.join(BACKENDS)}"
            )
        if total_steps < 1:
            raise ValueError(f"total_steps: expected an integer ≥ 1, got {total_steps}")
        if not 0 <= start_step <= total_steps:
            raise ValueError(
                f"start_step: expected an integer in [0, total_steps={total_steps}], "
                f"got {start_step}"
            )
        if log_every < 1:
            raise ValueError(f"logger.log_every: expected an integer ≥ 1, got {log_every}")
        self.run_dir = Path(run_dir)
        self.total_steps = total_steps
        self.start_step = start_step
        self.log_every = log_every
        self._stream = stream if stream is not None else sys.stderr
        self._last_step: int | None = None
        self._closed = False
        self._console: _Console | None = None
        self._every_step: list[_Backend] = []
        self._periodic: list[_Backend] = []

        wanted = set(backends)
        # The trackers first: a missing package should fail before any file is touched.
        trackers = {name: _import_tracker(name) for name in _TRACKERS if name in wanted}
        projects = {"wandb": wandb_project, "swanlab": swanlab_project}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            if "jsonl" in wanted:
                self._every_step.append(_Jsonl(self.run_dir / METRICS_FILE, start_step))
            if "tensorboard" in wanted:
                self._periodic.append(_TensorBoard(self.run_dir / "tensorboard", start_step))
            for name, module in trackers.items():
                self._periodic.append(
                    _Tracker(
                        name,
                        module,
                        self.run_dir,
                        projects[name],
                        experiment_name,
                        config,
                        start_step,
                    )
                )
            if "console" in wanted:
                self._console = _Console(
                    self._stream, total_steps, start_step, experiment_name, console_interval_s
                )
                self._every_step.append(self._console)
        except BaseException:
            self.close()
            raise

    def log(self, step: int, metrics: Mapping[str, SupportsFloat]) -> None:
        """Record ``metrics`` (numbers or 0-d tensors) as the values at ``step``.

        Each key must start with one of `NAMESPACES`. Steps must not go back
        (the same step may be logged twice, e.g. training then evaluation
        metrics), and a resumed run's steps must come after ``start_step``.
        NaN and infinities are recorded as they are: what to do about them is
        the runner's decision. Nothing is written when any metric is invalid.
        """
        if self._closed:
            raise RuntimeError("MetricLogger.log: the logger is closed")
        first = self.start_step + 1 if self.start_step > 0 else 0
        if step < first or (self._last_step is not None and step < self._last_step):
            after = (
                f"start_step {self.start_step}"
                if self._last_step is None
                else f"the last logged step {self._last_step}"
            )
            raise ValueError(
                f"MetricLogger.log: step {step} comes before {after}; steps must not go back"
            )
        values = {key: _as_float(key, value) for key, value in metrics.items()}
        self._last_step = step
        for backend in self._every_step:
            backend.write(step, values)
        if self._periodic:
            if step % self.log_every == 0 or step == self.total_steps:
                due = values
            else:
                due = {key: value for key, value in values.items() if key.startswith("eval/")}
            if due:
                for backend in self._periodic:
                    backend.write(step, due)

    def print(self, message: str) -> None:
        """Print a line to the console stream without breaking the progress bar."""
        if self._console is not None:
            self._console.print(message)
        else:
            print(message, file=self._stream, flush=True)

    def close(self) -> None:
        """Flush and close every backend (again: nothing)."""
        if self._closed:
            return
        self._closed = True
        for backend in [*self._every_step, *self._periodic]:
            backend.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _as_float(key: str, value: SupportsFloat) -> float:
    if not key.startswith(NAMESPACES) or key.endswith("/"):
        raise ValueError(
            f"metric {key!r}: expected a name under one of the namespaces "
            f"{', '.join(NAMESPACES)} ({_suggest_key(key)})"
        )
    shape = getattr(value, "shape", ())
    if isinstance(value, str | bytes) or tuple(shape) != ():
        described = f"shape {tuple(shape)}" if tuple(shape) else repr(value)
        raise ValueError(
            f"metric {key!r}: expected a number or a 0-d tensor, got {type(value).__name__} "
            f"{described}"
        )
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(
            f"metric {key!r}: expected a number or a 0-d tensor, got {type(value).__name__} "
            f"({error})"
        ) from None


def _suggest_key(key: str) -> str:
    """'did you mean 'reward/mean'?' for 'rewards/mean'; an example for a bare name."""
    prefix, slash, name = key.partition("/")
    if slash and name:
        close = difflib.get_close_matches(prefix + "/", NAMESPACES, n=1)
        if close:
            return f"did you mean {close[0] + name!r}?"
    return f"e.g. 'train/{name or 'loss'}'"


# ---------------------------------------------------------------------------
# Backends


class _Backend(Protocol):
    def write(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class _Jsonl:
    """Appends one line per call, flushed at once, so a crash loses no finished step."""

    def __init__(self, path: Path, start_step: int) -> None:
        if start_step > 0 and path.exists():
            kept = [line for line, record in _read_lines(path) if record["step"] <= start_step]
            partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
            with partial.open("w", encoding="utf-8") as file:
                file.writelines(line + "\n" for line in kept)
                file.flush()
                os.fsync(file.fileno())
            os.replace(partial, path)  # a crash here leaves the old file or the new, never half
        self._file = path.open("a" if start_step > 0 else "w", encoding="utf-8")

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class _TensorBoard:
    """One scalar per key; a resumed writer hides the events after ``start_step``."""

    def __init__(self, log_dir: Path, start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step makes TensorBoard drop the earlier run's events from this step on.
        purge_step = start_step + 1 if start_step > 0 else None
        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


def _import_tracker(name: str) -> Any:
    """The ``wandb`` or ``swanlab`` module; a clear error naming the fix when it is missing."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != name:
            raise
        raise ModuleNotFoundError(
            f'logger.backends includes "{name}" but the {name} package is not installed: '
            f'run {_TRACKERS[name][0]}, or remove "{name}" from logger.backends',
            name=name,
        ) from None


class _Tracker:
    """A wandb run or SwanLab experiment that a resumed run continues, sent only the steps
    it does not have yet.

    ``run_dir/<name>_run.json`` holds ``{"id": ..., "step": ...}``: the run's id
    and the last step it received, rewritten (atomically) after every step.
    A resumed logger (``start_step > 0``) passes that id with
    ``resume="allow"`` and drops the steps up to that last one: the trackers
    refuse a step lower than one they have, and the steps a resumed run replays
    since its checkpoint were logged by the first attempt.
    """

    def __init__(
        self,
        name: str,
        module: Any,
        run_dir: Path,
        project: str | None,
        experiment: str,
        config: Mapping[str, Any] | None,
        start_step: int,
    ) -> None:
        self._name = name
        self._state_path = run_dir / f"{name}_run.json"
        previous = _read_tracker_state(name, self._state_path) if start_step > 0 else None
        if start_step > 0 and previous is None:
            run = _TRACKERS[name][1]
            print(
                f"{name}: {self._state_path} does not exist (no {run} was logged to from this "
                f"run directory): the resumed run starts a new {run} at step {start_step + 1}",
                file=sys.stderr,
                flush=True,
            )
        settings: dict[str, Any] = {
            "project": project,
            "name": experiment,
            # wandb makes its own wandb/ folder in dir; swanlab writes straight into log_dir.
            **(
                {"log_dir": str(run_dir / "swanlab")}
                if name == "swanlab"
                else {"dir": str(run_dir)}
            ),
            "config": dict(config or {}),
        }
        if previous is not None:
            settings.update(id=previous[0], resume="allow")
        self._run = module.init(**settings)
        self._id = str(self._run.id)
        # Steps up to this one are in the tracker already; -1: none (step 0 may come).
        self._have_through = previous[1] if previous is not None else -1
        self._last_sent: int | None = None
        self._save(self._have_through)

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        if step <= self._have_through:
            return
        self._run.log(dict(metrics), step=step)
        if step != self._last_sent:
            self._last_sent = step
            self._save(step)

    def close(self) -> None:
        self._run.finish()

    def _save(self, step: int) -> None:
        partial = self._state_path.with_name(f".{self._state_path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps({"id": self._id, "step": step}) + "\n", encoding="utf-8")
        os.replace(partial, self._state_path)


def _read_tracker_state(name: str, path: Path) -> tuple[str, int] | None:
    """(run id, last step) from a `WANDB_RUN_FILE` or `SWANLAB_RUN_FILE`; None when the run
    dir has none."""
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        run_id, step = state["id"], state["step"]
        if not isinstance(run_id, str) or not isinstance(step, int):
            raise ValueError('expected {"id": "<run id>", "step": <int>}')
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{path}: not a {name} run record ({error}); delete it to start a new {name} run"
        ) from None
    return run_id, step


class _Console:
    """The progress bar: redrawn in place on a terminal, a line every few seconds elsewhere."""

    def __init__(
        self, stream: TextIO, total: int, start: int, label: str, interval_s: float
    ) -> None:
        from tqdm import tqdm  # type: ignore[import-untyped]

        self._tqdm = tqdm
        self._stream = stream
        self._total, self._start, self._label = total, start, label
        self._interval_s = interval_s
        self._headline: dict[str, str] = {}
        self._step = start
        self._started = time.monotonic()
        self._last_line: float | None = None  # when the last plain line was printed
        self._printed_step: int | None = None
        isatty = getattr(stream, "isatty", None)
        self._bar: Any = None
        if isatty is not None and isatty():
            self._bar = tqdm(
                total=total,
                initial=start,
                desc=label,
                unit="step",
                file=stream,
                dynamic_ncols=True,
                leave=True,
            )

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, label in HEADLINE_METRICS.items():
            if key not in metrics:
                continue
            if key in _SHOWN_WHEN_NOT_ZERO and metrics[key] == 0:
                self._headline.pop(label, None)
            else:
                self._headline[label] = _headline_number(key, metrics[key])
        self._step = step
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(), refresh=False)
            self._bar.update(step - self._bar.n)  # redraws at most every mininterval (0.1 s)
            return
        now = time.monotonic()
        if self._last_line is None or now - self._last_line >= self._interval_s:
            self._print_line(now)

    def print(self, message: str) -> None:
        if self._bar is not None:
            self._tqdm.write(message, file=self._stream)
        else:
            print(message, file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(), refresh=False)
            self._bar.close()
        elif self._printed_step != self._step:
            self._print_line(time.monotonic())

    def _print_line(self, now: float) -> None:
        line = self._tqdm.format_meter(
            n=self._step,
            total=self._total,
            elapsed=now - self._started,
            prefix=self._label,
            ascii=True,
            unit="step",
            postfix=self._postfix() or None,
            initial=self._start,
        )
        print(line, file=self._stream, flush=True)
        self._last_line, self._printed_step = now, self._step

    def _postfix(self) -> str:
        shown = [label for label in HEADLINE_METRICS.values() if label in self._headline]
        return ", ".join(f"{label}={self._headline[label]}" for label in shown)


def _headline_number(key: str, value: float) -> str:
    if key == "perf/tokens_per_s" and math.isfinite(value):
        return f"{value:.0f}"
    if key == "reward/failed_frac" and math.isfinite(value):
        return "<1%" if 0 < value < 0.005 else f"{value:.0%}"
    return f"{value:.4g}"


def logger_for_run(config: Config, run_dir: Path, start_step: int = 0) -> MetricLogger:
    """The `MetricLogger` a runner writes ``run_dir``'s metrics with, from ``config.logger``;
    a wandb run or SwanLab experiment gets the whole resolved config."""
    from rlshell.config import config_to_dict

    return MetricLogger(
        run_dir,
        config.logger.backends,
        config.runner.max_steps,
        start_step=start_step,
        log_every=config.logger.log_every,
        wandb_project=config.logger.wandb_project,
        swanlab_project=config.logger.swanlab_project,
        experiment_name=config.runner.experiment_name,
        config=config_to_dict(config) if set(_TRACKERS) & set(config.logger.backends) else None,
    )


def plot_run(run_dir: Path, keys: Sequence[str] = ("reward/mean", "eval/accuracy")) -> None:
    """``run_dir/learning_curve.png`` from its metrics file (if any); says what it did."""
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.is_file():
        return
    try:
        out = plot_learning_curve(metrics_path, run_dir / "learning_curve.png", keys)
    except ValueError as error:
        print(f"no learning curve: {error}", flush=True)
    else:
        print(f"learning curve: {out}", flush=True)
