"""Where the test suite's time goes: CPU seconds by kind of process and by what they do.

    .venv/bin/python tests/profile_suite.py                       # the whole suite, as make test
    .venv/bin/python tests/profile_suite.py tests/shell/test_run.py -n 1

Runs pytest (the arguments given, or ``make test``'s ``-n 2 --dist loadgroup``) and, all
the while, reads the CPU time of every process below it (psutil, every 0.2 s): pytest's
own processes, the runs' drivers, Ray's daemons and workers, snippets and tools. Each
Python process also counts, from inside (`tests/suite_probe.py`, loaded through a
``.pth`` file for the length of the run), the CPU seconds it spent importing modules, in
``ray.init`` and building models (``rlshell.models.get_model``). Prints one JSON object:

- ``cpu_s``: all the CPU seconds of the run (the kernel's count for every process waited
  for), and the part the sampling saw;
- ``by_kind``: processes, CPU seconds, and the probe's split for each kind;
- ``where``: the suite's CPU seconds split into Ray's start-up and daemons, imports
  (process start-up), model builds, and the rest (the checks themselves, and what the
  runs they start compute).

CPU seconds, not wall time: on the 2-core CI machine the suite keeps both cores busy, so
the CPU it spends is what its wall time is made of.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).with_name("suite_probe.py")
PROBE_MODULE = "_rlstack_suite_probe"

RAY_DAEMONS = re.compile(
    r"gcs_server|raylet|log_monitor\.py|ray/autoscaler/_private/monitor\.py|"
    r"dashboard/agent\.py|dashboard/dashboard\.py|runtime_env/agent|ray_process_reaper|"
    r"ray_client_server|dashboard/modules|^ray::(DashboardAgent|RuntimeEnvAgent)\b"
)
RUN_DRIVER = re.compile(r"-m rlshell\.(train|evaluate|export)\b|rlshell\.api|examples/\S+\.py")


def kind_of(cmdline: str, pid: int, pytest_pids: set[int]) -> str:
    """A short name for what a process is, from its command line."""
    if pid in pytest_pids:
        return "pytest (tests in their own process)"
    if RAY_DAEMONS.search(cmdline):
        return "ray daemons"
    if cmdline.startswith("ray::"):
        name = re.split(r"[\s.(:]", cmdline[len("ray::") :], maxsplit=1)[0]
        return f"ray worker: {name or '?'}"
    if "default_worker.py" in cmdline:
        return "ray worker: starting"
    if "EngineCore" in cmdline or "VLLM" in cmdline:
        return "vllm engine"
    if "benchmarks/" in cmdline:
        return "benchmark scripts"
    if RUN_DRIVER.search(cmdline):
        return "run drivers (rlshell.train, evaluate, export, examples)"
    if "mypy" in cmdline:
        return "mypy"
    if "python" in cmdline:
        return "other python (snippets, tools)"
    return "other programs"


class Sampler(threading.Thread):
    """Reads the CPU time of every process below ``root`` until stopped."""

    def __init__(self, root: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.interval = interval
        self.stopped = threading.Event()
        # (pid, create_time) -> [cmdline, cpu seconds]; a pid can be reused.
        self.seen: dict[tuple[int, float], list[Any]] = {}
        self.pytest_pids: set[int] = set()

    def sample(self) -> None:
        try:
            root = psutil.Process(self.root)
            processes = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for process in processes:
            try:
                with process.oneshot():
                    key = (process.pid, process.create_time())
                    times = process.cpu_times()
                    cpu = times.user + times.system
                    # Read every time: a process forked by Python execs its program later,
                    # and Ray renames its workers (ray::Class) once they take an actor.
                    cmdline = " ".join(process.cmdline())
                    entry = self.seen.setdefault(key, [cmdline, cpu])
                    entry[0] = cmdline or entry[0]
                    entry[1] = max(entry[1], cpu)
                    if process.pid == self.root or (
                        process.ppid() == self.root
                        and ("execnet" in cmdline or "exec(eval(" in cmdline)
                    ):
                        self.pytest_pids.add(process.pid)
            except psutil.Error:
                continue

    def run(self) -> None:
        while not self.stopped.is_set():
            self.sample()
            self.stopped.wait(self.interval)


def install_probe(folder: Path) -> list[Path]:
    """Put the probe and its ``.pth`` line into this interpreter's site-packages."""
    site = Path(sysconfig.get_paths()["purelib"])
    module = site / f"{PROBE_MODULE}.py"
    pth = site / f"{PROBE_MODULE}.pth"
    # Each appears whole (renamed into place), the module before the line that imports it:
    # a process of another test run starting meanwhile loads the probe, which does nothing
    # without RLSTACK_SUITE_PROBE, or nothing at all.
    for path, write in (
        (module, lambda p: shutil.copyfile(PROBE, p)),
        (pth, lambda p: p.write_text(f"import {PROBE_MODULE}\n")),
    ):
        partial = path.with_name(f".{path.name}.partial")
        write(partial)
        partial.rename(path)
    return [pth, module]


def remove_probe(installed: list[Path]) -> None:
    """The ``.pth`` line first, then (once a process that read it has had time to import it)
    the module."""
    for index, path in enumerate(installed):
        if index:
            time.sleep(1.0)
        path.unlink(missing_ok=True)


def read_probes(folder: Path) -> dict[int, dict[str, Any]]:
    found = {}
    for path in folder.glob("*.json"):
        try:
            found[int(path.stem)] = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
    return found


def report(sampler: Sampler, probes: dict[int, dict[str, Any]], wall: float) -> dict[str, Any]:
    by_kind: dict[str, dict[str, float]] = defaultdict(
        lambda: {
            "processes": 0,
            "cpu_s": 0.0,
            "imports_s": 0.0,
            "ray_init_s": 0.0,
            "model_builds_s": 0.0,
        }
    )
    for (pid, _), (cmdline, cpu) in sampler.seen.items():
        row = by_kind[kind_of(cmdline, pid, sampler.pytest_pids)]
        row["processes"] += 1
        row["cpu_s"] += cpu
        probe = probes.get(pid)
        if probe is not None:
            # The probe's count can run ahead of the last sample: never more than the process.
            row["imports_s"] += min(probe["imports"], cpu)
            row["ray_init_s"] += probe["ray_init"]
            row["model_builds_s"] += probe["model_builds"]
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = children.ru_utime + children.ru_stime
    sampled = sum(row["cpu_s"] for row in by_kind.values())
    # Ray's own processes, and its workers that never took an actor (started ahead for tasks).
    ray_kinds = ("ray daemons", "ray worker: IDLE")
    ray_own = sum(
        by_kind[kind]["cpu_s"] - by_kind[kind]["imports_s"] for kind in ray_kinds if kind in by_kind
    )
    imports = sum(row["imports_s"] for row in by_kind.values())
    ray_init = sum(row["ray_init_s"] for row in by_kind.values())
    models = sum(row["model_builds_s"] for row in by_kind.values())
    where = {
        "ray: its daemons and idle workers (less their imports), ray.init": ray_own + ray_init,
        "imports (every process's start-up)": imports,
        "model builds (rlshell.models.get_model)": models,
        "the rest (the checks, and what the runs compute)": sampled
        - ray_own
        - ray_init
        - imports
        - models,
    }
    return {
        "benchmark": "test_suite_profile",
        "wall_s": round(wall, 1),
        "cpu_s": {"all_processes": round(total, 1), "sampled": round(sampled, 1)},
        "where": {
            name: {"cpu_s": round(value, 1), "share": round(value / sampled, 3) if sampled else 0.0}
            for name, value in where.items()
        },
        "by_kind": {
            kind: {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}
            for kind, row in sorted(by_kind.items(), key=lambda item: -item[1]["cpu_s"])
        },
        "ray_clusters_started": sum(
            1 for cmdline, _ in sampler.seen.values() if "gcs_server" in cmdline
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between samples")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = pytest_args or ["-n", "2", "--dist", "loadgroup"]
    folder = Path(tempfile.mkdtemp(prefix="suite-probe-"))
    installed = install_probe(folder)
    env = {**os.environ, "RLSTACK_SUITE_PROBE": str(folder)}
    env.setdefault("HYPOTHESIS_PROFILE", "ci")
    start = time.monotonic()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT, env=env
        )
        sampler = Sampler(process.pid, args.interval)
        sampler.start()
        status = process.wait()
        sampler.stopped.set()
        sampler.join()
    finally:
        remove_probe(installed)
    result = report(sampler, read_probes(folder), time.monotonic() - start)
    result["pytest_args"] = pytest_args
    result["pytest_exit_status"] = status
    shutil.rmtree(folder, ignore_errors=True)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
