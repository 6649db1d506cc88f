"""Tool calls per second through the sandbox (`rlshell.tools.sandbox.ToolExecutor`).

Measured on one executor with ``--processes`` sandbox processes:

Each twice, alternating: ``weak`` (the baseline: calls forked from a warm
process of the trainer's user, what every call cost before the sandbox) and
``sandbox`` (the default: bubblewrap, seccomp, a uid and a cgroup per call,
`rlshell.isolation`); the better of the two runs of each is reported, and
``sandbox_over_weak_trivial_call`` is the ratio of their trivial-call latency.

- ``start_s``: the executor's start-up (interpreters that import the tools);
- ``calculator``: batches of ``a*b`` calls (a pure tool: one long-lived process
  per sandbox process runs them call after call), calls/s per batch, median
  and best, and the mean seconds of one call inside its sandbox;
- ``python``: batches of ``print(a*b)`` calls (a process forked per call);
- ``trivial_call_ms_median``: one ``print(1)`` call per run, alone;
- ``fresh_interpreter``: the baseline a sandbox without warm processes
  pays, one ``python -c 'print(a*b)'`` per call, run one after another
  (bare interpreter, without rlshell or torch).

Prints one JSON object. The agent task makes ~100-300 calculator calls per
GRPO step: the target is that they take well under a second.

    python benchmarks/tools_throughput.py [--processes 2] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

from rlshell.tools.parsing import ToolCall
from rlshell.tools.sandbox import ToolExecutor, ToolLimits, tool_metrics


def batches(
    executor: ToolExecutor, name: str, code: str, calls: int, repeats: int
) -> dict[str, Any]:
    rates, seconds = [], []
    for repeat in range(repeats):
        batch = [ToolCall(name, code.format(a=repeat, b=index), "") for index in range(calls)]
        start = time.perf_counter()
        results = executor.run(batch)
        elapsed = time.perf_counter() - start
        metrics = tool_metrics(results)
        if metrics["tools/ok_frac"] != 1.0:
            failed = [r for r in results if r.status != "ok"]
            raise RuntimeError(f"{len(failed)} {name} calls failed, first: {failed[0]}")
        rates.append(calls / elapsed)
        seconds.append(metrics["tools/seconds_mean"])
    return {
        "calls_per_batch": calls,
        "batches": repeats,
        "calls_per_s_median": round(statistics.median(rates), 1),
        "calls_per_s_best": round(max(rates), 1),
        "call_seconds_mean": round(statistics.mean(seconds), 5),
    }


def fresh_interpreters(calls: int) -> dict[str, Any]:
    start = time.perf_counter()
    for index in range(calls):
        subprocess.run([sys.executable, "-c", f"print({index}*7)"], check=True, capture_output=True)
    elapsed = time.perf_counter() - start
    return {"calls": calls, "calls_per_s": round(calls / elapsed, 1)}


def one_isolation(isolation: str, processes: int, quick: bool) -> dict[str, Any]:
    """The executor's start-up, calculator batches, python batches and the latency of one
    trivial call alone (``print(1)``, one call per `ToolExecutor.run`, median of many)."""
    calculator_calls, python_calls, repeats = (20, 5, 1) if quick else (300, 100, 3)
    limits = ToolLimits(isolation=isolation)  # type: ignore[arg-type]
    start = time.perf_counter()
    with ToolExecutor(["calculator", "python"], limits, processes) as executor:
        start_s = time.perf_counter() - start
        calculator = batches(executor, "calculator", "{a}*{b}+1", calculator_calls, repeats)
        python = batches(executor, "python", "print({a}*{b})", python_calls, repeats)
        latencies = []
        for _ in range(10 if quick else 200):
            begun = time.perf_counter()
            (result,) = executor.run([ToolCall("python", "print(1)", "")])
            latencies.append(time.perf_counter() - begun)
            if result.status != "ok":
                raise RuntimeError(f"a trivial call failed: {result}")
    return {
        "start_s": round(start_s, 2),
        "calculator": calculator,
        "python": python,
        "trivial_call_ms_median": round(1000 * statistics.median(latencies), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny batches, for the smoke test")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "benchmark": "tools_throughput",
        "quick": args.quick,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "processes": args.processes,
    }
    # The baseline, the same machine and cores: calls forked from a warm process of the
    # trainer's user (isolation='weak', what every call paid before the sandbox), then the
    # sandbox, twice each, alternating, so that drift on a shared machine hits both.
    runs: dict[str, list[dict[str, Any]]] = {"weak": [], "sandbox": []}
    for _ in range(1 if args.quick else 2):
        for isolation in ("weak", "sandbox"):
            runs[isolation].append(one_isolation(isolation, args.processes, args.quick))
    for isolation, results in runs.items():
        best = min(results, key=lambda r: r["trivial_call_ms_median"])
        report[isolation] = {
            **best,
            "trivial_call_ms_runs": [r["trivial_call_ms_median"] for r in results],
        }
    report["sandbox_over_weak_trivial_call"] = round(
        report["sandbox"]["trivial_call_ms_median"] / report["weak"]["trivial_call_ms_median"], 2
    )
    report["fresh_interpreter"] = fresh_interpreters(5 if args.quick else 20)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
