"""rlcore.jax: every torch function has a twin with its signature; twins jit; records are pytrees.

The values are compared with the torch functions in test_jax_differential.py.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jaxtyping import TypeCheckError

import rlcore.jax
import rlcore.types
from rlcore import advantages, distributions, logprobs, losses, masked, normalize
from rlcore.jax import advantages as jadvantages
from rlcore.jax import distributions as jdistributions
from rlcore.jax import logprobs as jlogprobs
from rlcore.jax import losses as jlosses
from rlcore.jax import masked as jmasked
from rlcore.jax import normalize as jnormalize
from rlcore.registry import ADVANTAGES, POLICY_LOSSES

TWINS: list[tuple[ModuleType, ModuleType]] = [
    (masked, jmasked),
    (advantages, jadvantages),
    (losses, jlosses),
    (logprobs, jlogprobs),
    (distributions, jdistributions),
    (normalize, jnormalize),
]

# Public names of the torch modules that are not functions, and what the twin does with them.
# Records of tensors have a record twin with the same fields (a pytree of jax arrays).
RECORD_TWINS = {"logprobs.TokenStats", "normalize.RunningStats"}
# Type aliases with no torch in them are the same object in both modules.
SHARED = {"masked.AggregationMode", "losses.KLKind"}
# Deliberately not twinned, each with the reason.
EXCLUDED = {
    "advantages.AdvantageBatch": "registry adapter input, for the torch registry's estimators",
    "advantages.AdvantageConfig": "registry adapter config, used only by the torch adapters",
    "advantages.AdvantageEstimator": "Protocol of rlcore.registry.ADVANTAGES entries (torch)",
    "advantages.BaselineForm": "AdvantageConfig.baseline_form's choices (torch adapters only)",
    "advantages.BASELINE_FORMS": "AdvantageConfig.baseline_form's choices (torch adapters only)",
    "losses.PolicyLossBatch": "registry adapter input: the torch registry holds torch losses",
    "losses.PolicyLossConfig": "registry adapter config, used only by the torch adapters",
    "losses.PolicyLoss": "Protocol of rlcore.registry.POLICY_LOSSES entries (torch)",
}
# Functions whose twin's signature differs on purpose.
SIGNATURE_EXCEPTIONS = {
    "normalize.init": "dtype and device are JAX's (dtype None: float64 where x64 is enabled)",
    "distributions.categorical_sample": "a required JAX key for torch's optional generator",
    "distributions.gaussian_sample": "a required JAX key for torch's optional generator",
}


def short(module: ModuleType) -> str:
    return module.__name__.rsplit(".", 1)[-1]


def public_functions(module: ModuleType) -> list[str]:
    return [name for name in module.__all__ if inspect.isfunction(getattr(module, name))]


def twin_functions() -> list[tuple[str, Callable[..., Any]]]:
    return [
        (f"{short(twin)}.{name}", getattr(twin, name))
        for _, twin in TWINS
        for name in public_functions(twin)
    ]


def signature_problems(name: str, reference: Callable[..., Any], twin: Any) -> list[str]:
    if twin is None or not inspect.isfunction(twin):
        return [f"{name}: no twin"]
    if name in SIGNATURE_EXCEPTIONS:
        return []
    want = [(p.name, p.kind, p.default) for p in inspect.signature(reference).parameters.values()]
    got = [(p.name, p.kind, p.default) for p in inspect.signature(twin).parameters.values()]
    if want != got:
        return [f"{name}: signature {got} but torch has {want}"]
    return []


def test_every_public_torch_function_has_a_twin_with_its_signature() -> None:
    problems = [
        problem
        for reference, twin in TWINS
        for name in public_functions(reference)
        for problem in signature_problems(
            f"{short(reference)}.{name}", getattr(reference, name), getattr(twin, name, None)
        )
    ]
    assert not problems, "missing or different twins:\n" + "\n".join(problems)


def test_the_twin_check_reports_a_missing_twin_and_a_changed_default() -> None:
    def reference(x: int, clip: float = 0.2) -> int:
        return x

    def changed(x: int, clip: float = 0.3) -> int:
        return x

    assert signature_problems("m.f", reference, None) == ["m.f: no twin"]
    assert signature_problems("m.f", reference, reference) == []
    assert signature_problems("m.f", reference, changed)


def test_every_other_public_name_is_twinned_shared_or_excluded_with_a_reason() -> None:
    unclassified = []
    for reference, twin in TWINS:
        for name in reference.__all__:
            if inspect.isfunction(getattr(reference, name)):
                continue
            key = f"{short(reference)}.{name}"
            if key in RECORD_TWINS:
                fields = [f.name for f in attrs.fields(getattr(reference, name))]
                twin_fields = [f.name for f in attrs.fields(getattr(twin, name))]
                assert twin_fields == fields, key
            elif key in SHARED:
                assert getattr(twin, name) is getattr(reference, name), key
            elif key in EXCLUDED:
                assert name not in twin.__all__, f"{key} is twinned: drop its exclusion"
            else:
                unclassified.append(key)
    assert not unclassified, f"decide whether to twin {unclassified} (see EXCLUDED)"
    # Twins of the records in rlcore.types that the functions return.
    for record in ("Advantages", "LossOutput"):
        fields = [f.name for f in attrs.fields(getattr(rlcore.types, record))]
        assert [f.name for f in attrs.fields(getattr(rlcore.jax, record))] == fields


def test_importing_rlcore_never_imports_jax_and_rlcore_jax_registers_nothing() -> None:
    code = (
        "import sys\n"
        "import rlcore, rlcore.advantages, rlcore.losses, rlcore.testing\n"
        "print('jax' in sys.modules)\n"
        "from rlcore.registry import ADVANTAGES, POLICY_LOSSES\n"
        "before = (ADVANTAGES.names(), POLICY_LOSSES.names())\n"
        "import rlcore.jax\n"
        "print('jax' in sys.modules)\n"
        "print(before == (ADVANTAGES.names(), POLICY_LOSSES.names()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.split() == ["False", "True", "True"]


def test_the_torch_registries_hold_no_jax_twin() -> None:
    entries: list[object] = [ADVANTAGES.get(n) for n in ADVANTAGES.names()]
    entries += [POLICY_LOSSES.get(n) for n in POLICY_LOSSES.names()]
    assert not any(getattr(e, "__module__", "").startswith("rlcore.jax") for e in entries)


@pytest.mark.parametrize(
    ("name", "function"), twin_functions(), ids=[n for n, _ in twin_functions()]
)
def test_every_twin_is_run_time_checked(name: str, function: Callable[..., Any]) -> None:
    if name == "normalize.init":  # builds its arrays from Python values, checks nothing
        return
    assert getattr(function, "__rlcore_checked__", False), f"{name} lacks typecheck"


def test_static_argnames_are_the_python_hyperparameters() -> None:
    static = rlcore.jax.static_argnames
    assert static(jadvantages.gae) == ("gamma", "lam")
    assert static(jlosses.ppo_policy_loss) == ("clip_low", "clip_high", "dual_clip", "agg")
    assert static(jlosses.value_loss) == ("clip", "huber_delta", "agg")
    assert static(jlosses.kl_estimate) == ("kind", "clamp")
    assert static(jlosses.sac_actor_loss) == ()  # alpha may be a traced array
    assert static(jmasked.aggregate) == ("mode", "horizon")  # normalizer is traced
    assert static(jlogprobs.token_logprobs) == ("temperature", "chunk_size")
    assert static(jnormalize.update) == ()
    assert static(jdistributions.categorical_sample) == ()  # the key is traced
    assert static(jdistributions.gaussian_log_prob) == ()


# ---------------------------------------------------------------------------
# Every twin under jax.jit (static hyperparameters) gives what it gives eagerly.

B, T, V, H = 4, 8, 11, 4  # the shapes test_jax_differential compiles for too


def _cases() -> dict[str, tuple[tuple[Any, ...], dict[str, Any]]]:
    """For each twin: arguments of one call, static hyperparameters positional or by keyword."""
    rng = np.random.default_rng(7)

    def f(*shape: int, low: float = -2.0, high: float = 2.0) -> jax.Array:
        return jnp.asarray(rng.uniform(low, high, shape), dtype=jnp.float32)

    def bools(*shape: int, p: float = 0.7) -> jax.Array:
        return jnp.asarray(rng.random(shape) < p)

    def state() -> jnormalize.RunningStats:
        return jnormalize.update(jnormalize.init((H,)), f(7, H))

    mask = bools(B, T).at[0].set(False)  # with a fully masked row
    terminated = bools(B, T, p=0.2)
    truncated = bools(B, T, p=0.2) & ~terminated
    lp, olp, adv = f(B, T, low=-3.0, high=0.0), f(B, T, low=-3.5, high=0.5), f(B, T)
    tokens = jnp.asarray(rng.integers(0, V, (B, T)))
    actions = jnp.asarray(rng.integers(0, H, (B,)))
    return {
        "masked.masked_sum": ((f(B, T), mask, -1), {}),
        "masked.masked_mean": ((f(B, T), mask), {"axis": (0, 1)}),
        "masked.masked_var": ((f(B, T), mask, False), {}),
        "masked.masked_whiten": ((f(B, T), mask), {"shift_mean": False, "eps": 1e-6}),
        "masked.aggregation_normalizer": ((mask, "seq-mean-token-sum-norm", 10), {}),
        "masked.aggregate": ((f(B, T), mask, "seq-mean-token-mean", jnp.asarray(4.0)), {}),
        "advantages.gae": ((f(B, T), f(B, T), f(B, T), terminated, truncated, 0.99, 0.95), {}),
        "advantages.token_gae": ((f(B, T), f(B, T), mask, 0.9, 0.8), {}),
        "advantages.discounted_returns": ((f(B, T), terminated, truncated, 0.9, f(B, T)), {}),
        "advantages.group_normalized": ((f(B, T),), {"std_normalize": True, "eps": 1e-4}),
        "advantages.rloo": ((f(B, T),), {}),
        "advantages.reinforce_pp": ((f(B, T), mask, 0.9, f(B)), {}),
        "advantages.on_policy_distillation": ((lp, olp, mask), {}),
        "losses.ppo_policy_loss": ((lp, olp, adv, mask, 0.2, 0.28, 3.0, "token-mean", 9.0), {}),
        "losses.vanilla_policy_loss": ((lp, adv, mask), {"agg": "seq-mean-token-sum"}),
        "losses.gspo_policy_loss": ((lp, olp, adv, mask), {}),
        "losses.decoupled_ppo_policy_loss": (
            (lp, olp, f(B, T, low=-3.0, high=0.0), adv, mask),
            {"dual_clip": 3.0, "behavior_weight_cap": 2.0},
        ),
        "losses.value_loss": ((f(B, T), f(B, T), f(B, T), mask, 0.5, 1.0), {}),
        "losses.kl_estimate": ((lp, olp), {"kind": "low_var_kl", "clamp": 10.0}),
        "losses.entropy_loss": ((f(B, T, low=0.0), mask), {}),
        "losses.sft_loss": ((lp, mask), {"agg": "seq-mean-token-mean"}),
        "losses.sac_critic_target": (
            (f(B), f(B, 2), f(B), bools(B), 0.99, jnp.asarray(0.2)),
            {},
        ),
        "losses.sac_critic_loss": ((f(B, 2), f(B)), {}),
        "losses.sac_actor_loss": ((f(B), f(B, 2), 0.2), {}),
        "losses.sac_temperature_loss": ((jnp.asarray(-1.0), f(B)), {"target_entropy": -2.0}),
        "logprobs.token_logprobs": ((f(B, T, V), tokens, 0.7, 4), {}),
        "logprobs.entropy_from_logits": ((f(B, T, V),), {"chunk_size": None}),
        "logprobs.token_stats": ((f(B, T, V), tokens), {"temperature": 2.0}),
        "logprobs.token_logprobs_from_hidden": ((f(B, T, H), f(V, H), tokens, 1.0, 4), {}),
        "logprobs.entropy_from_hidden": ((f(B, T, H), f(V, H)), {"chunk_size": 5}),
        "logprobs.token_stats_from_hidden": ((f(B, T, H), f(V, H), tokens, 0.5, 7), {}),
        "distributions.categorical_log_prob": ((f(B, H), actions), {}),
        "distributions.categorical_entropy": ((f(B, T, H),), {}),
        "distributions.categorical_sample": ((f(B, H), jax.random.key(0)), {}),
        "distributions.gaussian_log_prob": ((f(B, 2), f(B, 2), f(2)), {}),
        "distributions.gaussian_entropy": ((f(B, 2),), {}),
        "distributions.gaussian_sample": ((f(B, 2), f(B, 2)), {"key": jax.random.PRNGKey(1)}),
        "distributions.tanh_gaussian_log_prob": ((f(B, 2, low=-30, high=30), f(B, 2), f(B, 2)), {}),
        "distributions.flow_interpolate": ((f(B, 3, 2), f(B, 3, 2), f(B, low=0.0, high=1.0)), {}),
        "distributions.flow_matching_loss": ((f(B, 3, 2), f(B, 3, 2), f(B, 3, 2)), {}),
        "distributions.flow_euler_step": ((f(B, 3, 2), f(B, 3, 2), f(B, low=0.1, high=0.5)), {}),
        "distributions.flow_sde_sigma": (
            (f(B, low=0.2, high=1.0), f(B, low=0.1, high=0.2), 0.5),
            {},
        ),
        "distributions.flow_sde_step": (
            (f(B, 3, 2), f(B, 3, 2), f(B, low=0.2, high=1.0), f(B, low=0.1, high=0.2), 0.5),
            {},
        ),
        "distributions.flow_step_log_prob": ((f(B, 3, 2), f(B, 3, 2), f(B, 1, 1)), {}),
        "normalize.init": (((H,),), {}),
        "normalize.merge": ((state(), state()), {}),
        "normalize.update": ((state(), f(5, H)), {}),
        "normalize.variance": ((state(), True), {}),
        "normalize.std": ((state(),), {}),
        "normalize.normalize": ((state(), f(2, H)), {"clip": 1.0}),
    }


def test_every_twin_has_a_jit_case() -> None:
    assert sorted(_cases()) == sorted(name for name, _ in twin_functions())


@pytest.mark.parametrize(
    ("name", "function"), twin_functions(), ids=[n for n, _ in twin_functions()]
)
def test_every_twin_runs_under_jit_and_agrees_with_eager(
    name: str, function: Callable[..., Any]
) -> None:
    args, kwargs = _cases()[name]
    eager = function(*args, **kwargs)
    jitted = rlcore.jax.jit(function)(*args, **kwargs)
    eager_leaves, eager_tree = jax.tree_util.tree_flatten(eager)
    jitted_leaves, jitted_tree = jax.tree_util.tree_flatten(jitted)
    assert repr(jitted_tree) == repr(eager_tree)
    assert eager_leaves, f"{name} returned no arrays"
    for got, want in zip(jitted_leaves, eager_leaves, strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_records_pass_through_jit_vmap_and_grad() -> None:
    rng = np.random.default_rng(3)
    lp, olp, adv = (jnp.asarray(rng.uniform(-3.0, 0.0, (B, T)), jnp.float32) for _ in range(3))
    mask = jnp.asarray(rng.random((B, T)) < 0.6)

    def loss(x: jax.Array) -> tuple[jax.Array, rlcore.jax.LossOutput]:
        output = jlosses.ppo_policy_loss(x, olp, adv, mask)
        return output.loss, output

    (value, output), grad = jax.jit(jax.value_and_grad(loss, has_aux=True))(lp)
    assert isinstance(output, rlcore.jax.LossOutput)
    assert set(output.metrics) == {"clipfrac", "dual_clipfrac", "approx_kl", "ratio_mean"}
    np.testing.assert_allclose(value, output.loss, rtol=1e-6)
    assert grad.shape == (B, T)
    assert np.any(np.asarray(grad) != 0)
    assert not np.any(np.asarray(grad)[~np.asarray(mask)])  # nothing reaches masked positions
    rewards = jnp.asarray(rng.normal(size=(2, B, T)), jnp.float32)
    batched = jax.vmap(lambda r: jadvantages.gae(r, r, r, mask, ~mask, 0.9, 0.9))(rewards)
    assert isinstance(batched, rlcore.jax.Advantages)
    assert batched.advantages.shape == (2, B, T)
    np.testing.assert_allclose(
        batched.returns[1],
        jadvantages.gae(rewards[1], rewards[1], rewards[1], mask, ~mask, 0.9, 0.9).returns,
        rtol=1e-6,
    )


# ---------------------------------------------------------------------------
# Errors: the twins reject what the torch functions reject, with the same words.

z = jnp.zeros((2, 3))
m = jnp.ones((2, 3), dtype=bool)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: jadvantages.gae(z, z, z, m, m, 1.5, 0.9), "gamma must lie in"),
        (lambda: jadvantages.token_gae(z, z, m, 0.9, -0.1), "lam must lie in"),
        (lambda: jadvantages.rloo(jnp.zeros((3, 1))), "group_size >= 2"),
        (lambda: jlosses.ppo_policy_loss(z, z, z, m, clip_low=1.0), "clip_low must lie in"),
        (lambda: jlosses.ppo_policy_loss(z, z, z, m, dual_clip=0.5), "dual_clip must be greater"),
        (lambda: jlosses.value_loss(z, z, z, m, clip=0.0), "clip must be positive"),
        (lambda: jlosses.value_loss(z, z, z, m, huber_delta=-1.0), "huber_delta must be"),
        (lambda: jlosses.kl_estimate(z, z, clamp=0.0), "clamp must be positive"),
        (lambda: jmasked.aggregate(z, m, "token-mean", horizon=0), None),
        (lambda: jmasked.aggregate(z, m, "seq-mean-token-sum-norm", horizon=0), "horizon must be"),
        (
            lambda: jlogprobs.token_logprobs(jnp.zeros((2, 3, 4)), jnp.zeros((2, 3), int), 0.0),
            "temperature must be positive",
        ),
        (
            lambda: jlogprobs.token_logprobs(jnp.zeros((2, 3, 4)), jnp.full((2, 3), 4)),
            r"ids must lie in \[0, 4\)",
        ),
        (lambda: jmasked.masked_sum(z, jnp.full((2, 3), 2.0)), "must hold only 0 and 1"),
        (
            lambda: jdistributions.categorical_log_prob(z, jnp.asarray([0, 3])),
            r"actions: indices must lie in \[0, 3\)",
        ),
        (lambda: jnormalize.update(jnormalize.init((3,)), jnp.zeros((2, 4))), "feature dimensions"),
    ],
)
def test_invalid_arguments_raise_as_in_torch(call: Callable[[], Any], message: str | None) -> None:
    if message is None:  # horizon is only read by seq-mean-token-sum-norm, as in torch
        call()
        return
    with pytest.raises((ValueError, TypeCheckError), match=message):
        call()


def test_type_errors_are_explained_as_rlcore_explains_them() -> None:
    with pytest.raises(TypeCheckError) as error:
        jmasked.aggregate(z, m, "token_mean")  # type: ignore[arg-type]
    assert (
        str(error.value)
        .splitlines()[0]
        .startswith(
            "rlcore.jax.masked.aggregate: argument 'mode' is 'token_mean' "
            "(did you mean 'token-mean'?); expected one of 'token-mean', "
        )
    )
    with pytest.raises(TypeCheckError, match=r"argument 'kind' is 'k4' .*; expected one of 'k1'"):
        jlosses.kl_estimate(z, z, kind="k4")  # type: ignore[arg-type]
    with pytest.raises(TypeCheckError) as error:
        jmasked.masked_mean(jnp.zeros((3, 5)), jnp.ones((3, 4), dtype=bool))
    assert str(error.value).splitlines()[0] == (
        "rlcore.jax.masked.masked_mean: argument 'mask' has shape (3, 4): "
        "dimension 'shape' is (3, 4) but 'values' bound it to (3, 5)"
    )
    with pytest.raises(
        TypeCheckError,
        match=r"'next_values' has shape \(2, 4\): dimension 'time' is 4 but 'values' bound",
    ):
        jax.jit(jadvantages.gae, static_argnames=("gamma", "lam"))(
            z, z, jnp.zeros((2, 4)), m, m, gamma=0.9, lam=0.9
        )
    with pytest.raises(TypeCheckError, match=r"argument 'scores' must be a jax.Array"):
        jadvantages.rloo([[1.0, 2.0]])  # type: ignore[arg-type]
    with pytest.raises(TypeCheckError, match=r"argument 'tokens' has dtype float32"):
        jlogprobs.token_logprobs(jnp.zeros((2, 3, 5)), jnp.zeros((2, 3)))


def test_rlcore_unchecked_skips_the_twins_checks_too() -> None:
    integers = jnp.ones((2, 3), dtype=jnp.int32)  # not Float: rejected when checked
    with pytest.raises(TypeCheckError, match="argument 'values' has dtype int32"):
        jmasked.masked_sum(integers, m)
    with rlcore.unchecked():
        assert int(jmasked.masked_sum(integers, m)) == 6


def test_a_float_mask_is_converted_and_under_jit_any_nonzero_counts_as_valid() -> None:
    values = jnp.arange(6.0).reshape(2, 3)
    as_float = jnp.asarray([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    assert float(jmasked.masked_sum(values, as_float)) == 0.0 + 2.0 + 5.0
    traced = jax.jit(jmasked.masked_sum)(values, as_float * 2)
    assert float(traced) == 7.0


def test_an_out_of_range_action_under_jit_gives_nan_and_torch_raises() -> None:
    logits = jnp.zeros((3, 4))
    out = jax.jit(jdistributions.categorical_log_prob)(logits, jnp.asarray([1, 4, -1]))
    np.testing.assert_allclose(np.asarray(out), [-np.log(4.0), np.nan, np.nan], rtol=1e-6)
    with pytest.raises(RuntimeError, match="out of bounds"):
        distributions.categorical_log_prob(torch.zeros(3, 4), torch.tensor([1, 4, 0]))


def test_the_samplers_draw_with_the_key_they_are_given() -> None:
    rng = np.random.default_rng(5)
    logits = jnp.asarray(rng.normal(size=(B, H)), jnp.float32)
    mean = jnp.asarray(rng.normal(size=(B, 2)), jnp.float32)
    log_std = jnp.asarray(rng.normal(size=(2,)), jnp.float32)
    key, other = jax.random.key(3), jax.random.key(4)
    exponential = jax.random.exponential(key, (B, H))
    race = jnp.argmax(jax.nn.softmax(logits) / exponential, axis=-1)
    np.testing.assert_array_equal(jdistributions.categorical_sample(logits, key), race)
    draws = jnp.stack(
        [jdistributions.categorical_sample(logits, k) for k in jax.random.split(other, 8)]
    )
    assert len({tuple(np.asarray(row)) for row in draws}) > 1  # a new key, new draws
    noise = jax.random.normal(key, (B, 2))
    np.testing.assert_allclose(
        jdistributions.gaussian_sample(mean, log_std, key),
        mean + jnp.exp(log_std) * noise,
        rtol=1e-6,
    )
    d_mean, d_log_std = jax.grad(
        lambda m, s: jdistributions.gaussian_sample(m, s, key).sum(), argnums=(0, 1)
    )(mean, log_std)
    np.testing.assert_allclose(d_mean, np.ones((B, 2)))
    np.testing.assert_allclose(d_log_std, (jnp.exp(log_std) * noise).sum(0), rtol=1e-6)


def test_an_out_of_range_token_under_jit_gives_nan() -> None:
    tokens = jnp.asarray([[0, 5, -1]])
    out = jax.jit(jlogprobs.token_logprobs)(jnp.zeros((1, 3, 5)), tokens)
    np.testing.assert_allclose(np.asarray(out), [[-np.log(5.0), np.nan, np.nan]], rtol=1e-6)
