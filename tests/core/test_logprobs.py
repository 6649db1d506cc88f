"""Per-token log-probabilities and entropies: chunked paths equal the plain path, memory bounded."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from jaxtyping import TypeCheckError

from rlcore._checking import typecheck_enabled
from rlcore.logprobs import (
    TokenStats,
    entropy_from_hidden,
    entropy_from_logits,
    token_logprobs,
    token_logprobs_from_hidden,
    token_stats,
    token_stats_from_hidden,
)

# Tolerances of a chunked result against the plain one. Both compute in at least float32
# with the same kernels; gradients of half-precision logits are rounded back to 16 bits.
TOLERANCE = {
    torch.float64: {"rtol": 1e-12, "atol": 1e-12},
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
    torch.bfloat16: {"rtol": 1e-2, "atol": 1e-3},
    torch.float16: {"rtol": 1e-3, "atol": 1e-4},
}
HALF = (torch.bfloat16, torch.float16)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # On a busy 2-core machine torch's parallel softmax kernels wait ~10 ms per call for the
    # second thread, even on a 2×5 tensor; these tiny cases run much faster on one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(actual, expected, **TOLERANCE[dtype])


# --- strategies -----------------------------------------------------------------------------


@st.composite
def logit_cases(
    draw: st.DrawFn, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64, *HALF)
) -> tuple[torch.Tensor, torch.Tensor, float, int]:
    """(logits ``[*batch, time, vocab]``, tokens, temperature, chunk_size)."""
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    time = draw(st.integers(1, 6))
    vocab = draw(st.integers(1, 9))
    dtype = draw(st.sampled_from(dtypes))
    scale = draw(st.sampled_from([0.1, 1.0, 5.0, 30.0]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    logits = (
        torch.randn(*batch, time, vocab, generator=generator, dtype=torch.float64) * scale
    ).to(dtype)
    tokens = torch.randint(0, vocab, (*batch, time), generator=generator)
    temperature = draw(st.sampled_from([1.0, 0.6, 2.5]))
    rows = math.prod(batch) * time
    # 1, non-divisors, exactly the rows, and more than the rows.
    chunk_size = draw(st.integers(1, rows + 3))
    return logits, tokens, temperature, chunk_size


@st.composite
def hidden_cases(
    draw: st.DrawFn,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, int]:
    """(hidden ``[*batch, time, width]``, weight ``[vocab, width]``, tokens, τ, chunk_size)."""
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    time = draw(st.integers(1, 5))
    vocab = draw(st.integers(1, 9))
    width = draw(st.integers(1, 6))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    hidden = torch.randn(*batch, time, width, generator=generator, dtype=dtype)
    weight = torch.randn(vocab, width, generator=generator, dtype=dtype)
    tokens = torch.randint(0, vocab, (*batch, time), generator=generator)
    temperature = draw(st.sampled_from([1.0, 0.7, 3.0]))
    chunk_size = draw(st.integers(1, math.prod(batch) * time + 3))
    return hidden, weight, tokens, temperature, chunk_size


def logit_gradients(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float,
    chunk_size: int | None,
    weights: tuple[float, float],
    cotangents: tuple[torch.Tensor, torch.Tensor],
) -> tuple[TokenStats, torch.Tensor]:
    """token_stats and ∂/∂logits of Σ w₁ g₁ log π + w₂ g₂ H (w = 0 drops a term)."""
    leaf = logits.detach().clone().requires_grad_()
    stats = token_stats(leaf, tokens, temperature, chunk_size)
    loss = torch.zeros((), dtype=stats.logprobs.dtype)
    if weights[0]:
        loss = loss + weights[0] * (stats.logprobs * cotangents[0]).sum()
    if weights[1]:
        loss = loss + weights[1] * (stats.entropy * cotangents[1]).sum()
    (grad,) = torch.autograd.grad(loss, leaf)
    return stats, grad


# --- the chunked logits path equals the plain path ----------------------------------------


@given(case=logit_cases())
def test_chunked_values_equal_the_plain_path(
    case: tuple[torch.Tensor, torch.Tensor, float, int],
) -> None:
    logits, tokens, temperature, chunk_size = case
    plain = token_stats(logits, tokens, temperature)
    chunked = token_stats(logits, tokens, temperature, chunk_size)
    compute = torch.promote_types(logits.dtype, torch.float32)
    assert chunked.logprobs.dtype == chunked.entropy.dtype == plain.logprobs.dtype == compute
    assert chunked.logprobs.shape == chunked.entropy.shape == tokens.shape
    close(chunked.logprobs, plain.logprobs, compute)
    close(chunked.entropy, plain.entropy, compute)
    close(token_logprobs(logits, tokens, temperature, chunk_size), plain.logprobs, compute)
    close(entropy_from_logits(logits, chunk_size, temperature), plain.entropy, compute)
    close(token_logprobs(logits, tokens, temperature), plain.logprobs, compute)
    close(entropy_from_logits(logits, None, temperature), plain.entropy, compute)


@pytest.mark.parametrize("weights", [(1.0, 0.0), (0.0, 1.0), (1.0, 0.5)], ids=str)
@given(case=logit_cases())
def test_chunked_gradients_equal_the_plain_path(
    weights: tuple[float, float], case: tuple[torch.Tensor, torch.Tensor, float, int]
) -> None:
    logits, tokens, temperature, chunk_size = case
    generator = torch.Generator().manual_seed(1)
    compute = torch.promote_types(logits.dtype, torch.float32)
    cotangents = (
        torch.randn(tokens.shape, generator=generator, dtype=compute),
        torch.randn(tokens.shape, generator=generator, dtype=compute),
    )
    _, plain = logit_gradients(logits, tokens, temperature, None, weights, cotangents)
    _, chunked = logit_gradients(logits, tokens, temperature, chunk_size, weights, cotangents)
    assert chunked.dtype == logits.dtype
    close(chunked, plain, logits.dtype)


@given(case=logit_cases(dtypes=(torch.float64,)))
def test_plain_path_matches_the_formula(
    case: tuple[torch.Tensor, torch.Tensor, float, int],
) -> None:
    logits, tokens, temperature, _ = case
    z = logits / temperature
    log_normaliser = torch.logsumexp(z, dim=-1)
    expected_logprobs = z.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - log_normaliser
    expected_entropy = log_normaliser - (torch.softmax(z, dim=-1) * z).sum(dim=-1)
    stats = token_stats(logits, tokens, temperature)
    torch.testing.assert_close(stats.logprobs, expected_logprobs)
    torch.testing.assert_close(stats.entropy, expected_entropy)
    assert bool((stats.logprobs <= 1e-12).all())
    assert bool((stats.entropy >= -1e-12).all())
    assert bool((stats.entropy <= math.log(logits.shape[-1]) + 1e-9).all())


def test_shifted_slice_of_the_model_output_is_handled_without_flattening() -> None:
    # logits[:, :-1] is the usual call; it cannot be viewed as rows but can as sequences.
    generator = torch.Generator().manual_seed(0)
    output = torch.randn(3, 8, 11, generator=generator, requires_grad=True)
    tokens = torch.randint(0, 11, (3, 7), generator=generator)
    weights = torch.randn(3, 7, generator=generator)
    grads = []
    for chunk_size in (None, 1, 3, 7, 50):
        stats = token_stats(output[:, :-1], tokens, 0.8, chunk_size)
        (grad,) = torch.autograd.grad((stats.logprobs * weights + stats.entropy).sum(), output)
        grads.append((stats.logprobs, stats.entropy, grad))
    for logprobs, entropy, grad in grads[1:]:
        torch.testing.assert_close(logprobs, grads[0][0])
        torch.testing.assert_close(entropy, grads[0][1])
        torch.testing.assert_close(grad, grads[0][2])
        assert bool((grad[:, -1] == 0).all())


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_precision_logits_are_computed_in_float32(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(3)
    logits = (torch.randn(2, 5, 1000, generator=generator) * 4).to(dtype)
    tokens = torch.randint(0, 1000, (2, 5), generator=generator)
    expected = token_stats(logits.float(), tokens, 0.9)
    for chunk_size in (None, 3):
        stats = token_stats(logits, tokens, 0.9, chunk_size)
        assert stats.logprobs.dtype == stats.entropy.dtype == torch.float32
        torch.testing.assert_close(stats.logprobs, expected.logprobs)
        torch.testing.assert_close(stats.entropy, expected.entropy)


# --- hand-computed examples ---------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [None, 1, 2, 5])
def test_two_word_vocabulary_by_hand(chunk_size: int | None) -> None:
    # z = [0, log 3] at τ = 1, or [0, 2 log 3] at τ = 2: π = [1/4, 3/4] either way.
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]], dtype=torch.float64)
    tokens = torch.tensor([1, 0])
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    expected = TokenStats(
        logprobs=torch.tensor([math.log(0.75), math.log(0.25)], dtype=torch.float64),
        entropy=torch.tensor([entropy, entropy], dtype=torch.float64),
    )
    for stats in (
        token_stats(logits, tokens, 1.0, chunk_size),
        token_stats(2 * logits, tokens, 2.0, chunk_size),
    ):
        torch.testing.assert_close(stats.logprobs, expected.logprobs)
        torch.testing.assert_close(stats.entropy, expected.entropy)
    # ∂ log π(y)/∂z = 𝟙[y] − π: row 0 picked word 1, row 1 picked word 0.
    leaf = logits.clone().requires_grad_()
    token_logprobs(leaf, tokens, chunk_size=chunk_size).sum().backward()
    expected_grad = torch.tensor([[-0.25, 0.25], [0.75, -0.75]], dtype=torch.float64)
    assert leaf.grad is not None
    torch.testing.assert_close(leaf.grad, expected_grad)


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_uniform_logits_give_log_vocab_entropy_and_zero_entropy_gradient(
    chunk_size: int | None,
) -> None:
    logits = torch.full((3, 7), 2.5, dtype=torch.float64, requires_grad=True)
    entropy = entropy_from_logits(logits, chunk_size)
    torch.testing.assert_close(entropy, torch.full((3,), math.log(7), dtype=torch.float64))
    entropy.sum().backward()  # the uniform distribution maximises entropy
    assert logits.grad is not None
    torch.testing.assert_close(logits.grad, torch.zeros_like(logits))
    logprobs = token_logprobs(logits.detach(), torch.tensor([0, 3, 6]), chunk_size=chunk_size)
    torch.testing.assert_close(logprobs, torch.full((3,), -math.log(7), dtype=torch.float64))


# --- from hidden states: equal to hidden @ W.T → log_softmax → gather ----------------------


@pytest.mark.parametrize(
    "needs", [(True, True), (True, False), (False, True)], ids=["both", "hidden", "weight"]
)
@given(case=hidden_cases())
def test_from_hidden_equals_the_naive_path(
    needs: tuple[bool, bool],
    case: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, int],
) -> None:
    hidden, weight, tokens, temperature, chunk_size = case
    cotangent = torch.linspace(-1.0, 2.0, tokens.numel(), dtype=hidden.dtype).view(tokens.shape)

    def run(
        stats_fn: Callable[[torch.Tensor, torch.Tensor], TokenStats], entropy_weight: float
    ) -> list[torch.Tensor]:
        h = hidden.clone().requires_grad_(needs[0])
        w = weight.clone().requires_grad_(needs[1])
        stats = stats_fn(h, w)
        loss = (stats.logprobs * cotangent).sum() + entropy_weight * stats.entropy.sum()
        leaves = [x for x, need in ((h, needs[0]), (w, needs[1])) if need]
        return [stats.logprobs, stats.entropy, *torch.autograd.grad(loss, leaves)]

    def naive(h: torch.Tensor, w: torch.Tensor) -> TokenStats:
        return token_stats(h @ w.T, tokens, temperature)

    def chunked(h: torch.Tensor, w: torch.Tensor) -> TokenStats:
        return token_stats_from_hidden(h, w, tokens, temperature, chunk_size)

    for entropy_weight in (0.0, 0.3):
        for actual, expected in zip(
            run(chunked, entropy_weight), run(naive, entropy_weight), strict=True
        ):
            close(actual, expected, hidden.dtype)


@given(case=hidden_cases())
def test_from_hidden_single_outputs_match_token_stats(
    case: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, int],
) -> None:
    hidden, weight, tokens, temperature, chunk_size = case
    stats = token_stats_from_hidden(hidden, weight, tokens, temperature, chunk_size)
    logprobs = token_logprobs_from_hidden(hidden, weight, tokens, temperature, chunk_size)
    entropy = entropy_from_hidden(hidden, weight, temperature, chunk_size)
    close(logprobs, stats.logprobs, hidden.dtype)
    close(entropy, stats.entropy, hidden.dtype)
    # Entropy-only gradients flow through the weight as well.
    w = weight.clone().requires_grad_()
    (grad,) = torch.autograd.grad(entropy_from_hidden(hidden, w, temperature, chunk_size).sum(), w)
    (expected,) = torch.autograd.grad(entropy_from_logits(hidden @ w.T, None, temperature).sum(), w)
    close(grad, expected, hidden.dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_from_hidden_in_half_precision_computes_the_softmax_in_float32(
    dtype: torch.dtype,
) -> None:
    generator = torch.Generator().manual_seed(5)
    hidden = torch.randn(2, 6, 16, generator=generator).to(dtype)
    weight = (torch.randn(50, 16, generator=generator) / 4).to(dtype)
    tokens = torch.randint(0, 50, (2, 6), generator=generator)
    results = []
    for stats_fn in (
        lambda h, w: token_stats(h @ w.T, tokens, 0.8),
        lambda h, w: token_stats_from_hidden(h, w, tokens, 0.8, chunk_size=5),
    ):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        stats = stats_fn(h, w)
        assert stats.logprobs.dtype == torch.float32
        (stats.logprobs.sum() + stats.entropy.sum()).backward()
        assert h.grad is not None
        assert w.grad is not None
        assert h.grad.dtype == w.grad.dtype == dtype
        results.append((stats.logprobs, stats.entropy, h.grad, w.grad))
    (chunked, naive) = results[1], results[0]
    torch.testing.assert_close(chunked[0], naive[0])
    torch.testing.assert_close(chunked[1], naive[1])
    # The naive weight gradient is one 16-bit matmul; the chunked one accumulates in float32.
    for actual, expected in zip(chunked[2:], naive[2:], strict=True):
        scale = float(expected.abs().max())
        torch.testing.assert_close(actual, expected, rtol=2e-2, atol=2e-2 * scale)


# --- gradcheck in float64 -------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [None, 1, 2, 10])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_gradcheck_logit_functions(chunk_size: int | None, temperature: float) -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 5, (2, 3), generator=generator)
    assert torch.autograd.gradcheck(
        lambda x: token_logprobs(x, tokens, temperature, chunk_size), (logits,)
    )
    assert torch.autograd.gradcheck(
        lambda x: entropy_from_logits(x, chunk_size, temperature), (logits,)
    )

    def both(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        stats = token_stats(x, tokens, temperature, chunk_size)
        return stats.logprobs, stats.entropy

    assert torch.autograd.gradcheck(both, (logits,))


@pytest.mark.parametrize("chunk_size", [1, 2, 4, 10])
@pytest.mark.parametrize("temperature", [1.0, 1.5])
def test_gradcheck_hidden_functions(chunk_size: int, temperature: float) -> None:
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 2, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 5, (2, 2), generator=generator)
    assert torch.autograd.gradcheck(
        lambda h, w: token_logprobs_from_hidden(h, w, tokens, temperature, chunk_size),
        (hidden, weight),
    )
    assert torch.autograd.gradcheck(
        lambda h, w: entropy_from_hidden(h, w, temperature, chunk_size), (hidden, weight)
    )

    def both(h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        stats = token_stats_from_hidden(h, w, tokens, temperature, chunk_size)
        return stats.logprobs, stats.entropy

    assert torch.autograd.gradcheck(both, (hidden, weight))


# --- errors ---------------------------------------------------------------------------------

needs_checks = pytest.mark.skipif(
    not typecheck_enabled(), reason="RLCORE_TYPECHECK=0 turns run-time checks off"
)


@needs_checks
@pytest.mark.parametrize("bad", [-1, 5])
def test_token_ids_outside_the_vocabulary_are_refused(bad: int) -> None:
    tokens = torch.tensor([[0, bad]])
    pattern = rf"tokens: ids must lie in \[0, 5\).*got \[{min(0, bad)}, {max(0, bad)}\]"
    for chunk_size in (None, 1):
        with pytest.raises(ValueError, match=pattern):
            token_logprobs(torch.zeros(1, 2, 5), tokens, chunk_size=chunk_size)
        with pytest.raises(ValueError, match=pattern):
            token_stats(torch.zeros(1, 2, 5), tokens, chunk_size=chunk_size)
    with pytest.raises(ValueError, match=pattern):
        token_logprobs_from_hidden(torch.zeros(1, 2, 3), torch.zeros(5, 3), tokens)


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_non_positive_temperature_is_refused(temperature: float) -> None:
    match = rf"temperature must be positive, got {temperature}"
    with pytest.raises(ValueError, match=match):
        token_logprobs(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long), temperature)
    with pytest.raises(ValueError, match=match):
        entropy_from_logits(torch.zeros(2, 5), 1, temperature)
    with pytest.raises(ValueError, match=match):
        entropy_from_hidden(torch.zeros(2, 3), torch.zeros(5, 3), temperature)


@pytest.mark.parametrize("chunk_size", [0, -4])
def test_non_positive_chunk_size_is_refused(chunk_size: int) -> None:
    match = rf"chunk_size must be a positive number of rows, got {chunk_size}"
    tokens = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match=match):
        token_logprobs(torch.zeros(2, 5), tokens, chunk_size=chunk_size)
    with pytest.raises(ValueError, match=match):
        token_stats_from_hidden(torch.zeros(2, 3), torch.zeros(5, 3), tokens, 1.0, chunk_size)


def test_hidden_and_weight_of_different_dtypes_are_refused() -> None:
    with pytest.raises(TypeError, match=r"hidden \(torch.float32\) and lm_head_weight"):
        token_logprobs_from_hidden(
            torch.zeros(2, 3), torch.zeros(5, 3, dtype=torch.bfloat16), torch.zeros(2).long()
        )


@needs_checks
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long)),
            "token_logprobs: argument 'tokens' has shape (2, 4): dimension 'time' is 4 "
            "but 'logits' bound it to 3",
        ),
        (
            lambda: token_stats(torch.zeros(2, 3, 5), torch.zeros(3, 3, dtype=torch.long)),
            "token_stats: argument 'tokens' has shape (3, 3): dimension 'batch' is (3,) "
            "but 'logits' bound it to (2,)",
        ),
        (
            lambda: token_logprobs_from_hidden(
                torch.zeros(2, 3, 8), torch.zeros(5, 7), torch.zeros(2, 3, dtype=torch.long)
            ),
            "token_logprobs_from_hidden: argument 'lm_head_weight' has shape (5, 7): "
            "dimension 'hidden' is 7 but 'hidden' bound it to 8",
        ),
        (
            lambda: entropy_from_hidden(torch.zeros(8), torch.zeros(5, 8)),
            "entropy_from_hidden: argument 'hidden' has shape (8,) (1 dims)",
        ),
        (
            lambda: entropy_from_logits(torch.zeros(4)),
            "entropy_from_logits: argument 'logits' has shape (4,) (1 dims)",
        ),
    ],
    ids=["time", "batch", "hidden", "hidden-rank", "logits-rank"],
)
def test_wrong_shapes_name_the_argument_and_dimension(
    call: Callable[[], object], message: str
) -> None:
    with pytest.raises(TypeCheckError) as error:
        call()
    assert message in str(error.value).splitlines()[0]


# --- memory: the chunked paths never hold a [tokens, vocab] copy ---------------------------

_MEASURE = textwrap.dedent(
    """
    import json, sys, torch
    from rlcore.logprobs import token_logprobs, token_logprobs_from_hidden

    def status(field):
        with open("/proc/self/status") as lines:
            return next(int(l.split()[1]) * 1024 for l in lines if l.startswith(field + ":"))

    def reset_peak():
        # Resets VmHWM to the current VmRSS, so one process can measure several cases.
        # Where that is refused, each case needs a fresh process: report and stop.
        try:
            with open("/proc/self/clear_refs", "w") as clear_refs:
                clear_refs.write("5")
        except OSError:
            if len(sys.argv) > 2:
                print(json.dumps(None))
                sys.exit()
        return status("VmHWM")

    torch.set_num_threads(1)
    rows, vocab, width, chunk = 1024, 32768, 64, 64

    def inputs(rows, vocab):
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(rows, vocab, generator=g, requires_grad=True)
        hidden = torch.randn(rows, width, generator=g, requires_grad=True)
        weight = torch.randn(vocab, width, generator=g, requires_grad=True)
        return logits, hidden, weight, torch.randint(0, vocab, (rows,), generator=g)

    def run(case, method, logits, hidden, weight, tokens):
        size = None if method == "plain" else chunk
        if case == "hidden":
            if method == "plain":
                result = token_logprobs(hidden @ weight.T, tokens)
            else:
                result = token_logprobs_from_hidden(hidden, weight, tokens, chunk_size=size)
        elif case == "logits_forward":
            result = token_logprobs(logits.detach(), tokens, chunk_size=size)
        else:
            result = token_logprobs(logits, tokens, chunk_size=size)
        if result.requires_grad:
            result.sum().backward()
        logits.grad = hidden.grad = weight.grad = None

    cases = [argument.split(":") for argument in sys.argv[1:]]
    for case, method in cases:  # lazy first-call set-up is not the operation's memory
        run(case, method, *inputs(4, 16))
    arrays = inputs(rows, vocab)
    extra = {}
    for case, method in cases:
        before = reset_peak()
        run(case, method, *arrays)
        extra[f"{case}:{method}"] = status("VmHWM") - before
    print(json.dumps({"extra": extra, "logits_bytes": rows * vocab * 4}))
    """
)
MEMORY_CASES = ["logits_forward", "logits_backward", "hidden"]


def extra_peak_bytes(*cases: str) -> dict[str, int] | None:
    completed = subprocess.run(
        [sys.executable, "-c", _MEASURE, *cases],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result = json.loads(completed.stdout)
    if result is None:
        return None
    return {**result["extra"], "logits_bytes": result["logits_bytes"]}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_chunked_peak_memory_is_a_fraction_of_the_plain_path() -> None:
    cases = [f"{case}:{method}" for case in MEMORY_CASES for method in ("plain", "chunked")]
    measured = extra_peak_bytes(*cases)
    if measured is None:  # the peak cannot be reset here: one fresh process per case
        measured = {}
        for case in cases:
            one = extra_peak_bytes(case)
            assert one is not None
            measured.update(one)
    logits_bytes = measured["logits_bytes"]
    for case in MEMORY_CASES:
        plain, chunked = measured[f"{case}:plain"], measured[f"{case}:chunked"]
        # The plain path holds a [tokens, vocab] log-softmax (and, backward, its gradient).
        assert plain >= 0.9 * logits_bytes, (case, plain)
        # Backward, both must return a gradient as large as the logits themselves.
        inherent = logits_bytes if case == "logits_backward" else 0
        assert chunked - inherent <= 0.25 * (plain - inherent), (case, plain, chunked)
