"""`tests/launcher.py` runs what a fresh interpreter would: the exit status, the streams, the
environment, the working directory and the arguments of a forked run are those of
``subprocess.run`` on the same command, and a run it cannot fork faithfully starts cold.

These runs start no Ray (``shared_ray=False``): only the fork is checked here; the shared
cluster is what every run of the shell tests joins. The last tests check the shared
cluster's workers, forked from the workers' zygote (`tests/worker_client.py`) or cold.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import launcher


def run(code: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = kwargs.pop("env", None) or dict(os.environ)
    return launcher.run(
        [sys.executable, "-c", code, "first", "second"],
        env=env,  # type: ignore[arg-type]
        shared_ray=False,
        timeout=60,
        **kwargs,  # type: ignore[arg-type]
    )


def forked_since(before: int) -> int:
    return sum(n for why, n in launcher.STATS.items() if why.startswith("forked")) - before


def forked_now() -> int:
    return forked_since(0)


def test_a_forked_run_has_the_exit_status_streams_and_arguments_of_a_fresh_one() -> None:
    before = forked_now()
    done = run(
        "import sys; print('out', sys.argv[1:]); print('err', file=sys.stderr); raise SystemExit(3)"
    )
    assert forked_since(before) == 1
    assert (done.returncode, done.stdout, done.stderr) == (3, "out ['first', 'second']\n", "err\n")


def test_an_uncaught_exception_exits_1_with_its_traceback_and_a_signal_is_negative() -> None:
    failed = run("raise ValueError('the message')")
    assert failed.returncode == 1
    assert "Traceback" in failed.stderr
    assert "ValueError: the message" in failed.stderr
    killed = run("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.returncode == -9


def test_stdin_environment_and_working_directory_are_the_runs(tmp_path: Path) -> None:
    env = {**os.environ, "RLSTACK_LAUNCHER_TEST": "set for this run"}
    done = launcher.run(
        [
            sys.executable,
            "-c",
            "import os, sys; print(sys.stdin.read().upper(), os.getcwd(), "
            "os.environ['RLSTACK_LAUNCHER_TEST'], sep='|')",
        ],
        env=env,
        cwd=tmp_path,
        input="read from stdin " * 10_000,  # more than a pipe holds
        shared_ray=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    text, cwd, value = done.stdout.rstrip("\n").split("|")
    assert text == "READ FROM STDIN " * 10_000
    assert (cwd, value) == (str(tmp_path), "set for this run")
    # Without input, stdin is the null device, as a run started by `subprocess.run` with
    # ``stdin=DEVNULL`` sees it.
    assert run("import sys; print(repr(sys.stdin.read()))").stdout == "''\n"


def test_the_hash_seed_of_a_fork_is_the_one_a_fresh_interpreter_with_seed_0_has() -> None:
    code = "print(hash('rlstack'))"
    fresh = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        check=True,
    )
    before = forked_now()
    forked = run(code, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert forked_since(before) == 1
    assert forked.stdout == fresh.stdout
    # Any other seed cannot be had by a fork: that run starts cold, with its own seed.
    other = run(code, env={**os.environ, "PYTHONHASHSEED": "1"})
    assert forked_since(before) == 1
    assert other.stdout != fresh.stdout


@pytest.mark.parametrize(
    ("name", "forked"),
    [
        ("OMP_NUM_THREADS", False),  # read by torch at import
        ("HF_HOME", False),  # read by huggingface_hub at import
        ("RLSTACK_LAUNCHER_TEST", True),  # read by nobody at import
    ],
)
def test_a_variable_read_at_import_that_differs_starts_the_run_cold(
    name: str, forked: bool
) -> None:
    before = forked_now()
    done = run(f"import os; print(os.environ[{name!r}])", env={**os.environ, name: "7"})
    assert done.stdout == "7\n"
    assert forked_since(before) == int(forked)


def test_a_variable_read_by_a_package_the_zygote_left_to_the_runs_does_not_stop_the_fork() -> None:
    """wandb reads ``WANDB_*`` when imported; the zygote does not import it (a run that logs
    to W&B does), so the fork meets the run's own values: it is forked."""
    assert "wandb" not in launcher.zygote().loaded
    env = {**os.environ, "WANDB_MODE": "offline"}
    assert launcher.warm_fork_keeps(env, launcher.SESSION_ENV, None, ["torch"]) == []
    # A zygote that had imported it could not fork that run faithfully.
    assert launcher.warm_fork_keeps(env, launcher.SESSION_ENV, None, ["wandb"]) == ["WANDB_MODE"]
    before = forked_now()
    code = "import os, sys; print('wandb' in sys.modules, os.environ['WANDB_MODE'])"
    done = run(code, env=env)
    assert done.stdout == "False offline\n"
    assert forked_since(before) == 1


def test_a_variable_the_workers_would_miss_keeps_the_run_off_the_shared_cluster() -> None:
    cluster = {"PATH": "/bin", "RAY_TMPDIR": "/tmp/a"}
    # What the cluster's workers get anyway (PYTHONPATH is forwarded by Cluster.worker_env),
    # or what no worker reads, does not matter; anything else would be hidden from them.
    assert launcher.shared_ray_hides({**cluster, "PYTHONPATH": "/x"}, cluster) == []
    assert launcher.shared_ray_hides({**cluster, "RAY_TMPDIR": "/tmp/b"}, cluster) == []
    # W&B's settings are the driver's (its metrics logger): the workers need none of them.
    assert launcher.shared_ray_hides({**cluster, "WANDB_MODE": "offline"}, cluster) == []
    assert launcher.shared_ray_hides({**cluster, "RLSHELL_TEST_FAULT": "kill"}, cluster) == [
        "RLSHELL_TEST_FAULT"
    ]


def test_a_run_ends_as_the_interpreter_ends_a_program() -> None:
    """Non-daemon threads joined, then ``atexit`` handlers, then the streams flushed; a
    message of ``SystemExit`` on stderr with status 1; an uncaught KeyboardInterrupt dies of
    SIGINT. (The fork then skips the interpreter's teardown of the zygote's modules.)"""
    ends = run(
        "import atexit, sys, threading, time\n"
        "atexit.register(lambda: print('atexit after the thread'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread'))).start()\n"
        "sys.stdout.write('unflushed ')\n"
        "raise SystemExit('the message')\n"
    )
    assert (ends.returncode, ends.stderr) == (1, "the message\n")
    assert ends.stdout == "unflushed thread\natexit after the thread\n"
    interrupted = run("raise KeyboardInterrupt")
    assert interrupted.returncode == -2
    assert "KeyboardInterrupt" in interrupted.stderr
    # A status over 255 is taken modulo 256, as the kernel does.
    assert run("raise SystemExit(257)").returncode == 1


def test_what_earlier_tests_left_in_the_environment_is_not_the_tests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A variable a library wrote to os.environ before this test (vllm's import, an engine
    built in this process) is inherited by the run's env, but the test did not choose it: it
    decides nothing. One the test sets itself decides as any other."""
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in launcher.SESSION_ENV
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")  # as `import vllm` does
    launcher.note_test_start()  # ... before this test started
    # (pytest's own PYTEST_CURRENT_TEST, which changed since the note, aside)
    inherited = {name: v for name, v in os.environ.items() if name != "PYTEST_CURRENT_TEST"}
    assert "TORCHINDUCTOR_COMPILE_THREADS" in launcher.left_over(inherited)
    assert launcher.warm_fork_keeps(inherited, launcher.SESSION_ENV) == []
    # The run does not get it (its own Ray's workers would start cold for it), nor anything
    # else earlier tests left: it gets the session's values back; the rest as it is.
    cleaned = launcher.as_the_session_had_it(inherited)
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in cleaned
    for name in set(inherited) | set(cleaned):
        if name in launcher.left_over(inherited):
            assert cleaned.get(name) == launcher.SESSION_ENV.get(name), name
        else:
            assert cleaned.get(name) == inherited.get(name), name
    # The test's own choice of the same variable counts, and the run gets it.
    chosen = {**inherited, "TORCHINDUCTOR_COMPILE_THREADS": "2"}
    assert launcher.as_the_session_had_it(chosen)["TORCHINDUCTOR_COMPILE_THREADS"] == "2"
    assert launcher.warm_fork_keeps(chosen, launcher.SESSION_ENV) == [
        "TORCHINDUCTOR_COMPILE_THREADS"
    ]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # set by the test, after it started
    assert launcher.warm_fork_keeps(dict(os.environ), launcher.SESSION_ENV) == ["HF_HUB_OFFLINE"]


# ------------------------------------------------------------------ the shared cluster's workers


# Ray's default priority for the workers a raylet starts (ray_config_def.h: worker_niceness).
RAY_WORKER_NICENESS = int(os.environ.get("RAY_worker_niceness", "15"))  # noqa: SIM112 (Ray's name)


def _worker_facts(env_vars: dict[str, str]) -> tuple[dict[str, object], int]:
    """What a worker of the shared cluster started with ``env_vars`` reports of itself, and
    its pid once Ray has killed it (gone or not)."""
    import ray

    @ray.remote(num_cpus=0.25, runtime_env={"env_vars": env_vars})
    class Probe:
        def facts(self) -> dict[str, object]:
            import torch

            return {
                "pid": os.getpid(),
                "parent": os.getppid(),
                "threads": torch.get_num_threads(),
                "env": {name: os.environ.get(name) for name in env_vars},
                "cpus": sorted(os.sched_getaffinity(0)),
                "niceness": os.getpriority(os.PRIO_PROCESS, 0),
            }

    probe = Probe.remote()  # type: ignore[attr-defined]
    facts: dict[str, object] = ray.get(probe.facts.remote(), timeout=120)
    ray.kill(probe)
    return facts, int(facts["pid"])  # type: ignore[call-overload]


def _gone(pid: int, within: float = 30.0) -> bool:
    import time

    deadline = time.monotonic() + within
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not Path(f"/proc/{pid}").exists()


def test_a_worker_forked_warm_is_the_process_ray_knows_set_up_as_a_cold_one() -> None:
    launcher.shared_cluster()
    if launcher.worker_job_config() is None:
        pytest.skip(f"{launcher.COLD_WORKERS}=1: the shared cluster's workers start cold")
    starts = launcher.launches()["Ray worker forked"]
    facts, pid = _worker_facts(
        {"OMP_NUM_THREADS": "1", "MALLOC_TRIM_THRESHOLD_": str(2**30), "RLSTACK_PROBE": "yes"}
    )
    assert launcher.launches()["Ray worker forked"] == starts + 1
    assert facts["parent"] == launcher.worker_zygote().process.pid
    # Set up as Ray would have started it: its env_vars, one thread as OMP_NUM_THREADS says
    # (the zygote's torch sized its pool for every core), the cores its launcher had.
    assert facts["env"] == {
        "OMP_NUM_THREADS": "1",
        "MALLOC_TRIM_THRESHOLD_": str(2**30),
        "RLSTACK_PROBE": "yes",
    }
    assert facts["threads"] == 1
    assert facts["cpus"] == sorted(os.sched_getaffinity(0))
    # The priority Ray gives its workers (its worker_niceness, 15 unless RAY_worker_niceness
    # says otherwise), not the zygote's.
    zygote = launcher.worker_zygote().process.pid
    assert os.getpriority(os.PRIO_PROCESS, zygote) != RAY_WORKER_NICENESS
    assert facts["niceness"] == RAY_WORKER_NICENESS
    # ray.kill reaches the fork itself.
    assert _gone(pid)


def test_a_worker_with_variables_of_a_package_the_zygote_left_alone_is_forked() -> None:
    """vLLM reads ``VLLM_*`` at import; the workers' zygote has not imported it, so a worker
    that sets one is forked and its own import of vLLM reads it."""
    launcher.shared_cluster()
    if launcher.worker_job_config() is None:
        pytest.skip(f"{launcher.COLD_WORKERS}=1: the shared cluster's workers start cold")
    starts = launcher.launches()["Ray worker forked"]
    facts, pid = _worker_facts({"VLLM_LOGGING_LEVEL": "ERROR"})
    assert launcher.launches()["Ray worker forked"] == starts + 1
    assert facts["env"] == {"VLLM_LOGGING_LEVEL": "ERROR"}
    assert _gone(pid)


def test_a_worker_whose_import_time_variables_differ_starts_cold() -> None:
    launcher.shared_cluster()
    if launcher.worker_job_config() is None:
        pytest.skip(f"{launcher.COLD_WORKERS}=1: the shared cluster's workers start cold")
    reason = "Ray worker cold (read at import: HF_HUB_OFFLINE)"
    before = launcher.launches()[reason]
    facts, pid = _worker_facts({"HF_HUB_OFFLINE": "1"})
    assert launcher.launches()[reason] == before + 1
    assert facts["parent"] != launcher.worker_zygote().process.pid
    assert facts["env"] == {"HF_HUB_OFFLINE": "1"}
    assert _gone(pid)
