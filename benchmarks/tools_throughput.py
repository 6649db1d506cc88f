"""Tool calls per second through the sandbox (`rlshell.tools.sandbox.ToolExecutor`).

Measured on one executor with ``--processes`` sandbox processes:

- ``start_s``: the executor's start-up (spawned interpreters that import the
  tools, torch included, and set up their network namespace);
- ``calculator``: batches of ``a*b`` calls (a pure tool: one long-lived process
  per sandbox process runs them call after call), calls/s per batch, median
  and best, and the mean seconds of one call inside its sandbox;
- ``python``: batches of ``print(a*b)`` calls (a process forked per call);
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny batches, for the smoke test")
    args = parser.parse_args()
    calculator_calls, python_calls, repeats = (20, 5, 1) if args.quick else (300, 100, 3)
    start = time.perf_counter()
    with ToolExecutor(["calculator", "python"], ToolLimits(), args.processes) as executor:
        start_s = time.perf_counter() - start
        report = {
            "benchmark": "tools_throughput",
            "quick": args.quick,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "processes": args.processes,
            "start_s": round(start_s, 2),
            "calculator": batches(executor, "calculator", "{a}*{b}+1", calculator_calls, repeats),
            "python": batches(executor, "python", "print({a}*{b})", python_calls, repeats),
        }
    report["fresh_interpreter"] = fresh_interpreters(5 if args.quick else 20)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
