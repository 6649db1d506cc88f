"""The JAX twins agree with the torch functions on hypothesis-generated inputs.

Each test draws inputs with rlcore.testing's strategies, runs the torch function
and its twin on the same values and compares them: to 1e-5 in float32 and to
1e-10 in float64 (``jax_enable_x64`` and torch's default dtype switched for the
example only), both relative to the scale of the result. In float64 the
gradients are compared too, ``jax.grad`` against ``torch.autograd.grad``, on
the examples that draw ``gradients=True`` (about half: they cost the most).

Hypothesis draws the values at one fixed shape per kind of input: JAX compiles
each operation once per shape, and free shapes would spend the suite's time
compiling. The edge cases live in the values (masks with holes and fully
masked rows, terminations and truncations anywhere, groups of equal scores);
`test_the_smallest_shapes_agree` covers single steps and single rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, get_args

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch import Tensor

from rlcore import _scan, advantages, distributions, logprobs, losses, masked, normalize
from rlcore.jax import _scan as jscan
from rlcore.jax import advantages as jadvantages
from rlcore.jax import distributions as jdistributions
from rlcore.jax import logprobs as jlogprobs
from rlcore.jax import losses as jlosses
from rlcore.jax import masked as jmasked
from rlcore.jax import normalize as jnormalize
from rlcore.losses import KLKind
from rlcore.masked import AggregationMode
from rlcore.testing import (
    CategoricalBatch,
    GaussianBatch,
    TokenBatch,
    Trajectory,
    categorical_batches,
    gaussian_batches,
    group_scores,
    token_batches,
    trajectories,
)

F32, F64 = torch.float32, torch.float64
TOLERANCE = {F32: 1e-5, F64: 1e-10}
PRECISIONS = pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])

MODES: list[AggregationMode] = list(get_args(AggregationMode))
KINDS: list[KLKind] = list(get_args(KLKind))

TOKEN_SHAPES = [(4, 8)]
TRAJECTORY_SHAPES = [(3, 16)]
GROUP_SHAPES = [(4, 6)]
LOGIT_SHAPES = [(2, 5, 11)]  # batch, time, vocab: 10 rows, so chunks of 3 leave a remainder
ACTION_SHAPES = [(5, 6)]  # batch, actions (or action dimensions)


def token_cases(**options: Any) -> st.SearchStrategy[TokenBatch]:
    return st.sampled_from(TOKEN_SHAPES).flatmap(
        lambda s: token_batches(
            min_batch=s[0], max_batch=s[0], min_time=s[1], max_time=s[1], **options
        )
    )


def trajectory_cases(**options: Any) -> st.SearchStrategy[Trajectory]:
    return st.sampled_from(TRAJECTORY_SHAPES).flatmap(
        lambda s: trajectories(
            min_batch=s[0], max_batch=s[0], min_time=s[1], max_time=s[1], **options
        )
    )


def score_cases() -> st.SearchStrategy[Tensor]:
    return st.sampled_from(GROUP_SHAPES).flatmap(
        lambda s: group_scores(
            min_groups=s[0], max_groups=s[0], min_group_size=s[1], max_group_size=s[1]
        )
    )


def arrays(
    shape: tuple[int, ...], low: float = -10.0, high: float = 10.0
) -> st.SearchStrategy[Tensor]:
    elements = st.floats(low, high, allow_nan=False, allow_infinity=False)
    return hnp.arrays(np.float64, shape, elements=elements, fill=st.nothing()).map(torch.from_numpy)


# The smallest input is a whole batch of the fixed shape, on purpose (see the docstring).
FIXED_SHAPE = settings(
    suppress_health_check=[*settings().suppress_health_check, HealthCheck.large_base_example]
)

discounts = st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0])
clip_ranges = st.floats(0.05, 0.5)
dual_clips = st.none() | st.floats(1.5, 5.0)
normalizers = st.none() | st.floats(0.5, 50.0)


@contextlib.contextmanager
def precision(dtype: torch.dtype) -> Iterator[None]:
    """float64 in both frameworks (x64 in JAX, torch's default dtype), or float32."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with jax.enable_x64(dtype == F64):
            yield
    finally:
        torch.set_default_dtype(previous)


def cast(tensor: Tensor, dtype: torch.dtype) -> Tensor:
    """``tensor`` in ``dtype``, values below √tiny (≈1e-19 in float32) flushed to 0.

    XLA on CPU flushes subnormal results to zero where torch keeps them: an
    advantage of 1e-308 times a ratio of 0.5 is 0 in JAX and not in torch, and
    the clip flag flips. That is the backends' arithmetic, not the twins', so
    the inputs both receive are flushed where products could go subnormal.
    """
    tensor = tensor.to(dtype)
    if not tensor.is_floating_point():
        return tensor
    return torch.where(tensor.abs() < torch.finfo(dtype).tiny ** 0.5, 0.0, tensor)


def to_jax(tensor: Tensor) -> jax.Array:
    return jnp.asarray(tensor.detach().numpy())


def agree(
    got: Any, want: Tensor, dtype: torch.dtype, name: str, scale: float | None = None
) -> None:
    """``got`` (JAX) equals ``want`` (torch): dtype, shape, and value to the tolerance."""
    expected = want.detach().to(F64).numpy()
    actual = np.asarray(got)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    assert str(actual.dtype) == str(want.dtype).removeprefix("torch."), f"{name}: {actual.dtype}"
    if scale is None:
        finite = np.abs(expected[np.isfinite(expected)])
        scale = max(1.0, float(finite.max(initial=0.0)))
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(
        actual.astype(np.float64), expected, rtol=tolerance, atol=tolerance * scale, err_msg=name
    )


def outputs_agree(got: Any, want: Any, dtype: torch.dtype, name: str) -> None:
    """A LossOutput, Advantages or TokenStats and its twin: every field and metric."""
    if isinstance(want, Tensor):
        agree(got, want, dtype, name)
    elif hasattr(want, "metrics"):
        agree(got.loss, want.loss, dtype, f"{name}.loss")
        assert set(got.metrics) == set(want.metrics), name
        for key, value in want.metrics.items():
            agree(got.metrics[key], value, dtype, f"{name}.metrics[{key}]")
    else:
        for field in type(want).__attrs_attrs__:
            agree(
                getattr(got, field.name), getattr(want, field.name), dtype, f"{name}.{field.name}"
            )


def weights(shape: Sequence[int], dtype: torch.dtype) -> Tensor:
    """A fixed cotangent, so a vector output reduces to a scalar with every entry weighted."""
    count = int(np.prod(shape))
    return torch.linspace(-1.0, 2.0, max(count, 1), dtype=dtype)[:count].reshape(tuple(shape))


def gradients_agree(
    torch_fn: Callable[..., Tensor],
    jax_fn: Callable[..., jax.Array],
    inputs: Sequence[Tensor],
    name: str,
) -> None:
    """∂/∂inputs of a scalar function in both frameworks (float64 only)."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    want = torch.autograd.grad(torch_fn(*leaves), leaves, allow_unused=True)
    got = jax.grad(jax_fn, argnums=tuple(range(len(inputs))))(*(to_jax(x) for x in inputs))
    for index, (g, w, x) in enumerate(zip(got, want, leaves, strict=True)):
        agree(g, torch.zeros_like(x) if w is None else w, F64, f"{name}: gradient {index}")


# ---------------------------------------------------------------------------
# masked


@PRECISIONS
@FIXED_SHAPE
@given(
    batch=token_cases(),
    axis=st.sampled_from([None, -1, 0]),
    unbiased=st.booleans(),
    shift_mean=st.booleans(),
    float_mask=st.booleans(),
    gradients=st.booleans(),
)
def test_masked_reductions(
    dtype: torch.dtype,
    batch: TokenBatch,
    axis: int | None,
    unbiased: bool,
    shift_mean: bool,
    float_mask: bool,
    gradients: bool,
) -> None:
    with precision(dtype):
        values = cast(batch.values, dtype)
        mask = cast(batch.mask, dtype) if float_mask else batch.mask
        x, m = to_jax(values), to_jax(mask)
        agree(jmasked.masked_sum(x, m, axis), masked.masked_sum(values, mask, axis), dtype, "sum")
        agree(
            jmasked.masked_mean(x, m, axis), masked.masked_mean(values, mask, axis), dtype, "mean"
        )
        variance = masked.masked_var(values, mask, unbiased)
        agree(jmasked.masked_var(x, m, unbiased), variance, dtype, "var")
        # Whitening divides rounding errors of the mean by σ: compare on that scale.
        spread = float(masked.masked_var(values, mask) + 1e-8) ** 0.5
        agree(
            jmasked.masked_whiten(x, m, shift_mean),
            masked.masked_whiten(values, mask, shift_mean),
            dtype,
            "whiten",
            scale=max(1.0, float(values.abs().max())) / spread,
        )
        if dtype == F64 and gradients:
            w = weights(values.shape, dtype)
            gradients_agree(
                lambda v: masked.masked_mean(v, mask, axis).sum(),
                lambda v: jmasked.masked_mean(v, m, axis).sum(),
                [values],
                "masked_mean",
            )
            gradients_agree(
                lambda v: masked.masked_var(v, mask, unbiased),
                lambda v: jmasked.masked_var(v, m, unbiased),
                [values],
                "masked_var",
            )
            gradients_agree(
                lambda v: (w * masked.masked_whiten(v, mask, shift_mean)).sum(),
                lambda v: (to_jax(w) * jmasked.masked_whiten(v, m, shift_mean)).sum(),
                [values],
                "masked_whiten",
            )


@PRECISIONS
@FIXED_SHAPE
@given(
    batch=token_cases(),
    mode=st.sampled_from(MODES),
    normalizer=normalizers,
    horizon=st.none() | st.integers(1, 20),
    gradients=st.booleans(),
)
def test_aggregate(
    dtype: torch.dtype,
    batch: TokenBatch,
    mode: AggregationMode,
    normalizer: float | None,
    horizon: int | None,
    gradients: bool,
) -> None:
    with precision(dtype):
        values, mask = cast(batch.values, dtype), batch.mask
        x, m = to_jax(values), to_jax(mask)
        agree(
            jmasked.aggregation_normalizer(m, mode, horizon),
            masked.aggregation_normalizer(mask, mode, horizon),
            dtype,
            "normalizer",
        )
        agree(
            jmasked.aggregate(x, m, mode, normalizer, horizon),
            masked.aggregate(values, mask, mode, normalizer, horizon),
            dtype,
            "aggregate",
        )
        if dtype == F64 and gradients:
            gradients_agree(
                lambda v: masked.aggregate(v, mask, mode, normalizer, horizon),
                lambda v: jmasked.aggregate(v, m, mode, normalizer, horizon),
                [values],
                "aggregate",
            )


# ---------------------------------------------------------------------------
# advantages


@PRECISIONS
@FIXED_SHAPE
@given(
    trajectory=st.booleans().flatmap(lambda c: trajectory_cases(consistent_values=c)),
    gamma=discounts,
    lam=discounts,
    bootstrap=st.booleans(),
)
def test_gae_and_discounted_returns(
    dtype: torch.dtype, trajectory: Trajectory, gamma: float, lam: float, bootstrap: bool
) -> None:
    with precision(dtype):
        r, v, nv = (
            cast(t, dtype) for t in (trajectory.rewards, trajectory.values, trajectory.next_values)
        )
        term, trunc = trajectory.terminated, trajectory.truncated
        jr, jv, jnv, jterm, jtrunc = (to_jax(t) for t in (r, v, nv, term, trunc))
        outputs_agree(
            jadvantages.gae(jr, jv, jnv, jterm, jtrunc, gamma, lam),
            advantages.gae(r, v, nv, term, trunc, gamma, lam),
            dtype,
            "gae",
        )
        agree(
            jadvantages.discounted_returns(jr, jterm, jtrunc, gamma, jnv if bootstrap else None),
            advantages.discounted_returns(r, term, trunc, gamma, nv if bootstrap else None),
            dtype,
            "discounted_returns",
        )


@PRECISIONS
@FIXED_SHAPE
@given(batch=token_cases(), gamma=discounts, lam=discounts, baseline=st.booleans())
def test_token_estimators(
    dtype: torch.dtype, batch: TokenBatch, gamma: float, lam: float, baseline: bool
) -> None:
    with precision(dtype):
        rewards, values, mask = (
            cast(batch.token_rewards, dtype),
            cast(batch.values, dtype),
            batch.mask,
        )
        jr, jv, m = to_jax(rewards), to_jax(values), to_jax(mask)
        outputs_agree(
            jadvantages.token_gae(jr, jv, m, gamma, lam),
            advantages.token_gae(rewards, values, mask, gamma, lam),
            dtype,
            "token_gae",
        )
        b = values[:, 0] if baseline else None
        want = advantages.reinforce_pp(rewards, mask, gamma, b)
        got = jadvantages.reinforce_pp(jr, m, gamma, None if b is None else to_jax(b))
        agree(got.returns, want.returns, dtype, "reinforce_pp.returns")
        centred = want.returns if b is None else want.returns - b.unsqueeze(-1)
        spread = float(masked.masked_var(centred, mask) + 1e-8) ** 0.5
        scale = max(1.0, float(centred.abs().max())) / spread
        agree(got.advantages, want.advantages, dtype, "reinforce_pp.advantages", scale=scale)
        for with_mask in (True, False):
            student, teacher = cast(batch.logprobs, dtype), cast(batch.ref_logprobs, dtype)
            agree(
                jadvantages.on_policy_distillation(
                    to_jax(student), to_jax(teacher), m if with_mask else None
                ),
                advantages.on_policy_distillation(student, teacher, mask if with_mask else None),
                dtype,
                "on_policy_distillation",
            )


@PRECISIONS
@FIXED_SHAPE
@given(
    scores=score_cases(),
    std_normalize=st.booleans(),
    eps=st.sampled_from([0.0, 1e-6, 1e-4]),
    unbiased=st.booleans(),
)
def test_group_estimators(
    dtype: torch.dtype, scores: Tensor, std_normalize: bool, eps: float, unbiased: bool
) -> None:
    with precision(dtype):
        s = cast(scores, dtype)
        want = advantages.group_normalized(s, std_normalize, eps, unbiased)
        got = jadvantages.group_normalized(to_jax(s), std_normalize, eps, unbiased)
        scale = max(1.0, float(s.abs().max()))
        if std_normalize:  # rounding in the mean is divided by each group's std
            std = s.std(dim=-1, unbiased=unbiased) + eps
            varies = (s != s[:, :1]).any(dim=-1)
            if bool(varies.any()):
                scale /= float(std[varies].min())
        agree(got, want, dtype, "group_normalized", scale=scale)
        assert np.all(np.asarray(got)[~(s != s[:, :1]).any(dim=-1).numpy()] == 0.0)
        agree(jadvantages.rloo(to_jax(s)), advantages.rloo(s), dtype, "rloo")


def test_estimators_pass_no_gradient() -> None:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=TOKEN_SHAPES[0]), jnp.float32)
    mask = jnp.asarray(rng.random(TOKEN_SHAPES[0]) < 0.7)
    estimators: list[Callable[[jax.Array], jax.Array]] = [
        lambda r: jadvantages.gae(r, r, r, mask, ~mask, 0.9, 0.9).advantages,
        lambda r: jadvantages.token_gae(r, r, mask, 0.9, 0.9).returns,
        lambda r: jadvantages.discounted_returns(r, mask, ~mask, 0.9, r),
        lambda r: jadvantages.group_normalized(r),
        lambda r: jadvantages.rloo(r),
        lambda r: jadvantages.reinforce_pp(r, mask, 0.9, r[:, 0]).advantages,
        lambda r: jadvantages.on_policy_distillation(r, 2 * r, mask),
    ]
    for estimator in estimators:
        assert np.any(np.asarray(estimator(x)) != 0)
        grad = jax.grad(lambda r, f=estimator: (f(r) * r).sum())(x)
        # Only the explicit factor r carries a gradient: the estimate is a constant.
        np.testing.assert_allclose(np.asarray(grad), np.asarray(estimator(x)), rtol=1e-6)


# ---------------------------------------------------------------------------
# losses


@PRECISIONS
@FIXED_SHAPE
@given(
    batch=token_cases(),
    clip_low=clip_ranges,
    clip_high=st.none() | clip_ranges,
    dual_clip=dual_clips,
    agg=st.sampled_from(MODES),
    normalizer=normalizers,
    cap=st.none() | st.floats(0.5, 3.0),
    gradients=st.booleans(),
)
def test_ppo_family(
    dtype: torch.dtype,
    batch: TokenBatch,
    clip_low: float,
    clip_high: float | None,
    dual_clip: float | None,
    agg: AggregationMode,
    normalizer: float | None,
    cap: float | None,
    gradients: bool,
) -> None:
    with precision(dtype):
        lp, old, behavior, adv = (
            cast(t, dtype)
            for t in (batch.logprobs, batch.old_logprobs, batch.ref_logprobs, batch.advantages)
        )
        mask = batch.mask
        jold, jbehavior, jadv, m = (to_jax(t) for t in (old, behavior, adv, mask))

        def ppo(x: Tensor) -> Any:
            return losses.ppo_policy_loss(
                x, old, adv, mask, clip_low, clip_high, dual_clip, agg, normalizer
            )

        def jppo(x: jax.Array) -> Any:
            return jlosses.ppo_policy_loss(
                x, jold, jadv, m, clip_low, clip_high, dual_clip, agg, normalizer
            )

        def decoupled(x: Tensor) -> Any:
            return losses.decoupled_ppo_policy_loss(
                x, old, behavior, adv, mask, clip_low, clip_high, dual_clip, cap, agg, normalizer
            )

        def jdecoupled(x: jax.Array) -> Any:
            return jlosses.decoupled_ppo_policy_loss(
                x, jold, jbehavior, jadv, m, clip_low, clip_high, dual_clip, cap, agg, normalizer
            )

        def vanilla(x: Tensor) -> Any:
            return losses.vanilla_policy_loss(x, adv, mask, agg, normalizer)

        def jvanilla(x: jax.Array) -> Any:
            return jlosses.vanilla_policy_loss(x, jadv, m, agg, normalizer)

        for name, reference, twin in [
            ("ppo", ppo, jppo),
            ("decoupled_ppo", decoupled, jdecoupled),
            ("vanilla", vanilla, jvanilla),
        ]:
            outputs_agree(twin(to_jax(lp)), reference(lp), dtype, name)
            if dtype == F64 and gradients:
                gradients_agree(
                    lambda x, f=reference: f(x).loss, lambda x, f=twin: f(x).loss, [lp], name
                )


@PRECISIONS
@FIXED_SHAPE
@given(
    batch=token_cases(),
    clip=st.sampled_from([(3e-4, 4e-4), (0.2, 0.28)]),
    agg=st.sampled_from(MODES),
    normalizer=normalizers,
    gradients=st.booleans(),
)
def test_gspo(
    dtype: torch.dtype,
    batch: TokenBatch,
    clip: tuple[float, float],
    agg: AggregationMode,
    normalizer: float | None,
    gradients: bool,
) -> None:
    with precision(dtype):
        lp, old, adv = (
            cast(t, dtype) for t in (batch.logprobs, batch.old_logprobs, batch.advantages)
        )
        mask = batch.mask
        jold, jadv, m = to_jax(old), to_jax(adv), to_jax(mask)
        outputs_agree(
            jlosses.gspo_policy_loss(to_jax(lp), jold, jadv, m, *clip, agg, normalizer),
            losses.gspo_policy_loss(lp, old, adv, mask, *clip, agg, normalizer),
            dtype,
            "gspo",
        )
        if dtype == F64 and gradients:
            gradients_agree(
                lambda x: losses.gspo_policy_loss(x, old, adv, mask, *clip, agg, normalizer).loss,
                lambda x: jlosses.gspo_policy_loss(x, jold, jadv, m, *clip, agg, normalizer).loss,
                [lp],
                "gspo",
            )


@PRECISIONS
@FIXED_SHAPE
@given(
    batch=token_cases(),
    clip=st.none() | st.floats(0.05, 2.0),
    huber_delta=st.none() | st.floats(0.1, 5.0),
    agg=st.sampled_from(MODES),
    normalizer=normalizers,
    gradients=st.booleans(),
)
def test_value_loss(
    dtype: torch.dtype,
    batch: TokenBatch,
    clip: float | None,
    huber_delta: float | None,
    agg: AggregationMode,
    normalizer: float | None,
    gradients: bool,
) -> None:
    with precision(dtype):
        values, old, returns = (
            cast(t, dtype) for t in (batch.values, batch.old_values, batch.returns)
        )
        mask = batch.mask
        jold, jreturns, m = to_jax(old), to_jax(returns), to_jax(mask)
        outputs_agree(
            jlosses.value_loss(
                to_jax(values), jold, jreturns, m, clip, huber_delta, agg, normalizer
            ),
            losses.value_loss(values, old, returns, mask, clip, huber_delta, agg, normalizer),
            dtype,
            "value_loss",
        )
        if dtype == F64 and gradients:
            gradients_agree(
                lambda v: (
                    losses.value_loss(
                        v, old, returns, mask, clip, huber_delta, agg, normalizer
                    ).loss
                ),
                lambda v: (
                    jlosses.value_loss(
                        v, jold, jreturns, m, clip, huber_delta, agg, normalizer
                    ).loss
                ),
                [values],
                "value_loss",
            )


@PRECISIONS
@FIXED_SHAPE
@given(
    batch=token_cases(),
    kind=st.sampled_from(KINDS),
    clamp=st.none() | st.floats(0.05, 10.0),
    agg=st.sampled_from(MODES),
    normalizer=normalizers,
    gradients=st.booleans(),
)
def test_kl_entropy_and_sft(
    dtype: torch.dtype,
    batch: TokenBatch,
    kind: KLKind,
    clamp: float | None,
    agg: AggregationMode,
    normalizer: float | None,
    gradients: bool,
) -> None:
    with precision(dtype):
        lp, ref = cast(batch.logprobs, dtype), cast(batch.ref_logprobs, dtype)
        mask, m = batch.mask, to_jax(batch.mask)
        agree(
            jlosses.kl_estimate(to_jax(lp), to_jax(ref), kind, clamp),
            losses.kl_estimate(lp, ref, kind, clamp),
            dtype,
            f"kl {kind}",
        )
        entropy = -lp  # any non-negative per-token values
        outputs_agree(
            jlosses.entropy_loss(to_jax(entropy), m, agg, normalizer),
            losses.entropy_loss(entropy, mask, agg, normalizer),
            dtype,
            "entropy_loss",
        )
        outputs_agree(
            jlosses.sft_loss(to_jax(lp), m, agg, normalizer),
            losses.sft_loss(lp, mask, agg, normalizer),
            dtype,
            "sft_loss",
        )
        if dtype == F64 and gradients:
            w = weights(lp.shape, dtype)
            gradients_agree(
                lambda a, b: (w * losses.kl_estimate(a, b, kind, clamp)).sum(),
                lambda a, b: (to_jax(w) * jlosses.kl_estimate(a, b, kind, clamp)).sum(),
                [lp, ref],
                f"kl {kind}",
            )
            gradients_agree(
                lambda h: losses.entropy_loss(h, mask, agg, normalizer).loss,
                lambda h: jlosses.entropy_loss(h, m, agg, normalizer).loss,
                [entropy],
                "entropy_loss",
            )
            gradients_agree(
                lambda x: losses.sft_loss(x, mask, agg, normalizer).loss,
                lambda x: jlosses.sft_loss(x, m, agg, normalizer).loss,
                [lp],
                "sft_loss",
            )


@PRECISIONS
@FIXED_SHAPE
@given(
    rewards=arrays((4,)),
    next_q=arrays((4, 2)),
    q=arrays((4, 2)),
    next_logprobs=arrays((4,), -5.0, 0.0),
    terminated=hnp.arrays(np.bool_, (4,)).map(torch.from_numpy),
    gamma=discounts,
    alpha=st.floats(0.0, 1.0),
    alpha_as_array=st.booleans(),
    log_alpha=st.floats(-5.0, 1.0),
    target_entropy=st.floats(-4.0, 0.0),
    gradients=st.booleans(),
)
def test_sac_losses(
    dtype: torch.dtype,
    rewards: Tensor,
    next_q: Tensor,
    q: Tensor,
    next_logprobs: Tensor,
    terminated: Tensor,
    gamma: float,
    alpha: float,
    alpha_as_array: bool,
    log_alpha: float,
    target_entropy: float,
    gradients: bool,
) -> None:
    with precision(dtype):
        r, nq, q, nlp = (cast(t, dtype) for t in (rewards, next_q, q, next_logprobs))
        a: float | Tensor = torch.tensor(alpha, dtype=dtype) if alpha_as_array else alpha
        ja: float | jax.Array = to_jax(a) if isinstance(a, Tensor) else a
        target = losses.sac_critic_target(r, nq, nlp, terminated, gamma, a)
        agree(
            jlosses.sac_critic_target(
                to_jax(r), to_jax(nq), to_jax(nlp), to_jax(terminated), gamma, ja
            ),
            target,
            dtype,
            "sac_critic_target",
        )
        la = torch.tensor(log_alpha, dtype=dtype)
        outputs_agree(
            jlosses.sac_critic_loss(to_jax(q), to_jax(target)),
            losses.sac_critic_loss(q, target),
            dtype,
            "critic",
        )
        outputs_agree(
            jlosses.sac_actor_loss(to_jax(nlp), to_jax(q), ja),
            losses.sac_actor_loss(nlp, q, a),
            dtype,
            "actor",
        )
        outputs_agree(
            jlosses.sac_temperature_loss(to_jax(la), to_jax(nlp), target_entropy),
            losses.sac_temperature_loss(la, nlp, target_entropy),
            dtype,
            "temperature",
        )
        if dtype == F64 and gradients:
            gradients_agree(
                lambda x, y: losses.sac_critic_loss(x, y).loss,
                lambda x, y: jlosses.sac_critic_loss(x, y).loss,
                [q, target],
                "sac_critic_loss",
            )
            gradients_agree(
                lambda x, y: losses.sac_actor_loss(x, y, a).loss,
                lambda x, y: jlosses.sac_actor_loss(x, y, ja).loss,
                [nlp, q],
                "sac_actor_loss",
            )
            gradients_agree(
                lambda x, y: losses.sac_temperature_loss(x, y, target_entropy).loss,
                lambda x, y: jlosses.sac_temperature_loss(x, y, target_entropy).loss,
                [la, nlp],
                "sac_temperature_loss",
            )


# ---------------------------------------------------------------------------
# logprobs


@st.composite
def logit_cases(draw: st.DrawFn) -> tuple[Tensor, Tensor]:
    batch, time, vocab = draw(st.sampled_from(LOGIT_SHAPES))
    logits = draw(arrays((batch, time, vocab), -8.0, 8.0))
    tokens = draw(hnp.arrays(np.int64, (batch, time), elements=st.integers(0, vocab - 1)))
    return logits, torch.from_numpy(tokens)


@PRECISIONS
@FIXED_SHAPE
@given(
    case=logit_cases(),
    temperature=st.sampled_from([1.0, 0.6]),
    chunk_size=st.sampled_from([None, 3]),  # 3 rows: whole chunks and a remainder,
    gradients=st.booleans(),
)
def test_logit_stats(
    dtype: torch.dtype,
    case: tuple[Tensor, Tensor],
    temperature: float,
    chunk_size: int | None,
    gradients: bool,
) -> None:
    with precision(dtype):
        logits, tokens = cast(case[0], dtype), case[1]
        jl, jt = to_jax(logits), to_jax(tokens)
        agree(
            jlogprobs.token_logprobs(jl, jt, temperature, chunk_size),
            logprobs.token_logprobs(logits, tokens, temperature, chunk_size),
            dtype,
            "token_logprobs",
        )
        agree(
            jlogprobs.entropy_from_logits(jl, chunk_size, temperature),
            logprobs.entropy_from_logits(logits, chunk_size, temperature),
            dtype,
            "entropy_from_logits",
        )
        outputs_agree(
            jlogprobs.token_stats(jl, jt, temperature, chunk_size),
            logprobs.token_stats(logits, tokens, temperature, chunk_size),
            dtype,
            "token_stats",
        )
        if dtype == F64 and gradients:
            w = weights(tokens.shape, dtype)
            jw = to_jax(w)

            def reference(z: Tensor) -> Tensor:
                stats = logprobs.token_stats(z, tokens, temperature, chunk_size)
                return (w * stats.logprobs + w.flip(-1) * stats.entropy).sum()

            def twin(z: jax.Array) -> jax.Array:
                stats = jlogprobs.token_stats(z, jt, temperature, chunk_size)
                return (jw * stats.logprobs + jnp.flip(jw, -1) * stats.entropy).sum()

            gradients_agree(reference, twin, [logits], "token_stats")


@PRECISIONS
@FIXED_SHAPE
@given(
    case=logit_cases(),
    temperature=st.just(0.6),  # test_logit_stats covers τ = 1 on the same code path
    chunk_size=st.sampled_from([4, 1024]),
    gradients=st.booleans(),
)
def test_hidden_stats(
    dtype: torch.dtype,
    case: tuple[Tensor, Tensor],
    temperature: float,
    chunk_size: int,
    gradients: bool,
) -> None:
    logits, tokens = case
    vocab = logits.shape[-1]
    generator = torch.Generator().manual_seed(int(logits.abs().sum() * 1000) % 2**31)
    hidden = torch.randn(*tokens.shape, 4, generator=generator, dtype=F64)
    weight = torch.randn(vocab, 4, generator=generator, dtype=F64)
    with precision(dtype):
        h, w = cast(hidden, dtype), cast(weight, dtype)
        jh, jw, jt = to_jax(h), to_jax(w), to_jax(tokens)
        agree(
            jlogprobs.token_logprobs_from_hidden(jh, jw, jt, temperature, chunk_size),
            logprobs.token_logprobs_from_hidden(h, w, tokens, temperature, chunk_size),
            dtype,
            "token_logprobs_from_hidden",
        )
        agree(
            jlogprobs.entropy_from_hidden(jh, jw, temperature, chunk_size),
            logprobs.entropy_from_hidden(h, w, temperature, chunk_size),
            dtype,
            "entropy_from_hidden",
        )
        outputs_agree(
            jlogprobs.token_stats_from_hidden(jh, jw, jt, temperature, chunk_size),
            logprobs.token_stats_from_hidden(h, w, tokens, temperature, chunk_size),
            dtype,
            "token_stats_from_hidden",
        )
        if dtype == F64 and gradients:
            cotangent = weights(tokens.shape, dtype)
            jcotangent = to_jax(cotangent)

            def reference(x: Tensor, y: Tensor) -> Tensor:
                stats = logprobs.token_stats_from_hidden(x, y, tokens, temperature, chunk_size)
                return (cotangent * stats.logprobs - stats.entropy).sum()

            def twin(x: jax.Array, y: jax.Array) -> jax.Array:
                stats = jlogprobs.token_stats_from_hidden(x, y, jt, temperature, chunk_size)
                return (jcotangent * stats.logprobs - stats.entropy).sum()

            gradients_agree(reference, twin, [h, w], "token_stats_from_hidden")


# ---------------------------------------------------------------------------
# distributions


def categorical_cases() -> st.SearchStrategy[CategoricalBatch]:
    return st.sampled_from(ACTION_SHAPES).flatmap(
        lambda s: categorical_batches(
            min_batch=s[0], max_batch=s[0], min_actions=s[1], max_actions=s[1]
        )
    )


def gaussian_cases() -> st.SearchStrategy[GaussianBatch]:
    return st.sampled_from(ACTION_SHAPES).flatmap(
        lambda s: gaussian_batches(min_batch=s[0], max_batch=s[0], min_dim=s[1], max_dim=s[1])
    )


@PRECISIONS
@FIXED_SHAPE
@given(batch=categorical_cases(), gradients=st.booleans())
def test_categorical(dtype: torch.dtype, batch: CategoricalBatch, gradients: bool) -> None:
    with precision(dtype):
        logits, actions = cast(batch.logits, dtype), batch.actions
        jl, ja = to_jax(logits), to_jax(actions)
        agree(
            jdistributions.categorical_log_prob(jl, ja),
            distributions.categorical_log_prob(logits, actions),
            dtype,
            "categorical_log_prob",
        )
        agree(
            jdistributions.categorical_entropy(jl),
            distributions.categorical_entropy(logits),
            dtype,
            "categorical_entropy",
        )
        if dtype == F64 and gradients:
            w = weights(actions.shape, dtype)
            jw = to_jax(w)

            def reference(z: Tensor) -> Tensor:
                log_prob = distributions.categorical_log_prob(z, actions)
                return (w * log_prob + w.flip(-1) * distributions.categorical_entropy(z)).sum()

            def twin(z: jax.Array) -> jax.Array:
                log_prob = jdistributions.categorical_log_prob(z, ja)
                entropy = jdistributions.categorical_entropy(z)
                return (jw * log_prob + jnp.flip(jw, -1) * entropy).sum()

            gradients_agree(reference, twin, [logits], "categorical")


@PRECISIONS
@FIXED_SHAPE
@given(batch=gaussian_cases(), gradients=st.booleans())
def test_gaussian_and_tanh_gaussian(
    dtype: torch.dtype, batch: GaussianBatch, gradients: bool
) -> None:
    with precision(dtype):
        x, mean, log_std = (cast(t, dtype) for t in (batch.x, batch.mean, batch.log_std))
        jx, jmean, jlog_std = to_jax(x), to_jax(mean), to_jax(log_std)
        agree(
            jdistributions.gaussian_log_prob(jx, jmean, jlog_std),
            distributions.gaussian_log_prob(x, mean, log_std),
            dtype,
            "gaussian_log_prob",
        )
        agree(
            jdistributions.gaussian_entropy(jlog_std),
            distributions.gaussian_entropy(log_std),
            dtype,
            "gaussian_entropy",
        )
        agree(
            jdistributions.tanh_gaussian_log_prob(jx, jmean, jlog_std),
            distributions.tanh_gaussian_log_prob(x, mean, log_std),
            dtype,
            "tanh_gaussian_log_prob",
        )
        if dtype == F64 and gradients:
            w = weights(x.shape[:1], dtype)
            jw = to_jax(w)

            def reference(u: Tensor, m: Tensor, s: Tensor) -> Tensor:
                gaussian = distributions.gaussian_log_prob(u, m, s)
                squashed = distributions.tanh_gaussian_log_prob(u, m, s)
                entropy = distributions.gaussian_entropy(s).sum()
                return (w * gaussian + w.flip(-1) * squashed).sum() + entropy

            def twin(u: jax.Array, m: jax.Array, s: jax.Array) -> jax.Array:
                gaussian = jdistributions.gaussian_log_prob(u, m, s)
                squashed = jdistributions.tanh_gaussian_log_prob(u, m, s)
                entropy = jdistributions.gaussian_entropy(s).sum()
                return (jw * gaussian + jnp.flip(jw, -1) * squashed).sum() + entropy

            gradients_agree(reference, twin, [x, mean, log_std], "gaussian")


@PRECISIONS
@FIXED_SHAPE
@given(
    seed=st.integers(0, 2**16),
    steps=st.integers(1, 10),
    level=st.floats(0.05, 1.5),
    gradients=st.booleans(),
)
def test_flow_chains(
    dtype: torch.dtype, seed: int, steps: int, level: float, gradients: bool
) -> None:
    batch, horizon, dim = ACTION_SHAPES[0][0], 3, 2
    generator = torch.Generator().manual_seed(seed)
    with precision(dtype):
        actions, noise, velocity, log_std = (
            cast(torch.randn(batch, horizon, dim, generator=generator, dtype=F64), dtype)
            for _ in range(4)
        )
        k = torch.randint(0, steps, (batch,), generator=generator)
        t = cast(1.0 - k.to(F64) / steps, dtype)
        delta = torch.full((batch,), 1.0 / steps, dtype=dtype)
        ja, jn, jv, jl, jt, jd = (to_jax(x) for x in (actions, noise, velocity, log_std, t, delta))
        x = distributions.flow_interpolate(actions, noise, t)
        agree(jdistributions.flow_interpolate(ja, jn, jt), x, dtype, "flow_interpolate")
        jx = to_jax(x)
        agree(
            jdistributions.flow_matching_loss(jv, jn, ja),
            distributions.flow_matching_loss(velocity, noise, actions),
            dtype,
            "flow_matching_loss",
        )
        agree(
            jdistributions.flow_euler_step(jx, jv, jd),
            distributions.flow_euler_step(x, velocity, delta),
            dtype,
            "flow_euler_step",
        )
        agree(
            jdistributions.flow_sde_sigma(jt, jd, level),
            distributions.flow_sde_sigma(t, delta, level),
            dtype,
            "flow_sde_sigma",
        )
        mean, row_log_std = distributions.flow_sde_step(x, velocity, t, delta, level)
        jmean, jrow_log_std = jdistributions.flow_sde_step(jx, jv, jt, jd, level)
        agree(jmean, mean, dtype, "flow_sde_step mean")
        agree(jrow_log_std, row_log_std, dtype, "flow_sde_step log_std")
        agree(
            jdistributions.flow_step_log_prob(jn, jmean, jl),
            distributions.flow_step_log_prob(noise, mean, log_std),
            dtype,
            "flow_step_log_prob",
        )
        if dtype == F64 and gradients:
            w = weights((batch,), dtype)
            jw = to_jax(w)

            def reference(v: Tensor, s: Tensor) -> Tensor:
                m, row = distributions.flow_sde_step(x, v, t, delta, level)
                chain = distributions.flow_step_log_prob(noise, m, row[:, None, None])
                noisy = distributions.flow_step_log_prob(
                    noise, distributions.flow_euler_step(x, v, delta), s
                )
                return (w * chain + w.flip(-1) * noisy).sum() + distributions.flow_matching_loss(
                    v, noise, actions
                )

            def twin(v: jax.Array, s: jax.Array) -> jax.Array:
                m, row = jdistributions.flow_sde_step(jx, v, jt, jd, level)
                chain = jdistributions.flow_step_log_prob(jn, m, row[:, None, None])
                noisy = jdistributions.flow_step_log_prob(
                    jn, jdistributions.flow_euler_step(jx, v, jd), s
                )
                return (
                    jw * chain + jnp.flip(jw, -1) * noisy
                ).sum() + jdistributions.flow_matching_loss(v, jn, ja)

            gradients_agree(reference, twin, [velocity, log_std], "flow")


@FIXED_SHAPE
@given(batch=categorical_cases(), seed=st.integers(0, 2**16))
def test_the_categorical_samplers_draw_the_same_frequencies(
    batch: CategoricalBatch, seed: int
) -> None:
    """Not the same draws (the generators differ): each within 5 standard errors of π."""
    draws = 2_000
    logits = batch.logits.to(F32).unsqueeze(0).expand(draws, *batch.logits.shape)
    probs = torch.softmax(batch.logits, dim=-1).numpy()
    bound = 5 * np.sqrt(probs * (1 - probs) / draws) + 1.0 / draws
    for samples in (
        distributions.categorical_sample(logits, torch.Generator().manual_seed(seed)).numpy(),
        np.asarray(jdistributions.categorical_sample(to_jax(logits), jax.random.key(seed))),
    ):
        counts = np.stack(
            [np.bincount(samples[:, row], minlength=probs.shape[-1]) for row in range(len(probs))]
        )
        assert np.all(np.abs(counts / draws - probs) <= bound), (counts / draws, probs)


@FIXED_SHAPE
@given(batch=gaussian_cases(), seed=st.integers(0, 2**16))
def test_the_gaussian_samplers_draw_the_same_moments(batch: GaussianBatch, seed: int) -> None:
    draws = 2_000
    mean = batch.mean.unsqueeze(0).expand(draws, *batch.mean.shape)
    sigma = batch.log_std.exp().expand_as(batch.mean).numpy()
    for samples in (
        distributions.gaussian_sample(mean, batch.log_std, torch.Generator().manual_seed(seed)),
        jdistributions.gaussian_sample(to_jax(mean), to_jax(batch.log_std), jax.random.key(seed)),
    ):
        standardised = (np.asarray(samples) - batch.mean.numpy()) / sigma
        np.testing.assert_allclose(standardised.mean(0), 0.0, atol=5 / np.sqrt(draws))
        np.testing.assert_allclose(standardised.std(0), 1.0, atol=5 / np.sqrt(2 * draws))


# ---------------------------------------------------------------------------
# single steps, single rows


def test_the_smallest_shapes_agree() -> None:
    """A single step (over two rows), and the smallest group (one group of two)."""
    rows, steps = 2, 1
    rng = np.random.default_rng(0)

    def floats(*shape: int) -> Tensor:
        return torch.from_numpy(rng.uniform(-2.0, 0.0, shape)).to(F32)

    r, v, nv, lp, old = (floats(rows, steps) for _ in range(5))
    mask = torch.from_numpy(rng.random((rows, steps)) < 0.7)
    term = torch.from_numpy(rng.random((rows, steps)) < 0.3)
    trunc = ~term & torch.from_numpy(rng.random((rows, steps)) < 0.3)
    j = to_jax
    with precision(F32):
        cases: list[tuple[str, Any, Any]] = [
            (
                "gae",
                jadvantages.gae(j(r), j(v), j(nv), j(term), j(trunc), 0.9, 0.8),
                advantages.gae(r, v, nv, term, trunc, 0.9, 0.8),
            ),
            (
                "discounted_returns",
                jadvantages.discounted_returns(j(r), j(term), j(trunc), 0.9, j(nv)),
                advantages.discounted_returns(r, term, trunc, 0.9, nv),
            ),
            (
                "token_gae",
                jadvantages.token_gae(j(r), j(v), j(mask), 0.9, 0.8),
                advantages.token_gae(r, v, mask, 0.9, 0.8),
            ),
            (
                "reinforce_pp",
                jadvantages.reinforce_pp(j(r), j(mask), 0.9, j(v[:, 0])),
                advantages.reinforce_pp(r, mask, 0.9, v[:, 0]),
            ),
            (
                "ppo",
                jlosses.ppo_policy_loss(j(lp), j(old), j(r), j(mask), 0.2, 0.3, 2.0),
                losses.ppo_policy_loss(lp, old, r, mask, 0.2, 0.3, 2.0),
            ),
            (
                "gspo",
                jlosses.gspo_policy_loss(j(lp), j(old), j(r), j(mask)),
                losses.gspo_policy_loss(lp, old, r, mask),
            ),
            (
                "value_loss",
                jlosses.value_loss(j(v), j(nv), j(r), j(mask), 0.5, 1.0),
                losses.value_loss(v, nv, r, mask, 0.5, 1.0),
            ),
        ]
        pair = r.reshape(1, 2)
        cases += [
            (
                "group_normalized",
                jadvantages.group_normalized(j(pair)),
                advantages.group_normalized(pair),
            ),
            ("rloo", jadvantages.rloo(j(pair)), advantages.rloo(pair)),
        ]
        cases += [
            (
                f"aggregate {mode}",
                jmasked.aggregate(j(r), j(mask), mode),
                masked.aggregate(r, mask, mode),
            )
            for mode in MODES
        ]
        for name, got, want in cases:
            outputs_agree(got, want, F32, f"{name} at {rows}x{steps}")


# ---------------------------------------------------------------------------
# normalize and the scan


@PRECISIONS
@FIXED_SHAPE
@given(
    first=arrays((4, 3), -100.0, 100.0),
    second=arrays((4, 3), -1.0, 1.0),
    x=arrays((4, 3), -200.0, 200.0),
    unbiased=st.booleans(),
    clip=st.none() | st.floats(0.5, 5.0),
)
def test_running_stats(
    dtype: torch.dtype,
    first: Tensor,
    second: Tensor,
    x: Tensor,
    unbiased: bool,
    clip: float | None,
) -> None:
    jdtype = jnp.float64 if dtype == F64 else jnp.float32
    with precision(dtype):
        a = normalize.update(normalize.init((3,), dtype=dtype), cast(first, dtype))
        b = normalize.update(normalize.init((3,), dtype=dtype), cast(second, dtype))
        state = normalize.merge(a, b)
        ja = jnormalize.update(jnormalize.init((3,), dtype=jdtype), to_jax(cast(first, dtype)))
        jb = jnormalize.update(jnormalize.init((3,), dtype=jdtype), to_jax(cast(second, dtype)))
        jstate = jnormalize.merge(ja, jb)
        for field in ("count", "mean", "m2"):
            agree(getattr(jstate, field), getattr(state, field), dtype, field)
        agree(
            jnormalize.variance(jstate, unbiased), normalize.variance(state, unbiased), dtype, "var"
        )
        agree(jnormalize.std(jstate, unbiased), normalize.std(state, unbiased), dtype, "std")
        agree(
            jnormalize.normalize(jstate, to_jax(cast(x, dtype)), 1e-8, clip),
            normalize.normalize(state, cast(x, dtype), 1e-8, clip),
            dtype,
            "normalize",
        )


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 7, 8, 9, 16, 17, 33, 100])
def test_the_parallel_scan_solves_the_recurrence_torch_solves(steps: int) -> None:
    rng = np.random.default_rng(steps)
    x = torch.from_numpy(rng.normal(size=(3, steps)))
    decay = torch.from_numpy(rng.uniform(0.0, 1.0, size=(3, steps)))
    decay[decay < 0.1] = 0.0  # episode boundaries
    with precision(F64):
        want = _scan.reverse_linear_recurrence(x, decay)
        agree(jscan.reverse_linear_recurrence(to_jax(x), to_jax(decay)), want, F64, "scan")
