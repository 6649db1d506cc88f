"""Real runs of `python -m rlshell.train` on Ray: the probe runner, extensions in workers, Ctrl-C.

Each test starts the CLI in a subprocess with its own Ray temp dir (RAY_TMPDIR),
so it can check afterwards that no Ray process of that run is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import launcher

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_EXT = ROOT / "examples" / "extension"
# A reasoning run on one actor rank that also generates, beside the reward worker: for tests
# of what does not depend on sharding (logging, rewards, the Hub), one process fewer to start
# than configs/grpo.py's two ranks (45 CPU-seconds against 60 for three tiny steps).
ONE_ACTOR_RANK = [
    'cluster.component_placement={"actor,rollout": "0:0", "reward": "0"}',
    # One rank in its model's precision is not sharded: no wrap policy to tune.
    "actor.fsdp_config.wrap_policy.min_num_params=0",
]


@pytest.fixture
def ray_tmpdir() -> Iterator[Path]:
    # Ray's socket paths must stay under 107 characters: a short directory in /tmp.
    path = Path(tempfile.mkdtemp(prefix="rl", dir="/tmp"))
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def cli_env(ray_tmpdir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RLSHELL_EXT_MODULE"}
    env.update(RAY_TMPDIR=str(ray_tmpdir), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def train(
    *args: str, env: dict[str, str], timeout: float = 180, shared_ray: bool = True
) -> subprocess.CompletedProcess[str]:
    """``python -m rlshell.train ARGS`` from the repository root, through `tests.launcher`:
    forked from the warm interpreter and on this pytest process's Ray cluster where that
    cannot change the run (``shared_ray=False``: a Ray of its own, for tests of Ray's start,
    shutdown or leftovers)."""
    return launcher.run(
        [sys.executable, "-m", "rlshell.train", *args],
        env=env,
        timeout=timeout,
        shared_ray=shared_ray,
    )


def ray_processes_using(path: Path) -> list[str]:
    """Command lines of live processes that mention ``path`` (Ray's daemons name their temp dir)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(path) in cmdline and str(os.getpid()) != proc.name:
            found.append(cmdline[:200])
    return found


def wait_for_no_ray_processes(path: Path, timeout: float = 20.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := ray_processes_using(path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@pytest.mark.slow
def test_a_probe_run_places_every_worker_as_planned_with_extensions_loaded(
    ray_tmpdir: Path, tmp_path: Path
) -> None:
    result = train(
        "configs/grpo.py",
        "runner.runner_type=probe",
        "runner.max_steps=3",
        f"runner.output_dir={tmp_path}",
        env=cli_env(
            ray_tmpdir, RLSHELL_EXT_MODULE="rlshell_example_ext", PYTHONPATH=str(EXAMPLE_EXT)
        ),
        timeout=240,
        shared_ray=False,  # its Ray's processes are checked gone at the end
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "probe step 3/3" in result.stdout
    probe = json.loads((tmp_path / "grpo" / "probe.json").read_text())
    assert set(probe["reports"]) == {"actor", "rollout", "reward"}
    actor = probe["reports"]["actor"]
    assert [report["env"]["RANK"] for report in actor] == ["0", "1"]
    assert all(report["extensions_loaded"] == ["rlshell_example_ext"] for report in actor)
    assert len({report["pid"] for report in actor}) == 2
    assert (tmp_path / "grpo" / "placement.json").is_file()
    assert (tmp_path / "grpo" / "config.json").is_file()
    assert not (tmp_path / "grpo" / "run.lock").exists(), "the lock is released at the end"
    assert wait_for_no_ray_processes(ray_tmpdir) == []


@pytest.mark.slow
def test_overwrite_clears_the_old_run_before_the_new_one_starts(
    ray_tmpdir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "grpo"
    (run_dir / "checkpoints" / "global_step_4").mkdir(parents=True)
    (run_dir / "checkpoints" / "global_step_4" / "trainer_state.json").write_text("{}")
    (run_dir / "tensorboard").mkdir()
    (run_dir / "tensorboard" / "events.out.tfevents.1.old").write_bytes(b"\0")
    (run_dir / "metrics.jsonl").write_text('{"step": 4}\n')
    # Through the Python API (the command line's --overwrite is the same keyword).
    script = (
        "import sys; from rlshell.api import train; "
        "result = train('configs/grpo.py', sys.argv[1:], overwrite=True); print(result.run_dir)"
    )
    args = ["runner.runner_type=probe", "runner.max_steps=2", f"runner.output_dir={tmp_path}"]
    result = launcher.run(
        [sys.executable, "-c", script, *args],
        env=cli_env(ray_tmpdir),
        timeout=240,
        shared_ray=False,  # its Ray's processes are checked gone at the end
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[0] == (
        f"--overwrite: removed the run in {run_dir} (a checkpoint of step 4, metrics to step 4, "
        "tensorboard/)"
    )
    assert result.stdout.splitlines()[-1] == str(run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "config.json",
        "placement.json",
        "probe.json",
    ]
    assert wait_for_no_ray_processes(ray_tmpdir) == []


def _deaf_to_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


@pytest.mark.slow
def test_ctrl_c_shuts_ray_down_and_exits_130(ray_tmpdir: Path, tmp_path: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlshell.train",
            "configs/grpo.py",
            "runner.runner_type=probe",
            "runner.max_steps=1000000",
            f"runner.output_dir={tmp_path}",
        ],
        cwd=ROOT,
        env=cli_env(ray_tmpdir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Started the way some launchers start jobs: SIGINT ignored and blocked. The
        # command line must still hear Ctrl-C.
        preexec_fn=_deaf_to_ctrl_c,
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 180
        for line in process.stdout:
            if line.startswith("probe step 2/"):
                break
            assert time.monotonic() < deadline, "the probe run never reached step 2"
        assert ray_processes_using(ray_tmpdir), "Ray should be running during the run"
        process.send_signal(signal.SIGINT)
        # Generous: shutting Ray down on a loaded 2-core machine can take tens of seconds.
        _, stderr = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "interrupted: Ray was shut down" in stderr
    assert not (tmp_path / "grpo" / "run.lock").exists(), "Ctrl-C releases the lock"
    assert wait_for_no_ray_processes(ray_tmpdir) == []


def test_a_placement_the_runner_cannot_run_is_named_before_ray_starts(
    ray_tmpdir: Path, tmp_path: Path
) -> None:
    result = train(
        "configs/grpo.py",
        "runner.runner_type=embodied",
        "actor.model.model_type=bandit_mlp",
        "actor.model.category=embodied",
        "env.env_type=two_armed_bandit",
        "algorithm.adv_type=gae",
        'cluster.component_placement={"actor,rollout": "0:0-1", "env": "0"}',
        f"runner.output_dir={tmp_path}",
        env=cli_env(
            ray_tmpdir, RLSHELL_EXT_MODULE="rlshell_example_ext", PYTHONPATH=str(EXAMPLE_EXT)
        ),
        shared_ray=False,  # that Ray never starts is checked at the end
    )
    assert result.returncode == 2
    problems = result.stderr.splitlines()[1:]
    assert (
        "  - cluster.component_placement: the embodied PPO runner places env, rollout and "
        'actor either all under one key (collocated, e.g. {"actor,rollout,env": "0:0-1"}) or '
        'each under its own (hybrid, pipelined, e.g. {"actor": "0:0-1", "rollout": "0:0", '
        "\"env\": \"0:0\"}); 'actor,rollout' groups two of them apart from 'env'"
    ) in problems
    # grpo.py's reasoning settings, which an embodied run does not read, are refused too.
    assert any(line.startswith("  - reward.num_processes: ") for line in problems)
    assert ray_processes_using(ray_tmpdir) == []


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stop_ray_processes_using(path: Path) -> None:
    """Stop one `ray start` cluster by its temp dir (`ray stop` would stop every cluster here)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
                if str(path) in cmdline:
                    os.kill(int(proc.name), sig)
            except (OSError, ProcessLookupError):
                continue
        if not wait_for_no_ray_processes(path, timeout=10):
            return


@pytest.mark.slow
def test_attaching_to_a_cluster_started_with_ray_start(ray_tmpdir: Path, tmp_path: Path) -> None:
    port = free_port()
    ray = Path(sys.executable).parent / "ray"
    env = cli_env(ray_tmpdir)
    head = subprocess.run(
        [
            str(ray),
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=2",
            f"--temp-dir={ray_tmpdir}",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert head.returncode == 0, head.stdout + head.stderr
        address = f"127.0.0.1:{port}"
        common = ["configs/grpo.py", f"cluster.address={address}", f"runner.output_dir={tmp_path}"]
        dry = train(*common, "--dry-run", env=env)
        assert dry.returncode == 0, dry.stderr
        assert "cluster: 1 CPU-only node, 2 CPUs" in dry.stdout
        too_many = train(
            *common,
            "runner.runner_type=probe",
            "cluster.num_nodes=2",
            "cluster.startup_timeout_s=2",
            env=env,
        )
        assert too_many.returncode == 1
        assert "cluster.num_nodes: expected 2 nodes" in too_many.stderr
        probe = train(*common, "runner.runner_type=probe", "runner.max_steps=2", env=env)
        assert probe.returncode == 0, probe.stdout + probe.stderr
        assert "probe step 2/2" in probe.stdout
        assert ray_processes_using(ray_tmpdir), "the attached cluster must outlive the driver"
    finally:
        stop_ray_processes_using(ray_tmpdir)
