"""GAE and PPO's clipped loss: rlcore.jax under `jax.jit` against rlcore's torch functions.

Three cases on one ``[batch, time]`` float32 batch (256 × 4,096 by default), on the CPU:

- ``gae``: `gae` with terminated and truncated flags (0.2 % each), γ 0.99, λ 0.95;
- ``ppo_loss``: `ppo_policy_loss` forward (the loss and its four metrics),
  token-mean over a mask with 10 % holes;
- ``ppo_loss_grad``: the same and its gradient with respect to ``logprobs``.

Implementations, on the same inputs:

- ``torch_eager`` (the baseline): rlcore's torch functions with ``RLCORE_TYPECHECK=0``;
- ``torch_eager_checked``: the same with rlcore's run-time type checks (its default);
- ``torch_compile``: ``torch.compile`` of the same functions (inductor, C++ kernels);
  the first call's compile time, from an empty inductor cache, is reported apart
  (skipped by ``--quick``: tens of seconds of compilation);
- ``jax_jit``: rlcore.jax's twins under ``jax.jit`` (compile time, ``lower`` +
  ``compile``, reported apart);
- ``jax_eager``: the twins op by op, without ``jit``;
- ``jax_jit_lax_scan`` (``gae`` only, an ablation): the same δ and decays as
  rlcore.jax's `gae`, the recurrence solved by a sequential ``lax.scan`` over time
  instead of rlcore.jax's associative scan.

Each group runs in a child process of its own: ``RLCORE_TYPECHECK`` is read when
rlcore is imported, and one library's thread pool must not compete with the
other's. Threads: ``torch.set_num_threads(n)``; XLA runs on one thread with
``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``, on n > 1
with its process pinned to n cores. Timings are medians of ``--repeats`` calls
after a warm-up, of wall time (``ms``) and of process CPU time (``cpu_ms``,
every thread; steadier than wall time on a shared machine), each with its
ratio to the baseline. Outputs are compared with the baseline's (max abs
diff, and relative to the largest baseline value). Prints one JSON object.

    python benchmarks/core_jax.py [--batch 256] [--time 4096] [--threads 1 2] [--quick]
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
from pathlib import Path
from typing import Any

import numpy as np

GAMMA, LAM, CLIP = 0.99, 0.95, 0.2
CASES = ("gae", "ppo_loss", "ppo_loss_grad")
BASELINE = "torch_eager"
# Parity target for the twins: jitted JAX at least as fast as the torch baseline on every case.
TARGET_SPEEDUP = 1.0
SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

# ---------------------------------------------------------------------------
# Inputs, written once by the parent and read by every child.


def make_inputs(batch: int, steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def normal() -> np.ndarray:
        return rng.standard_normal((batch, steps), dtype=np.float32)

    terminated = rng.random((batch, steps)) < 0.002
    logprobs = -rng.exponential(1.0, (batch, steps)).astype(np.float32)
    return {
        "rewards": normal(),
        "values": normal(),
        "next_values": normal(),
        "terminated": terminated,
        "truncated": (rng.random((batch, steps)) < 0.002) & ~terminated,
        "logprobs": logprobs,
        "old_logprobs": logprobs + 0.1 * normal(),
        "advantages": normal(),
        "mask": rng.random((batch, steps)) >= 0.1,
    }


def timed(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    """Median wall time and median process CPU time (all threads) of ``fn``, after a warm-up.

    On a shared machine the wall time of a one-thread call swings with other
    processes' load; its CPU time much less.
    """
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - start) * 1000.0)
        cpu.append((time.process_time() - start_cpu) * 1000.0)
    return {"ms": statistics.median(wall), "cpu_ms": statistics.median(cpu)}


# ---------------------------------------------------------------------------
# Children: one group of implementations each, in a fresh interpreter.


def child_torch(x: dict[str, np.ndarray], threads: int, repeats: int, compile_too: bool) -> Any:
    import torch

    from rlcore.advantages import gae
    from rlcore.losses import ppo_policy_loss

    torch.set_num_threads(threads)
    t = {name: torch.from_numpy(value) for name, value in x.items()}
    gae_args = (t["rewards"], t["values"], t["next_values"], t["terminated"], t["truncated"])
    loss_args = (t["old_logprobs"], t["advantages"], t["mask"])

    def run_gae(fn: Callable[..., Any]) -> dict[str, np.ndarray]:
        out = fn(*gae_args, GAMMA, LAM)
        return {"advantages": out.advantages.numpy(), "returns": out.returns.numpy()}

    def run_loss(fn: Callable[..., Any]) -> dict[str, np.ndarray]:
        out = fn(t["logprobs"], *loss_args, clip_low=CLIP)
        return {"loss": out.loss.detach().numpy(), **_metrics(out.metrics)}

    def run_grad(fn: Callable[..., Any]) -> dict[str, np.ndarray]:
        logprobs = t["logprobs"].clone().requires_grad_()
        fn(logprobs, *loss_args, clip_low=CLIP).loss.backward()
        assert logprobs.grad is not None
        return {"grad": logprobs.grad.numpy()}

    def _metrics(metrics: dict[str, Any]) -> dict[str, np.ndarray]:
        return {name: value.detach().numpy() for name, value in metrics.items()}

    runners = {"gae": (run_gae, gae), "ppo_loss": (run_loss, ppo_policy_loss)}
    runners["ppo_loss_grad"] = (run_grad, ppo_policy_loss)
    timings: dict[str, dict[str, Any]] = {}
    outputs: dict[str, dict[str, np.ndarray]] = {}
    label = "torch_eager" if os.environ.get("RLCORE_TYPECHECK") == "0" else "torch_eager_checked"
    for case, (runner, fn) in runners.items():
        outputs[f"{label}/{case}"] = runner(fn)
        timings.setdefault(label, {})[case] = timed(lambda r=runner, f=fn: r(f), repeats)
    if compile_too:
        # dynamo cannot trace the construction of rlcore's attrs records (torch 2.13:
        # "expected WrapperDescriptorType"): they are built eagerly, after the compiled graph.
        from rlcore.types import Advantages, LossOutput

        for record in (Advantages, LossOutput):
            record.__init__ = torch.compiler.disable(record.__init__)  # type: ignore[method-assign]
        for case, (runner, fn) in runners.items():
            compiled = torch.compile(fn)
            started = time.perf_counter()
            outputs[f"torch_compile/{case}"] = runner(compiled)
            compile_s = time.perf_counter() - started
            timings.setdefault("torch_compile", {})[case] = {
                **timed(lambda r=runner, c=compiled: r(c), repeats),
                "compile_s": compile_s,
            }
    return timings, outputs, {"torch": torch.__version__}


def child_jax(x: dict[str, np.ndarray], repeats: int) -> Any:
    import jax
    import jax.numpy as jnp

    from rlcore.jax.advantages import gae
    from rlcore.jax.losses import ppo_policy_loss

    j = {name: jnp.asarray(value) for name, value in x.items()}
    gae_args = (j["rewards"], j["values"], j["next_values"], j["terminated"], j["truncated"])
    loss_args = (j["logprobs"], j["old_logprobs"], j["advantages"], j["mask"])

    def gae_fn(*args: Any) -> Any:
        return gae(*args, GAMMA, LAM)

    def gae_lax_scan(rewards: Any, values: Any, next_values: Any, term: Any, trunc: Any) -> Any:
        # rlcore.jax's δ and decays; only the solver differs (sequential over time).
        delta = jnp.where(term, 0.0, next_values) * GAMMA + rewards - values
        decay = jnp.where(term | trunc, 0.0, GAMMA * LAM).astype(delta.dtype)

        def step(carry: Any, column: Any) -> Any:
            carry = column[0] + column[1] * carry
            return carry, carry

        zero = jnp.zeros(delta.shape[0], delta.dtype)
        _, solved = jax.lax.scan(step, zero, (delta.T, decay.T), reverse=True)
        return {"advantages": solved.T, "returns": solved.T + values}

    def loss_fn(*args: Any) -> Any:
        return ppo_policy_loss(*args, clip_low=CLIP)

    def loss_and_grad(logprobs: Any, *args: Any) -> Any:
        def scalar(lp: Any) -> Any:
            out = ppo_policy_loss(lp, *args, clip_low=CLIP)
            return out.loss, out

        (_, out), grad = jax.value_and_grad(scalar, has_aux=True)(logprobs)
        return out, grad

    def gae_out(out: Any) -> dict[str, np.ndarray]:
        if isinstance(out, dict):
            return {name: np.asarray(value) for name, value in out.items()}
        return {"advantages": np.asarray(out.advantages), "returns": np.asarray(out.returns)}

    def loss_out(out: Any) -> dict[str, np.ndarray]:
        metrics = {name: np.asarray(value) for name, value in out.metrics.items()}
        return {"loss": np.asarray(out.loss), **metrics}

    cases: list[tuple[str, str, Callable[..., Any], tuple[Any, ...], Callable[[Any], Any]]] = [
        ("gae", "jax", gae_fn, gae_args, gae_out),
        ("ppo_loss", "jax", loss_fn, loss_args, loss_out),
        ("ppo_loss_grad", "jax", loss_and_grad, loss_args, lambda out: {"grad": out[1]}),
        ("gae", "jax_jit_lax_scan", gae_lax_scan, gae_args, gae_out),
    ]
    timings: dict[str, dict[str, Any]] = {}
    outputs: dict[str, dict[str, np.ndarray]] = {}
    for case, name, fn, args, convert in cases:
        started = time.perf_counter()
        compiled = jax.jit(fn).lower(*args).compile()
        compile_s = time.perf_counter() - started
        label = "jax_jit" if name == "jax" else name
        outputs[f"{label}/{case}"] = {k: np.asarray(v) for k, v in convert(compiled(*args)).items()}
        timings.setdefault(label, {})[case] = {
            **timed(lambda c=compiled, a=args: jax.block_until_ready(c(*a)), repeats),
            "compile_s": compile_s,
        }
        if name == "jax":
            outputs[f"jax_eager/{case}"] = {k: np.asarray(v) for k, v in convert(fn(*args)).items()}
            timings.setdefault("jax_eager", {})[case] = timed(
                lambda f=fn, a=args: jax.block_until_ready(f(*a)), repeats
            )
    return timings, outputs, {"jax": jax.__version__, "jax_devices": str(jax.devices())}


def child_main(args: argparse.Namespace) -> None:
    with np.load(args.inputs) as data:
        inputs = {name: data[name] for name in data.files}
    if args.child == "jax":
        timings, outputs, versions = child_jax(inputs, args.repeats)
    else:
        compile_too = args.child == "torch" and not args.no_compile
        timings, outputs, versions = child_torch(inputs, args.threads[0], args.repeats, compile_too)
    flat = {
        f"{key}/{name}": value for key, arrays in outputs.items() for name, value in arrays.items()
    }
    np.savez(args.outputs, **flat)
    print(json.dumps({"timings": timings, "versions": versions}))


# ---------------------------------------------------------------------------
# Parent: runs the children, compares outputs, prints the report.

CHILDREN = {
    # name: RLCORE_TYPECHECK
    "torch": "0",  # torch_eager (the baseline), then torch_compile
    "torch_checked": "1",
    "jax": "0",
}


def run_child(
    name: str, threads: int, args: argparse.Namespace, inputs: Path, workdir: Path
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    env = {**os.environ, "RLCORE_TYPECHECK": CHILDREN[name], "JAX_PLATFORMS": "cpu"}
    # A cold inductor cache, so that torch.compile's compile time is a first compilation.
    env["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / f"inductor_{threads}")
    if threads == 1:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {SINGLE_THREAD_XLA}".strip()
    outputs = workdir / f"{name}_{threads}.npz"
    command = [sys.executable, __file__, "--child", name, "--threads", str(threads)]
    command += ["--repeats", str(args.repeats), "--inputs", str(inputs), "--outputs", str(outputs)]
    command += ["--no-compile"] if args.no_compile else []
    pin = None
    if threads > 1 and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))[:threads]
        pin = lambda: os.sched_setaffinity(0, cores)  # XLA sizes its thread pool by it
    completed = subprocess.run(
        command, env=env, capture_output=True, text=True, check=False, preexec_fn=pin
    )
    if completed.returncode != 0:
        raise RuntimeError(f"child {name} ({threads} threads) failed:\n{completed.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    with np.load(outputs) as data:
        arrays = {key: data[key] for key in data.files}
    return report, arrays


def compare(arrays: dict[str, np.ndarray], impl: str, case: str) -> dict[str, float]:
    prefix, base = f"{impl}/{case}/", f"{BASELINE}/{case}/"
    diff, scale = 0.0, 0.0
    for key, reference in arrays.items():
        if not key.startswith(base):
            continue
        ours = arrays[prefix + key.removeprefix(base)]
        diff = max(diff, float(np.max(np.abs(ours.astype(np.float64) - reference))))
        scale = max(scale, float(np.max(np.abs(reference))))
    return {"max_abs_diff": diff, "max_rel_diff": diff / scale if scale else diff}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--time", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--quick", action="store_true", help="small shapes, 1 thread: smoke tests")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    parser.add_argument("--outputs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child_main(args)
        return
    if args.quick:
        args.batch, args.time, args.repeats, args.threads = 8, 100, 2, [1]
        args.no_compile = True

    started = time.perf_counter()
    results: dict[str, Any] = {}
    versions: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="core_jax_") as tmp:
        workdir = Path(tmp)
        inputs = workdir / "inputs.npz"
        np.savez(inputs, **make_inputs(args.batch, args.time))
        for threads in args.threads:
            timings: dict[str, dict[str, Any]] = {}
            arrays: dict[str, np.ndarray] = {}
            for child in CHILDREN:
                report, child_arrays = run_child(child, threads, args, inputs, workdir)
                timings.update(report["timings"])
                versions.update(report["versions"])
                arrays.update(child_arrays)
            per_case: dict[str, dict[str, Any]] = {}
            for case in CASES:
                baseline = timings[BASELINE][case]
                per_case[case] = {}
                for impl, by_case in timings.items():
                    if case not in by_case:
                        continue
                    entry = dict(by_case[case])
                    entry["speedup_vs_torch_eager"] = baseline["ms"] / entry["ms"]
                    entry["cpu_speedup_vs_torch_eager"] = baseline["cpu_ms"] / entry["cpu_ms"]
                    if impl != BASELINE:
                        entry.update(compare(arrays, impl, case))
                    per_case[case][impl] = entry
                impls = list(per_case[case])
                per_case[case]["fastest"] = min(impls, key=lambda i: per_case[case][i]["ms"])
                per_case[case]["fastest_cpu"] = min(
                    impls, key=lambda i: per_case[case][i]["cpu_ms"]
                )
            results[f"threads_{threads}"] = per_case
    first = results[f"threads_{args.threads[0]}"]
    worst = min(first[case]["jax_jit"]["speedup_vs_torch_eager"] for case in CASES)
    report = {
        "benchmark": "core_jax",
        "quick": args.quick,
        "shape": [args.batch, args.time],
        "dtype": "float32",
        "gamma": GAMMA,
        "lam": LAM,
        "clip": CLIP,
        **versions,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "baseline": "torch_eager: rlcore's torch functions, eager, RLCORE_TYPECHECK=0",
        "results": results,
        "torch_compile": "skipped (--no-compile or --quick)" if args.no_compile else "run",
        "target": {f"jax_jit_speedup_vs_torch_eager_at_{args.threads[0]}_thread": TARGET_SPEEDUP},
        "achieved": {f"jax_jit_speedup_vs_torch_eager_at_{args.threads[0]}_thread": worst},
        "met": worst >= TARGET_SPEEDUP,
        "wall_s": time.perf_counter() - started,
        "load_average": os.getloadavg(),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
