"""rlcore against verl 0.9.1's own functions, on random inputs; prints one JSON object.

Run by tests/peers/test_verl.py with the Python of a separate virtual environment
that holds verl (installed without its dependencies), omegaconf and codetiming on
top of the test environment's packages:

    <peer python> tests/peers/verl_parity.py <rlstack src dir>

Each check is one row of the verl mapping in docs/core.md: the same inputs go to
verl's function and to the rlcore call the docs name, and the check reports the
largest absolute difference over its random cases, of the values and, for losses,
of the gradients (``max_abs_diff``), and how many cases it drew. ``examples`` holds
the worked examples the docs quote, each side's numbers. Everything is float64.

Nothing of verl is copied here: verl is imported and called.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

SRC = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(SRC))

import rlcore  # noqa: E402
from rlcore.advantages import AdvantageBatch, AdvantageConfig  # noqa: E402
from rlcore.losses import (  # noqa: E402
    gspo_policy_loss,
    kl_estimate,
    ppo_policy_loss,
    value_loss,
    vanilla_policy_loss,
)
from rlcore.masked import aggregate, aggregation_normalizer  # noqa: E402
from rlcore.registry import ADVANTAGES  # noqa: E402
from rlcore.tokens import place_on_last_token  # noqa: E402

if Path(rlcore.__file__).resolve().parents[1] != SRC:
    raise SystemExit(f"imported rlcore from {rlcore.__file__}, not from {SRC}")

import verl  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

F64 = torch.float64
CASES = 20
# Small tensors: one thread (several would only contend for the test machine's cores).
torch.set_num_threads(1)
GENERATOR = torch.Generator().manual_seed(20260125)
MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
# verl's kl_penalty names, and each one's straight-through form.
KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_KINDS = KL_KINDS + tuple(f"{kind}+" for kind in KL_KINDS)


# --- random inputs ---------------------------------------------------------------------------


def integer(low: int, high: int) -> int:
    """Uniform in [low, high]."""
    return int(torch.randint(low, high + 1, (), generator=GENERATOR))


def uniform(low: float, high: float, *shape: int) -> torch.Tensor:
    return low + (high - low) * torch.rand(shape, generator=GENERATOR, dtype=F64)


def normal(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=GENERATOR, dtype=F64)


def mask_of(
    rows: int, time: int, holes: bool, empty_rows: bool = False, min_valid: int = 1
) -> torch.Tensor:
    """A bool mask: right-padded responses, or arbitrary holes (multi-turn observations).

    Every row keeps a valid token unless ``empty_rows``, where about one row in three is
    fully masked (never all of them). ``min_valid`` 2 is what verl's Bessel-corrected
    whitening needs.
    """
    if rows * time < min_valid:
        raise ValueError(f"a [{rows}, {time}] mask cannot hold {min_valid} valid tokens")
    while True:
        if holes:
            mask = torch.rand(rows, time, generator=GENERATOR) < 0.7
        else:
            lengths = torch.randint(1, time + 1, (rows, 1), generator=GENERATOR)
            mask = torch.arange(time) < lengths
        if not empty_rows:
            mask[:, 0] |= ~mask.any(dim=-1)
        else:
            mask[torch.rand(rows, generator=GENERATOR) < 0.34] = False
        if mask.sum() >= min_valid and mask.any():
            return mask


def shape() -> tuple[int, int]:
    """(rows, time), at least two entries."""
    rows = integer(1, 6)
    return rows, integer(1 if rows > 1 else 2, 10)


def grouped_batch() -> tuple[int, int, int]:
    """(groups, group size, time)."""
    return integer(1, 4), integer(2, 4), integer(1, 10)


# --- bookkeeping -----------------------------------------------------------------------------

checks: dict[str, dict[str, float | int]] = {}
examples: dict[str, Any] = {}


def difference(a: Any, b: Any) -> float:
    """max |a − b| over the entries (both as float64 tensors)."""
    a = torch.as_tensor(a, dtype=F64).detach()
    b = torch.as_tensor(b, dtype=F64).detach()
    if a.shape != b.shape:
        raise AssertionError(f"shapes differ: {tuple(a.shape)} and {tuple(b.shape)}")
    return float((a - b).abs().max()) if a.numel() else 0.0


def check(name: str, cases: Callable[[], Iterator[float]]) -> None:
    """Record the largest difference the generator of cases yields, and how many it ran."""
    if name in checks:
        raise AssertionError(f"check {name!r} recorded twice")
    worst, count = 0.0, 0
    for found in cases():
        if math.isnan(found):
            raise AssertionError(f"{name}: NaN difference")
        worst, count = max(worst, found), count + 1
    checks[name] = {"max_abs_diff": worst, "cases": count}


def gradient(loss: torch.Tensor, wrt: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(loss, wrt, allow_unused=True)
    return torch.zeros_like(wrt) if grad is None else grad


def actor_config(**fields: Any) -> ActorConfig:
    """verl's actor config as a standalone call needs it (no batch sizes matter here)."""
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **fields)


def index_of(groups: int, size: int) -> np.ndarray:
    """verl's prompt index: rows g·n … g·n + n − 1 answer prompt g (rlcore's layout)."""
    return np.repeat(np.arange(groups), size)


def rlcore_estimator(
    name: str, rewards: torch.Tensor, mask: torch.Tensor, size: int, **config: Any
):
    batch = AdvantageBatch(rewards, mask, group_size=size, values=config.pop("values", None))
    return ADVANTAGES.get(name)(batch, AdvantageConfig(**config))


# --- advantages ------------------------------------------------------------------------------


def gae_cases() -> Iterator[float]:
    """verl whitens inside the function and leaves carried values at masked positions: the
    advantages and returns are compared on the valid tokens."""
    for _ in range(CASES):
        rows, time = shape()
        mask = mask_of(rows, time, holes=True, min_valid=2)
        rewards, values = normal(rows, time), normal(rows, time)
        gamma, lam = float(uniform(0, 1)), float(uniform(0, 1))
        theirs = core_algos.compute_gae_advantage_return(rewards, values, mask.to(F64), gamma, lam)
        ours = rlcore_estimator("gae", rewards, mask, 1, values=values, gamma=gamma, lam=lam)
        yield difference(theirs[0][mask], ours.advantages[mask])
        yield difference(theirs[1][mask], ours.returns[mask])


def outcome_rewards(mask: torch.Tensor) -> torch.Tensor:
    """A score per row (binary or continuous) on its last valid token, 0 elsewhere."""
    rows = mask.shape[0]
    scores = (torch.rand(rows, generator=GENERATOR) < 0.5).to(F64)
    if integer(0, 1):
        scores = normal(rows)
    return place_on_last_token(scores, mask)


def group_cases(verl_fn: Callable[..., Any], ours: str, **verl_kwargs: Any) -> Iterator[float]:
    for _ in range(CASES):
        groups, size, time = grouped_batch()
        mask = mask_of(groups * size, time, holes=bool(integer(0, 1)))
        rewards = outcome_rewards(mask)
        theirs, _ = verl_fn(rewards, mask.to(F64), index_of(groups, size), **verl_kwargs)
        yield difference(theirs, rlcore_estimator(ours, rewards, mask, size).advantages)


def reinforce_pp_cases() -> Iterator[float]:
    """Token rewards anywhere, also on masked positions (both sides pass over them)."""
    for _ in range(CASES):
        rows, time = shape()
        mask = mask_of(rows, time, holes=True, min_valid=2)
        rewards, gamma = normal(rows, time), float(uniform(0, 1))
        theirs = core_algos.compute_reinforce_plus_plus_outcome_advantage(
            rewards, mask.to(F64), config=AlgoConfig(gamma=gamma)
        )
        ours = rlcore_estimator("reinforce_pp", rewards, mask, 1, gamma=gamma)
        yield difference(theirs[0], ours.advantages)
        yield difference(theirs[1], ours.returns)


def reinforce_pp_baseline_cases(form: str) -> Iterator[float]:
    """``score``: rewards on any valid tokens, any γ given to verl (which does not read it).
    ``reward_to_go``: the outcome on the last valid token and γ = 1, where the forms agree."""
    for _ in range(CASES):
        groups, size, time = grouped_batch()
        mask = mask_of(groups * size, time, holes=bool(integer(0, 1)), min_valid=2)
        if form == "score":
            rewards = torch.where(
                mask & (torch.rand(mask.shape, generator=GENERATOR) < 0.5), normal(*mask.shape), 0.0
            )
        else:
            rewards = outcome_rewards(mask)
        theirs, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
            rewards,
            mask.to(F64),
            index_of(groups, size),
            config=AlgoConfig(gamma=float(uniform(0, 1))),
        )
        ours = rlcore_estimator("reinforce_pp_baseline", rewards, mask, size, baseline_form=form)
        yield difference(theirs, ours.advantages)


def reinforce_pp_baseline_example() -> None:
    """One group of 2, rewards [[0, 1], [0, 0]], γ = 0.9."""
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=F64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    theirs, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
        rewards, mask.to(F64), index_of(1, 2), config=AlgoConfig(gamma=0.9)
    )
    to_go = rlcore_estimator("reinforce_pp_baseline", rewards, mask, 2, gamma=0.9)
    score = rlcore_estimator("reinforce_pp_baseline", rewards, mask, 2, baseline_form="score")
    examples["reinforce_pp_baseline"] = {
        "verl": theirs.tolist(),
        "rlcore_reward_to_go": to_go.advantages.tolist(),
        "rlcore_score": score.advantages.tolist(),
    }


# --- losses ----------------------------------------------------------------------------------


def policy_inputs(holes: bool = True, empty_rows: bool = False, spread: float = 0.5):
    rows, time = shape()
    mask = mask_of(rows, time, holes=holes, empty_rows=empty_rows)
    old = uniform(-8.0, 0.0, rows, time)
    logprobs = (old + spread * normal(rows, time)).requires_grad_(True)
    return logprobs, old, normal(rows, time), mask


def ppo_cases(mode: str) -> Iterator[float]:
    """verl's ``vanilla`` policy loss is PPO's clipped surrogate with its dual clip always on
    (``clip_ratio_c``): rlcore's ``ppo_policy_loss`` with ``dual_clip`` = c. Half the cases
    carry per-token weights (verl's ``rollout_is_weights``)."""
    for _ in range(CASES):
        logprobs, old, advantages, mask = policy_inputs()
        low, high, c = float(uniform(0.05, 0.3)), float(uniform(0.05, 0.4)), float(uniform(1.5, 5))
        weights = uniform(0.0, 2.0, *mask.shape) if integer(0, 1) else None
        config = actor_config(clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c)
        loss, metrics = core_algos.compute_policy_loss_vanilla(
            old, logprobs, advantages, mask.to(F64), mode, config, weights
        )
        out = ppo_policy_loss(logprobs, old, advantages, mask, low, high, c, mode, weights=weights)
        yield difference(loss, out.loss)
        yield difference(gradient(loss, logprobs), gradient(out.loss, logprobs))
        yield difference(metrics["actor/pg_clipfrac"], out.metrics["clipfrac"])
        yield difference(metrics["actor/pg_clipfrac_lower"], out.metrics["dual_clipfrac"])
        yield difference(metrics["actor/ppo_kl"], out.metrics["approx_kl"])


def reinforce_cases(mode: str) -> Iterator[float]:
    """verl's ``compute_policy_loss_reinforce`` (−Â log π, no ratio) is rlcore's
    ``vanilla_policy_loss``."""
    for _ in range(CASES):
        logprobs, old, advantages, mask = policy_inputs()
        weights = uniform(0.0, 2.0, *mask.shape) if integer(0, 1) else None
        loss, _ = core_algos.compute_policy_loss_reinforce(
            old, logprobs, advantages, mask.to(F64), mode, actor_config(), weights
        )
        out = vanilla_policy_loss(logprobs, advantages, mask, mode, weights=weights)
        yield difference(loss, out.loss)
        yield difference(gradient(loss, logprobs), gradient(out.loss, logprobs))


def gspo_cases(mode: str) -> Iterator[float]:
    """Sequence log-ratios stay below verl's clamp at 10 (rlcore's is 20); the clip range is
    the paper's or PPO's size, so both branches are taken."""
    for _ in range(CASES):
        logprobs, old, advantages, mask = policy_inputs(spread=0.3)
        low, high = ((3e-4, 4e-4), (0.2, 0.28))[integer(0, 1)]
        config = actor_config(clip_ratio_low=low, clip_ratio_high=high)
        loss, metrics = core_algos.compute_policy_loss_gspo(
            old, logprobs, advantages, mask.to(F64), mode, config
        )
        out = gspo_policy_loss(logprobs, old, advantages, mask, low, high, mode)
        yield difference(loss, out.loss)
        yield difference(gradient(loss, logprobs), gradient(out.loss, logprobs))
        yield difference(metrics["actor/pg_clipfrac"], out.metrics["clipfrac"])
        yield difference(metrics["actor/ppo_kl"], out.metrics["approx_kl"])


def value_cases(mode: str) -> Iterator[float]:
    """verl's ``compute_value_loss(vpreds, returns, values, ...)``: ½ agg(max of the squared
    errors), rlcore's ``value_loss(values, old_values, returns, clip=c)``."""
    for _ in range(CASES):
        rows, time = shape()
        mask = mask_of(rows, time, holes=True)
        old_values, returns = normal(rows, time), normal(rows, time)
        values = (old_values + 0.5 * normal(rows, time)).requires_grad_(True)
        clip = float(uniform(0.05, 1.0))
        loss, clipfrac = core_algos.compute_value_loss(
            values, returns, old_values, mask.to(F64), clip, mode
        )
        out = value_loss(values, old_values, returns, mask, clip=clip, agg=mode)
        yield difference(loss, out.loss)
        yield difference(gradient(loss, values), gradient(out.loss, values))
        yield difference(clipfrac, out.metrics["vf_clipfrac"])


def aggregate_cases(mode: str, empty_rows: bool) -> Iterator[float]:
    """``agg_loss`` and ``aggregate`` on the same loss; with fully masked rows verl's
    ``seq-mean-token-sum-norm`` counts only the rows with a valid token: rlcore with that
    count times L as ``normalizer`` (its own default counts every row, Dr. GRPO's B · L)."""
    for _ in range(CASES):
        rows, time = shape()
        mask = mask_of(rows, time, holes=True, empty_rows=empty_rows)
        values = normal(rows, time).requires_grad_(True)
        horizon = integer(time, time + 5)
        theirs = core_algos.agg_loss(values, mask.to(F64), mode, loss_scale_factor=horizon)
        normalizer = None
        if mode == "seq-mean-token-sum-norm" and empty_rows:
            normalizer = aggregation_normalizer(mask, "seq-mean-token-sum") * horizon
        ours = aggregate(values, mask, mode, normalizer, horizon=horizon)
        yield difference(theirs, ours)
        yield difference(gradient(theirs, values), gradient(ours, values))


def global_normalizer_cases(mode: str) -> Iterator[float]:
    """Two data-parallel ranks: verl's per-rank ``agg_loss(..., dp_size, batch_num_tokens,
    global_batch_size)``, averaged as DDP averages gradients, against rlcore's whole-batch
    ``aggregate``. verl is given the whole batch's counts (tokens, rows with a valid token)."""
    for _ in range(CASES):
        rows, time = integer(2, 8), integer(1, 10)
        mask = mask_of(rows, time, holes=True, empty_rows=True)
        values = normal(rows, time).requires_grad_(True)
        cut = integer(1, rows - 1)
        counts = {
            "batch_num_tokens": int(mask.sum()),
            "global_batch_size": int(mask.any(dim=-1).sum()),
        }
        parts = [slice(0, cut), slice(cut, rows)]
        theirs = (
            sum(
                core_algos.agg_loss(values[p], mask[p].to(F64), mode, dp_size=2, **counts)
                for p in parts
            )
            / 2
        )
        ours = aggregate(values, mask, mode)
        yield difference(theirs, ours)
        yield difference(gradient(theirs, values), gradient(ours, values))


def aggregation_example() -> None:
    """The docs' loss [[1, 1, 1, 1], [4, 0, 0, 0]] with mask [[1, 1, 1, 1], [1, 0, 0, 0]]."""
    loss = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    examples["seq-mean-token-sum-norm"] = {
        "verl": float(core_algos.agg_loss(loss, mask.to(F64), "seq-mean-token-sum-norm")),
        "rlcore": float(aggregate(loss, mask, "seq-mean-token-sum-norm")),
        "rlcore_normalizer_L": float(aggregate(loss, mask, "seq-mean-token-sum-norm", 4.0)),
    }


def kl_cases(kind: str) -> Iterator[float]:
    """verl's ``kl_penalty(logprob, ref_logprob, kind)`` clamps ``low_var_kl`` / ``k3`` at ±10:
    rlcore's ``kl_estimate`` with ``clamp=10`` for those kinds. Log-probabilities down to −30
    reach the clamp. Gradients with respect to both arguments."""
    base = kind.rstrip("+")
    for _ in range(CASES):
        rows, time = shape()
        logprobs = uniform(-30.0, 0.0, rows, time).requires_grad_(True)
        ref = uniform(-30.0, 0.0, rows, time).requires_grad_(True)
        weights = normal(rows, time)
        clamp = 10.0 if base in ("low_var_kl", "k3") else None
        theirs = core_algos.kl_penalty(logprobs, ref, kind)
        ours = kl_estimate(logprobs, ref, kind, clamp=clamp)
        yield difference(theirs, ours)
        their_grads = torch.autograd.grad((weights * theirs).sum(), (logprobs, ref))
        our_grads = torch.autograd.grad((weights * ours).sum(), (logprobs, ref))
        for their_grad, our_grad in zip(their_grads, our_grads, strict=True):
            yield difference(their_grad, our_grad)


def main() -> None:
    check("gae", gae_cases)
    check(
        "grpo",
        lambda: group_cases(core_algos.compute_grpo_outcome_advantage, "grpo", epsilon=1e-6),
    )
    check(
        "dr_grpo",
        lambda: group_cases(
            core_algos.compute_grpo_outcome_advantage, "dr_grpo", norm_adv_by_std_in_grpo=False
        ),
    )
    check("rloo", lambda: group_cases(core_algos.compute_rloo_outcome_advantage, "rloo"))
    check("reinforce_pp", reinforce_pp_cases)
    check("reinforce_pp_baseline[score]", lambda: reinforce_pp_baseline_cases("score"))
    check(
        "reinforce_pp_baseline[reward_to_go, gamma=1, outcome]",
        lambda: reinforce_pp_baseline_cases("reward_to_go"),
    )
    reinforce_pp_baseline_example()
    for mode in MODES:
        check(f"ppo_dual_clip[{mode}]", lambda mode=mode: ppo_cases(mode))
        check(f"vanilla[{mode}]", lambda mode=mode: reinforce_cases(mode))
        check(f"gspo[{mode}]", lambda mode=mode: gspo_cases(mode))
        check(f"value_loss[{mode}]", lambda mode=mode: value_cases(mode))
        check(f"aggregate[{mode}]", lambda mode=mode: aggregate_cases(mode, empty_rows=False))
        check(
            f"aggregate[{mode}, fully masked rows]",
            lambda mode=mode: aggregate_cases(mode, empty_rows=True),
        )
        if mode != "seq-mean-token-sum-norm":
            check(f"global_normalizer[{mode}]", lambda mode=mode: global_normalizer_cases(mode))
    aggregation_example()
    for kind in KL_KINDS:
        check(f"kl[{kind}]", lambda kind=kind: kl_cases(kind))
    print(json.dumps({"verl": verl.__version__, "checks": checks, "examples": examples}))


if __name__ == "__main__":
    main()
