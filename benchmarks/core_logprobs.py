"""Memory-bounded log-probabilities (`rlcore.logprobs`) against the naive paths.

(a) `token_logprobs(logits, tokens, chunk_size=...)` against
    `torch.log_softmax(logits, -1).gather(-1, tokens)` on given float32 logits
    (4,096 tokens of a 151,936-word vocabulary): the extra peak memory beyond
    the input logits, and the time (median of a few runs; one intra-op thread,
    two threads reported too). Targets: extra memory ≤ 0.25× the naive path's,
    time ≤ 1.1× the naive path's.
(b) `token_logprobs_from_hidden` forward + backward against hidden → logits →
    log_softmax → gather, forward + backward, on one thread. Target: total
    peak memory ≤ 0.25× the naive path's; gradients for the hidden states and
    the LM-head weight equal to the naive path's (max abs diff reported).

Memory is the peak resident set size (``VmHWM``) of a fresh subprocess per
case: the peak is reset (``/proc/self/clear_refs``) or, where that is refused,
read right after the inputs are allocated and touched, then read again after
the operation. "Extra" is the growth beyond the inputs; "total" (b) counts
the inputs too, from the process's resident size before they were created.

Prints one JSON object to stdout. ``--quick`` shrinks every size (a smoke run
for the test suite; its figures mean nothing).

    .venv/bin/python benchmarks/core_logprobs.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

MEMORY_TARGET = 0.25  # chunked extra (a) / total (b) peak memory ≤ 0.25× the naive path's
TIME_TARGET = 1.1  # chunked time ≤ 1.1× the naive path's

FULL = {"tokens": 4096, "vocab": 151_936, "hidden": 256, "chunk_size": 256, "repeats": 3}
QUICK = {"tokens": 256, "vocab": 8192, "hidden": 32, "chunk_size": 64, "repeats": 2}
HIDDEN_CHUNK_SIZE = 1024  # token_logprobs_from_hidden's default

# ---------------------------------------------------------------------------
# Measuring inside a worker process.


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> tuple[int, str]:
    """Start a new peak-RSS window; returns (the resident size it starts from, how)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # resets VmHWM to the current VmRSS (Linux ≥ 4.0)
        return _status_bytes("VmRSS"), "clear_refs"
    except OSError:
        return _status_bytes("VmHWM"), "VmHWM after inputs"


def _logits_inputs(tokens: int, vocab: int) -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(tokens, vocab, generator=generator).mul_(3.0)
    ids = torch.randint(0, vocab, (tokens,), generator=generator)
    return logits, ids


def _naive_logprobs(logits: Any, ids: Any) -> Any:
    import torch

    return torch.log_softmax(logits, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def _chunked_logprobs(logits: Any, ids: Any, chunk_size: int) -> Any:
    from rlcore.logprobs import token_logprobs

    return token_logprobs(logits, ids, chunk_size=chunk_size)


def _worker_logits_memory(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)

    def run(logits: Any, ids: Any) -> Any:
        if spec["method"] == "naive":
            return _naive_logprobs(logits, ids)
        return _chunked_logprobs(logits, ids, spec["chunk_size"])

    run(*_logits_inputs(4, 16))  # first-call set-up (lazy imports, checkers) is not the op's
    logits, ids = _logits_inputs(spec["tokens"], spec["vocab"])
    baseline, how = _reset_peak()
    result = run(logits, ids)
    peak = _status_bytes("VmHWM")
    del result
    return {"extra_peak_bytes": peak - baseline, "input_bytes": logits.nbytes, "peak_reset": how}


def _worker_logits_time(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    logits, ids = _logits_inputs(spec["tokens"], spec["vocab"])
    reference = _naive_logprobs(logits, ids)
    chunk_sizes: list[int] = spec["chunk_sizes"]
    max_abs_diff = max(
        float((_chunked_logprobs(logits, ids, size) - reference).abs().max())
        for size in chunk_sizes
    )
    del reference
    methods: dict[str, Callable[[], Any]] = {"naive": partial(_naive_logprobs, logits, ids)}
    for size in chunk_sizes:
        methods[f"chunked_{size}"] = partial(_chunked_logprobs, logits, ids, size)
    medians: dict[str, dict[str, float]] = {}
    for threads in spec["threads"]:
        torch.set_num_threads(threads)
        samples: dict[str, list[float]] = {name: [] for name in methods}
        # Interleaved, so that load from other work on the machine hits every method alike.
        for _ in range(spec["repeats"]):
            for name, run in methods.items():
                start = time.perf_counter()
                run()
                samples[name].append(time.perf_counter() - start)
        medians[str(threads)] = {name: statistics.median(s) for name, s in samples.items()}
    return {"median_s": medians, "max_abs_diff": max_abs_diff}


def _worker_hidden(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from rlcore.logprobs import token_logprobs_from_hidden

    torch.set_num_threads(1)

    def inputs(tokens: int, vocab: int, width: int) -> tuple[Any, Any, Any, Any]:
        generator = torch.Generator().manual_seed(0)
        hidden = torch.randn(tokens, width, generator=generator).requires_grad_()
        weight = torch.randn(vocab, width, generator=generator).div_(width**0.5).requires_grad_()
        ids = torch.randint(0, vocab, (tokens,), generator=generator)
        return hidden, weight, ids, torch.randn(tokens, generator=generator)

    def run(hidden: Any, weight: Any, ids: Any, cotangent: Any) -> Any:
        if spec["method"] == "naive":
            logprobs = _naive_logprobs(hidden @ weight.T, ids)
        else:
            logprobs = token_logprobs_from_hidden(
                hidden, weight, ids, chunk_size=spec["chunk_size"]
            )
        (logprobs * cotangent).sum().backward()
        return logprobs

    run(*inputs(4, 16, 8))  # first-call set-up (lazy imports, autograd threads) is not the op's
    before_inputs = _status_bytes("VmRSS")
    hidden, weight, ids, cotangent = inputs(spec["tokens"], spec["vocab"], spec["hidden"])
    baseline, how = _reset_peak()
    start = time.perf_counter()
    logprobs = run(hidden, weight, ids, cotangent)
    elapsed = time.perf_counter() - start
    peak = _status_bytes("VmHWM")
    torch.save(
        {"logprobs": logprobs.detach(), "hidden": hidden.grad, "weight": weight.grad},
        spec["save_to"],
    )
    return {
        "total_peak_bytes": peak - before_inputs,
        "extra_peak_bytes": peak - baseline,
        "input_bytes": hidden.nbytes + weight.nbytes,
        "forward_backward_s": elapsed,
        "peak_reset": how,
    }


WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "logits_memory": _worker_logits_memory,
    "logits_time": _worker_logits_time,
    "hidden": _worker_hidden,
}

# ---------------------------------------------------------------------------
# The driver: one fresh interpreter per case.


def _run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"worker {spec} failed:\n{completed.stderr}")
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


def _mib(value: int) -> float:
    return round(value / 2**20, 1)


def _bench_logits(sizes: dict[str, int]) -> dict[str, Any]:
    chunk_size = sizes["chunk_size"]
    case = {"tokens": sizes["tokens"], "vocab": sizes["vocab"]}
    naive = _run_worker({"case": "logits_memory", "method": "naive", **case})
    chunked = _run_worker(
        {"case": "logits_memory", "method": "chunked", "chunk_size": chunk_size, **case}
    )
    sweep = sorted({max(1, chunk_size // 4), chunk_size, chunk_size * 4})
    timing = _run_worker(
        {
            "case": "logits_time",
            "chunk_sizes": sweep,
            "threads": [1, 2],
            "repeats": sizes["repeats"],
            **case,
        }
    )
    memory_ratio = chunked["extra_peak_bytes"] / naive["extra_peak_bytes"]
    time_s: dict[str, Any] = {}
    for threads, medians in timing["median_s"].items():
        ratio = medians[f"chunked_{chunk_size}"] / medians["naive"]
        time_s[f"{threads}_thread" + ("s" if threads != "1" else "")] = {
            "naive": round(medians["naive"], 4),
            "chunked": round(medians[f"chunked_{chunk_size}"], 4),
            "ratio": round(ratio, 3),
            "met": ratio <= TIME_TARGET,
            "chunk_size_sweep": {
                name.removeprefix("chunked_"): round(seconds, 4)
                for name, seconds in medians.items()
                if name != "naive"
            },
        }
    return {
        "tokens": sizes["tokens"],
        "vocab": sizes["vocab"],
        "dtype": "float32",
        "chunk_size": chunk_size,
        "input_logits_mib": _mib(naive["input_bytes"]),
        "extra_peak_mib": {
            "naive": _mib(naive["extra_peak_bytes"]),
            "chunked": _mib(chunked["extra_peak_bytes"]),
        },
        "memory_ratio": round(memory_ratio, 4),
        "memory_target": MEMORY_TARGET,
        "memory_met": memory_ratio <= MEMORY_TARGET,
        "time_s": time_s,
        "time_target": TIME_TARGET,
        "time_met": all(entry["met"] for entry in time_s.values()),
        "time_repeats": sizes["repeats"],
        "max_abs_diff_vs_naive": timing["max_abs_diff"],
        "peak_reset": chunked["peak_reset"],
    }


def _bench_hidden(sizes: dict[str, int], chunk_size: int) -> dict[str, Any]:
    import torch

    case = {"tokens": sizes["tokens"], "vocab": sizes["vocab"], "hidden": sizes["hidden"]}
    with tempfile.TemporaryDirectory() as scratch:
        paths = {method: os.path.join(scratch, f"{method}.pt") for method in ("naive", "chunked")}
        runs = {
            method: _run_worker(
                {
                    "case": "hidden",
                    "method": method,
                    "chunk_size": chunk_size,
                    "save_to": paths[method],
                    **case,
                }
            )
            for method in ("naive", "chunked")
        }
        naive_out = torch.load(paths["naive"])
        chunked_out = torch.load(paths["chunked"])
    diffs = {
        name: float((chunked_out[name] - naive_out[name]).abs().max())
        for name in ("logprobs", "hidden", "weight")
    }
    scales = {name: float(naive_out[name].abs().max()) for name in ("hidden", "weight")}
    grads_equal = all(
        torch.allclose(chunked_out[name], naive_out[name], rtol=1e-4, atol=1e-5 * scales[name])
        for name in ("hidden", "weight")
    )
    naive, chunked = runs["naive"], runs["chunked"]
    total_ratio = chunked["total_peak_bytes"] / naive["total_peak_bytes"]
    return {
        "tokens": sizes["tokens"],
        "vocab": sizes["vocab"],
        "hidden_size": sizes["hidden"],
        "dtype": "float32",
        "chunk_size": chunk_size,
        "threads": 1,
        "input_mib": _mib(naive["input_bytes"]),
        "total_peak_mib": {
            "naive": _mib(naive["total_peak_bytes"]),
            "chunked": _mib(chunked["total_peak_bytes"]),
        },
        "extra_peak_mib": {
            "naive": _mib(naive["extra_peak_bytes"]),
            "chunked": _mib(chunked["extra_peak_bytes"]),
        },
        "total_memory_ratio": round(total_ratio, 4),
        "extra_memory_ratio": round(chunked["extra_peak_bytes"] / naive["extra_peak_bytes"], 4),
        "memory_target": MEMORY_TARGET,
        "memory_met": total_ratio <= MEMORY_TARGET,
        "forward_backward_s": {
            "naive": round(naive["forward_backward_s"], 3),
            "chunked": round(chunked["forward_backward_s"], 3),
        },
        "max_abs_diff": diffs,
        "max_abs_grad": scales,
        "grads_equal": grads_equal,
        "grads_tolerance": "rtol=1e-4, atol=1e-5 × max |naive grad|",
        "peak_reset": chunked["peak_reset"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        spec = json.loads(args.worker)
        print(json.dumps(WORKERS[spec["case"]](spec)))
        return

    import torch

    sizes = QUICK if args.quick else FULL
    hidden_chunk = sizes["chunk_size"] if args.quick else HIDDEN_CHUNK_SIZE
    start = time.perf_counter()
    logits = _bench_logits(sizes)
    hidden = _bench_hidden(sizes, hidden_chunk)
    report = {
        "benchmark": "core_logprobs",
        "quick": args.quick,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_measure": "peak RSS (VmHWM) of a fresh subprocess per case",
        "token_logprobs": logits,
        "token_logprobs_from_hidden": hidden,
        "met": bool(
            logits["memory_met"]
            and logits["time_met"]
            and hidden["memory_met"]
            and hidden["grads_equal"]
        ),
        "wall_s": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
