"""The metric logger: each backend's output read back, resuming, and the errors it raises."""

from __future__ import annotations

import doctest
import io
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import rlshell.metrics
from rlshell.metrics import (
    METRICS_FILE,
    NAMESPACES,
    WANDB_RUN_FILE,
    MetricLogger,
    merge_rank_metrics,
    plot_learning_curve,
    read_metrics,
    tokens_per_second,
)
from tests.shell.wandb_records import offline_runs


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """(step, value) per tag from a run's TensorBoard events, as TensorBoard would show them."""
    from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
        EventAccumulator,
    )

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return {
        tag: [(event.step, event.value) for event in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def log_steps(logger: MetricLogger, steps: range, scale: float = 1.0) -> None:
    for step in steps:
        logger.log(step, {"reward/mean": scale * step, "train/loss": -step})


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


# ---------------------------------------------------------------------------
# jsonl


def test_jsonl_records_every_step_and_reads_back(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, ["jsonl"], total_steps=3, log_every=2) as logger:
        logger.log(1, {"reward/mean": torch.tensor(0.5), "train/kl": 2, "perf/x": float("nan")})
        logger.log(2, {"eval/accuracy": 0.75})
        logger.log(2, {"time/step_s": 1.5})  # the same step again: a second record
    records = read_metrics(tmp_path / METRICS_FILE)
    assert [r["step"] for r in records] == [1, 2, 2]
    assert records[0]["reward/mean"] == 0.5
    assert records[0]["train/kl"] == 2.0
    assert math.isnan(records[0]["perf/x"])
    assert records[1:] == [{"step": 2, "eval/accuracy": 0.75}, {"step": 2, "time/step_s": 1.5}]


def test_each_line_is_flushed_before_close(tmp_path: Path) -> None:
    logger = MetricLogger(tmp_path, ["jsonl"], total_steps=5)
    logger.log(1, {"reward/mean": 1.0})
    assert read_metrics(tmp_path / METRICS_FILE) == [{"step": 1, "reward/mean": 1.0}]
    logger.close()
    logger.close()  # closing twice is harmless
    with pytest.raises(RuntimeError, match="closed"):
        logger.log(2, {"reward/mean": 2.0})


def test_resume_drops_records_after_start_step(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, ["jsonl"], total_steps=5) as logger:
        log_steps(logger, range(1, 6))
    with MetricLogger(tmp_path, ["jsonl"], total_steps=5, start_step=3) as logger:
        log_steps(logger, range(4, 6), scale=10.0)
    with MetricLogger(tmp_path / "uninterrupted", ["jsonl"], total_steps=5) as logger:
        log_steps(logger, range(1, 4))
        log_steps(logger, range(4, 6), scale=10.0)
    records = read_metrics(tmp_path / METRICS_FILE)
    assert [(r["step"], r["reward/mean"]) for r in records] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
        (5, 50.0),
    ]
    resumed = (tmp_path / METRICS_FILE).read_bytes()
    assert resumed == (tmp_path / "uninterrupted" / METRICS_FILE).read_bytes()
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []


def test_a_new_run_starts_the_file_afresh(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, ["jsonl"], total_steps=5) as logger:
        log_steps(logger, range(1, 6))
    with MetricLogger(tmp_path, ["jsonl"], total_steps=5) as logger:
        log_steps(logger, range(1, 2))
    assert [r["step"] for r in read_metrics(tmp_path / METRICS_FILE)] == [1]


def test_a_line_cut_short_by_a_crash_is_skipped_and_resume_repairs_it(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1, "reward/mean": 0.5}\n{"step": 2, "reward/me', encoding="utf-8")
    assert read_metrics(path) == [{"step": 1, "reward/mean": 0.5}]
    with MetricLogger(tmp_path, ["jsonl"], total_steps=5, start_step=1) as logger:
        logger.log(2, {"reward/mean": 0.25})
    assert read_metrics(path) == [
        {"step": 1, "reward/mean": 0.5},
        {"step": 2, "reward/mean": 0.25},
    ]


def test_a_damaged_line_before_the_last_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1}\n{"step": \n{"step": 3}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a metrics record"):
        read_metrics(path)


# ---------------------------------------------------------------------------
# Validation


def test_a_key_outside_the_namespaces_names_the_key_and_the_namespaces(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, ["jsonl"], total_steps=5) as logger:
        with pytest.raises(ValueError, match="metric 'loss'") as error:
            logger.log(1, {"reward/mean": 1.0, "loss": 0.1})
        for namespace in NAMESPACES:
            assert namespace in str(error.value)
        with pytest.raises(ValueError, match="metric 'train/'"):
            logger.log(1, {"train/": 0.1})
        with pytest.raises(ValueError, match="did you mean 'reward/mean'"):
            logger.log(1, {"rewards/mean": 0.1})
        logger.log(1, {"train/actor/loss": 0.1})  # names may nest under the namespace
    # Nothing of the refused calls was written.
    assert read_metrics(tmp_path / METRICS_FILE) == [{"step": 1, "train/actor/loss": 0.1}]


@pytest.mark.parametrize(
    ("value", "says"),
    [(torch.ones(2), r"Tensor shape \(2,\)"), ("0.5", "str '0.5'"), (None, "NoneType")],
)
def test_a_value_that_is_not_a_number_is_refused(tmp_path: Path, value: Any, says: str) -> None:
    with (
        MetricLogger(tmp_path, ["jsonl"], total_steps=5) as logger,
        pytest.raises(ValueError, match=f"metric 'train/loss': expected a number.*{says}"),
    ):
        logger.log(1, {"train/loss": value})


def test_steps_must_not_go_back(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, ["jsonl"], total_steps=9, start_step=3) as logger:
        with pytest.raises(ValueError, match="step 3 comes before start_step 3"):
            logger.log(3, {"train/loss": 1.0})
        logger.log(5, {"train/loss": 1.0})
        with pytest.raises(ValueError, match="step 4 comes before the last logged step 5"):
            logger.log(4, {"train/loss": 1.0})


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"backends": ["console", "csv"]}, "logger.backends: unknown backend 'csv'"),
        ({"total_steps": 0}, "total_steps: expected an integer ≥ 1, got 0"),
        ({"start_step": 11}, r"start_step: expected an integer in \[0, total_steps=10\]"),
        ({"log_every": 0}, "logger.log_every: expected an integer ≥ 1, got 0"),
    ],
)
def test_bad_settings_are_refused(tmp_path: Path, kwargs: dict[str, Any], says: str) -> None:
    arguments: dict[str, Any] = {"backends": ["jsonl"], "total_steps": 10, **kwargs}
    with pytest.raises(ValueError, match=says):
        MetricLogger(tmp_path, **arguments)


# ---------------------------------------------------------------------------
# TensorBoard


def test_tensorboard_scalars_read_back_every_log_every_steps(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, ["tensorboard"], total_steps=5, log_every=2) as logger:
        log_steps(logger, range(1, 3))
        logger.log(3, {"train/loss": -3.0, "eval/accuracy": 0.5})  # eval/ is never skipped
        log_steps(logger, range(4, 6))
    found = scalars(tmp_path)
    assert [step for step, _ in found["reward/mean"]] == [2, 4, 5]  # 5: the last step
    assert found["train/loss"] == [(2, -2.0), (4, -4.0), (5, -5.0)]
    assert found["eval/accuracy"] == [(3, 0.5)]


def test_tensorboard_hides_the_replayed_steps_after_a_resume(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, ["tensorboard"], total_steps=5) as logger:
        log_steps(logger, range(1, 6))
    with MetricLogger(tmp_path, ["tensorboard"], total_steps=5, start_step=3) as logger:
        log_steps(logger, range(4, 6), scale=10.0)
    assert scalars(tmp_path)["reward/mean"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0)]


# ---------------------------------------------------------------------------
# wandb


def test_wandb_missing_names_the_fix_and_touches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed, even where it is
    run_dir = tmp_path / "run"
    with pytest.raises(ModuleNotFoundError) as error:
        MetricLogger(run_dir, ["jsonl", "wandb"], total_steps=5)
    assert "make install" in str(error.value)
    assert 'remove "wandb" from logger.backends' in str(error.value)
    assert not run_dir.exists()


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """A stand-in wandb module recording the calls made to it."""
    calls: list[tuple[str, Any]] = []

    class Run:
        id = "fake0001"

        def log(self, metrics: dict[str, float], step: int) -> None:
            calls.append(("log", (step, metrics)))

        def finish(self) -> None:
            calls.append(("finish", None))

    def init(**kwargs: Any) -> Run:
        calls.append(("init", kwargs))
        return Run()

    module = ModuleType("wandb")
    module.init = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return calls


def test_wandb_gets_its_run_settings_and_the_periodic_steps(
    tmp_path: Path, fake_wandb: list[tuple[str, Any]]
) -> None:
    with MetricLogger(
        tmp_path,
        ["wandb"],
        total_steps=4,
        log_every=2,
        wandb_project="rlstack",
        experiment_name="grpo",
        config={"lr": 0.1},
    ) as logger:
        log_steps(logger, range(1, 5))
    (init, settings), *logs, finish = fake_wandb
    assert init == "init"
    assert settings == {
        "project": "rlstack",
        "name": "grpo",
        "dir": str(tmp_path),
        "config": {"lr": 0.1},
    }
    assert [step for _, (step, _) in logs] == [2, 4]
    assert finish == ("finish", None)


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real wandb package, offline, its settings and caches kept out of the home dir."""
    pytest.importorskip("wandb", reason="wandb is installed by `make install`")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # leave pytest's capture of stdout alone
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_real_wandb_offline_run_holds_the_config_and_the_periodic_steps(
    tmp_path: Path, offline_wandb: None
) -> None:
    run_dir = tmp_path / "run"
    config = {"actor": {"optim": {"lr": 0.001}}, "runner": {"max_steps": 4}}
    with MetricLogger(
        run_dir,
        ["wandb"],
        total_steps=4,
        log_every=2,
        wandb_project="rlstack-test",
        experiment_name="grpo",
        config=config,
    ) as logger:
        log_steps(logger, range(1, 4))
        logger.log(3, {"eval/accuracy": 0.25})  # an evaluation goes out whatever the step
        log_steps(logger, range(4, 5))
    (run,) = offline_runs(run_dir)
    assert (run.project, run.name) == ("rlstack-test", "grpo")
    assert run.config == config
    assert run.history == [
        {"step": 2, "reward/mean": 2.0, "train/loss": -2.0},
        {"step": 3, "eval/accuracy": 0.25},
        {"step": 4, "reward/mean": 4.0, "train/loss": -4.0},
    ]
    state = json.loads((run_dir / WANDB_RUN_FILE).read_text())
    assert state == {"id": run.run_id, "step": 4}


def test_real_wandb_resume_continues_the_run_without_the_replayed_steps(
    tmp_path: Path, offline_wandb: None
) -> None:
    # The first attempt logged steps 1-5 and stopped; its checkpoint is at step 3.
    with MetricLogger(tmp_path, ["wandb", "jsonl"], total_steps=8) as logger:
        log_steps(logger, range(1, 6))
    with MetricLogger(tmp_path, ["wandb", "jsonl"], total_steps=8, start_step=3) as logger:
        log_steps(logger, range(4, 9), scale=10.0)
    first, resumed = offline_runs(tmp_path)
    assert resumed.run_id == first.run_id
    assert [row["step"] for row in first.history] == [1, 2, 3, 4, 5]
    # Steps 4 and 5 are in W&B already: it keeps the first values, the jsonl file the new.
    assert resumed.history == [
        {"step": s, "reward/mean": 10.0 * s, "train/loss": -s} for s in (6, 7, 8)
    ]
    assert [r["reward/mean"] for r in read_metrics(tmp_path / METRICS_FILE)][3:] == [
        40.0,
        50.0,
        60.0,
        70.0,
        80.0,
    ]
    assert json.loads((tmp_path / WANDB_RUN_FILE).read_text())["step"] == 8


def test_a_fresh_run_in_the_same_directory_starts_a_new_wandb_run(
    tmp_path: Path, offline_wandb: None
) -> None:
    for _ in range(2):
        with MetricLogger(tmp_path, ["wandb"], total_steps=2) as logger:
            log_steps(logger, range(1, 3))
    first, second = offline_runs(tmp_path)
    assert first.run_id != second.run_id
    assert [row["step"] for row in second.history] == [1, 2]


def test_a_resume_without_a_wandb_run_file_says_it_starts_a_new_run(
    tmp_path: Path, offline_wandb: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with MetricLogger(tmp_path, ["wandb"], total_steps=4, start_step=2) as logger:
        log_steps(logger, range(3, 5))
    assert "the resumed run starts a new W&B run at step 3" in capsys.readouterr().err
    (run,) = offline_runs(tmp_path)
    assert [row["step"] for row in run.history] == [3, 4]


def test_a_damaged_wandb_run_file_is_named_on_resume(tmp_path: Path, offline_wandb: None) -> None:
    (tmp_path / WANDB_RUN_FILE).write_text('{"id": 3}')
    with pytest.raises(ValueError, match=r"wandb_run.json: not a wandb run record .*delete it"):
        MetricLogger(tmp_path, ["wandb"], total_steps=4, start_step=2)


# ---------------------------------------------------------------------------
# Console


def test_console_off_a_terminal_prints_few_plain_lines_with_the_headline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with MetricLogger(tmp_path, ["console"], total_steps=1000, console_interval_s=3600) as logger:
        for step in range(1, 1001):
            metrics = {"reward/mean": 0.5, "train/kl": 0.0123, "perf/tokens_per_s": 812.4}
            logger.log(step, {**metrics, "train/loss": 1.0})
        logger.log(1000, {"eval/accuracy": 0.75})
        logger.print("evaluated")
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    # The first step at once, the message, the last step at close: nothing in between.
    assert len(lines) == 3, lines
    assert lines[0].startswith("run:")
    assert "1/1000" in lines[0]
    assert lines[1] == "evaluated"
    assert "1000/1000" in lines[2]
    assert "reward=0.5, kl=0.0123, tok/s=812, acc=0.75" in lines[2]
    assert "\r" not in captured.err


def test_console_shows_the_failed_reward_share_only_while_it_is_not_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with MetricLogger(tmp_path, ["console"], total_steps=4, console_interval_s=0) as logger:
        for step, failed in enumerate([0.0, 0.125, 0.001, 0.0], start=1):
            logger.log(step, {"reward/mean": 0.5, "reward/failed_frac": failed})
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4, lines
    assert lines[0].endswith("reward=0.5]")
    assert lines[1].endswith("reward=0.5, fail=12%]")
    assert lines[2].endswith("reward=0.5, fail=<1%]")
    assert lines[3].endswith("reward=0.5]")


def test_console_on_a_terminal_redraws_one_bar(tmp_path: Path) -> None:
    stream = FakeTTY()
    with MetricLogger(
        tmp_path, ["console"], total_steps=4, start_step=1, stream=stream, experiment_name="grpo"
    ) as logger:
        for step in range(2, 5):
            logger.log(step, {"reward/mean": step / 4, "eval/accuracy": 0.5})
        logger.print("a message above the bar")
    text = stream.getvalue()
    assert "\r" in text
    assert "a message above the bar\n" in text
    final = text.rsplit("\r", 1)[-1]
    assert final.startswith("grpo: 100%")
    assert "4/4" in final
    assert "reward=1, acc=0.5" in final


def test_print_without_a_console_backend_still_prints(tmp_path: Path) -> None:
    stream = io.StringIO()
    with MetricLogger(tmp_path, ["jsonl"], total_steps=2, stream=stream) as logger:
        logger.print("hello")
    assert stream.getvalue() == "hello\n"


# ---------------------------------------------------------------------------
# Plotting and throughput


def test_plot_learning_curve_writes_a_png_of_the_keys_present(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, ["jsonl"], total_steps=5) as logger:
        log_steps(logger, range(1, 6))
    out = plot_learning_curve(tmp_path / METRICS_FILE, tmp_path / "plots" / "curve.png")
    assert out == tmp_path / "plots" / "curve.png"
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_plot_learning_curve_without_any_key_names_what_the_file_has(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, ["jsonl"], total_steps=5) as logger:
        logger.log(1, {"train/loss": 1.0})
    with pytest.raises(ValueError, match=r"none of the keys.*eval/accuracy.*has train/loss"):
        plot_learning_curve(tmp_path / METRICS_FILE, tmp_path / "curve.png")
    assert not (tmp_path / "curve.png").exists()


def test_tokens_per_second() -> None:
    assert tokens_per_second(1500, 0.5) == 3000.0
    with pytest.raises(ValueError, match="step_seconds: expected a positive number, got 0"):
        tokens_per_second(10, 0.0)
    with pytest.raises(ValueError, match="total_tokens: expected an integer ≥ 0, got -1"):
        tokens_per_second(-1, 1.0)


def test_docstring_examples_run() -> None:
    results = doctest.testmod(rlshell.metrics)
    assert results.attempted > 0
    assert results.failed == 0


def test_merge_rank_metrics_sums_counts_weights_episode_figures_and_keeps_the_slowest_time() -> (
    None
):
    merged = merge_rank_metrics(
        [
            {
                "env/episodes": 3.0,
                "env/steps": 100.0,
                "env/failures": 1.0,
                "env/episode_return": 10.0,
                "time/rollout": 2.0,
                "train/loss": 1.0,
            },
            {
                "env/episodes": 1.0,
                "env/steps": 100.0,
                "env/failures": 0.0,
                "env/episode_return": 30.0,
                "time/rollout": 5.0,
                "train/loss": 3.0,
            },
            # A worker whose episodes were all cut by a failure: its failures still count.
            {"env/episodes": 0.0, "env/steps": 100.0, "env/failures": 2.0},
        ]
    )
    assert merged == {
        "env/episodes": 4.0,
        "env/steps": 300.0,
        "env/failures": 3.0,
        "env/episode_return": 15.0,
        "time/rollout": 5.0,
        "train/loss": 2.0,
    }
