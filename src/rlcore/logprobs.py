"""Per-token log-probabilities and entropies of a categorical policy, memory-bounded.

For logits zₜ ∈ ℝⱽ at temperature τ and sampled token yₜ:

    log πₜ(yₜ) = zₜ[yₜ]/τ − log Σᵥ exp(zₜ[v]/τ)
    Hₜ = − Σᵥ πₜ(v) log πₜ(v)

The plain path (``chunk_size=None``) is ``log_softmax(z/τ).gather(y)``: it
holds a float32 ``[tokens, vocab]`` copy, 2.5 GB for 4,096 tokens of a
151,936-word vocabulary. With ``chunk_size`` the rows are processed
``chunk_size`` at a time by a custom autograd function that keeps only the
input and recomputes each chunk's softmax in the backward pass, so the extra
memory is one or two ``chunk_size × vocab`` float buffers, forward and
backward (plus, backward, the gradient of the logits itself, which any path
must return). The buffers are allocated once and reused by every chunk: fresh
memory costs a page fault per page on first touch, which is most of the plain
path's time on a CPU. A shifted slice such as ``logits[:, :-1]`` is read in
place, one sequence at a time, never flattened into a copy.

The ``*_from_hidden`` functions go one step further: they take the final
hidden states and the LM-head weight and never materialise the logits at all
(the logits of one chunk exist at a time, in the forward and again in the
backward pass). This is the cure for the out-of-memory errors of long
reasoning rollouts, where ``[tokens, vocab]`` logits dominate the memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import torch
from jaxtyping import Float, Int
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from rlcore._checking import typecheck, typecheck_enabled

__all__ = [
    "TokenStats",
    "entropy_from_hidden",
    "entropy_from_logits",
    "token_logprobs",
    "token_logprobs_from_hidden",
    "token_stats",
    "token_stats_from_hidden",
]


@attrs.frozen(eq=False)
class TokenStats:
    """Log-probability of the taken token and the policy's entropy, per token."""

    logprobs: Float[Tensor, "*batch time"]
    entropy: Float[Tensor, "*batch time"]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half-precision logits are upcast: a log-softmax in bf16 loses ~3 digits.
    return torch.promote_types(dtype, torch.float32)


def _validate(tokens: Tensor, vocab: int, temperature: float, chunk_size: int | None) -> None:
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive number of rows, got {chunk_size}")
    if typecheck_enabled() and tokens.numel() > 0:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab:
            raise ValueError(
                f"tokens: ids must lie in [0, {vocab}) (the vocabulary), got [{low}, {high}]"
            )


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    z = logits.to(_compute_dtype(logits.dtype))
    return z / temperature if temperature != 1.0 else z


def _plain_stats(z: Tensor, tokens: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor]:
    """The reference: log_softmax(z).gather(y) and −Σ π log π, differentiated by autograd."""
    log_softmax = torch.log_softmax(z, dim=-1)
    logprobs = log_softmax.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(dim=-1) if with_entropy else z.new_zeros(0)
    return logprobs, entropy


class _Scratch:
    """``[chunk, vocab]`` buffers allocated once and reused by every chunk.

    Fresh memory is paid for when first touched (a page fault per page), so a
    new buffer per chunk would cost as much time as the full-size copy that
    chunking avoids; a few reused buffers are touched once.
    """

    def __init__(self, rows: int, vocab: int, device: torch.device) -> None:
        self._rows, self._vocab, self._device = rows, vocab, device
        self._buffers: dict[tuple[str, torch.dtype], Tensor] = {}

    def get(self, name: str, rows: int, dtype: torch.dtype) -> Tensor:
        buffer = self._buffers.get((name, dtype))
        if buffer is None:
            buffer = torch.empty(self._rows, self._vocab, dtype=dtype, device=self._device)
            self._buffers[(name, dtype)] = buffer
        return buffer[:rows]


def _scaled_chunk(logits: Tensor, temperature: float, scratch: _Scratch) -> tuple[Tensor, bool]:
    """z = x/τ in the compute dtype; returns (z, whether z is scratch that may be overwritten)."""
    dtype = _compute_dtype(logits.dtype)
    if logits.dtype == dtype and temperature == 1.0:
        return logits, False
    z = scratch.get("z", logits.shape[0], dtype)
    if logits.dtype == dtype:
        torch.div(logits, temperature, out=z)
    else:
        z.copy_(logits)
        if temperature != 1.0:
            z.div_(temperature)
    return z, True


def _chunk_logits(hidden: Tensor, weight: Tensor, temperature: float, scratch: _Scratch) -> Tensor:
    """z = h Wᵀ/τ for one chunk of rows, in the compute dtype, written into scratch."""
    dtype = _compute_dtype(weight.dtype)
    rows = hidden.shape[0]
    z = scratch.get("z", rows, dtype)
    if weight.dtype == dtype:
        torch.mm(hidden, weight.T, out=z)
    else:
        z.copy_(torch.mm(hidden, weight.T, out=scratch.get("matmul", rows, weight.dtype)))
    if temperature != 1.0:
        z.div_(temperature)
    return z


def _forward_chunk(
    z: Tensor, tokens: Tensor, log_softmax_out: Tensor, probs_out: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """(log π(y), H) of one chunk; the entropy only when ``probs_out`` is given (it may alias z)."""
    log_softmax = torch.log_softmax(z, dim=-1, out=log_softmax_out)
    logprobs = log_softmax.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    if probs_out is None:
        return logprobs, None
    probs = torch.exp(log_softmax, out=probs_out)
    return logprobs, probs.mul_(log_softmax).sum(dim=-1).neg_()


def _grad_chunk(
    z: Tensor,
    tokens: Tensor,
    entropy: Tensor,
    grad_logprobs: Tensor | None,
    grad_entropy: Tensor | None,
    temperature: float,
    out: Tensor,
    spare: Tensor | None,
) -> Tensor:
    """Writes into ``out`` ∂/∂x of Σₜ gₗ log πₜ(yₜ) + gₕ Hₜ, x = τz the unscaled logits.

    ∂ log π(y)/∂xᵥ = (𝟙[v=y] − πᵥ)/τ,   ∂H/∂xᵥ = −πᵥ (log πᵥ + H)/τ.

    ``spare`` is scratch for π when the entropy has a gradient (it may alias z).
    """
    if grad_entropy is None:
        grad = torch.softmax(z, dim=-1, out=out)
        if grad_logprobs is None:
            return grad.zero_()
        grad.mul_(grad_logprobs.neg().unsqueeze(-1))
    else:
        assert spare is not None
        log_softmax = torch.log_softmax(z, dim=-1, out=out)
        probs = torch.exp(log_softmax, out=spare)
        # −π ⊙ (gₕ log π + gₕ H + gₗ), the gₗ term only when log π(y) has a gradient.
        offset = grad_entropy * entropy
        if grad_logprobs is not None:
            offset = offset + grad_logprobs
        grad = log_softmax.mul_(grad_entropy.neg().unsqueeze(-1))
        grad.sub_(offset.unsqueeze(-1)).mul_(probs)
    if grad_logprobs is not None:
        grad.scatter_add_(-1, tokens.unsqueeze(-1), grad_logprobs.unsqueeze(-1))
    if temperature != 1.0:
        grad.div_(temperature)
    return grad


def _row_chunks(sequences: int, length: int, chunk_size: int) -> Iterator[tuple[int, int, int]]:
    for sequence in range(sequences):
        for start in range(0, length, chunk_size):
            yield sequence, start, min(start + chunk_size, length)


class _ChunkedLogitStats(torch.autograd.Function):
    """(log π(y), H) of ``[sequences, time, vocab]`` logits, ``chunk_size`` rows at a time."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        logits: Tensor,
        tokens: Tensor,
        temperature: float,
        chunk_size: int,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        sequences, length, vocab = logits.shape
        dtype = _compute_dtype(logits.dtype)
        logprobs = logits.new_empty((sequences, length), dtype=dtype)
        entropy = logits.new_empty((sequences, length) if with_entropy else (0,), dtype=dtype)
        scratch = _Scratch(min(chunk_size, length), vocab, logits.device)
        for sequence, start, end in _row_chunks(sequences, length, chunk_size):
            z, z_is_scratch = _scaled_chunk(logits[sequence, start:end], temperature, scratch)
            probs_out = None
            if with_entropy:
                probs_out = z if z_is_scratch else scratch.get("probs", end - start, dtype)
            chunk_logprobs, chunk_entropy = _forward_chunk(
                z,
                tokens[sequence, start:end],
                scratch.get("log_softmax", end - start, dtype),
                probs_out,
            )
            logprobs[sequence, start:end] = chunk_logprobs
            if chunk_entropy is not None:
                entropy[sequence, start:end] = chunk_entropy
        ctx.save_for_backward(logits, tokens, entropy)
        ctx.temperature = temperature  # type: ignore[attr-defined]
        ctx.chunk_size = chunk_size  # type: ignore[attr-defined]
        ctx.with_entropy = with_entropy  # type: ignore[attr-defined]
        return logprobs, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_logprobs: Tensor | None, grad_entropy: Tensor | None) -> Any:
        logits, tokens, entropy = ctx.saved_tensors
        if not ctx.with_entropy:
            grad_entropy = None
        if grad_logprobs is None and grad_entropy is None:
            return None, None, None, None, None
        sequences, length, vocab = logits.shape
        dtype = _compute_dtype(logits.dtype)
        grad_logits = torch.empty_like(logits)
        in_place = grad_logits.dtype == dtype
        scratch = _Scratch(min(ctx.chunk_size, length), vocab, logits.device)
        for sequence, start, end in _row_chunks(sequences, length, ctx.chunk_size):
            rows = (sequence, slice(start, end))
            z, z_is_scratch = _scaled_chunk(logits[rows], ctx.temperature, scratch)
            spare = None
            if grad_entropy is not None:
                spare = z if z_is_scratch else scratch.get("probs", end - start, dtype)
            grad = _grad_chunk(
                z,
                tokens[rows],
                entropy[rows] if grad_entropy is not None else entropy,
                None if grad_logprobs is None else grad_logprobs[rows],
                None if grad_entropy is None else grad_entropy[rows],
                ctx.temperature,
                grad_logits[rows] if in_place else scratch.get("grad", end - start, dtype),
                spare,
            )
            if not in_place:
                grad_logits[rows] = grad
        return grad_logits, None, None, None, None


class _ChunkedHiddenStats(torch.autograd.Function):
    """(log π(y), H) of softmax(h Wᵀ/τ), ``chunk_size`` rows of logits at a time."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        hidden: Tensor,
        weight: Tensor,
        tokens: Tensor,
        temperature: float,
        chunk_size: int,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        rows = hidden.shape[0]
        dtype = _compute_dtype(hidden.dtype)
        logprobs = hidden.new_empty(rows, dtype=dtype)
        entropy = hidden.new_empty(rows if with_entropy else 0, dtype=dtype)
        scratch = _Scratch(min(chunk_size, rows), weight.shape[0], hidden.device)
        for _, start, end in _row_chunks(1, rows, chunk_size):
            z = _chunk_logits(hidden[start:end], weight, temperature, scratch)
            chunk_logprobs, chunk_entropy = _forward_chunk(
                z,
                tokens[start:end],
                scratch.get("log_softmax", end - start, dtype),
                z if with_entropy else None,
            )
            logprobs[start:end] = chunk_logprobs
            if chunk_entropy is not None:
                entropy[start:end] = chunk_entropy
        ctx.save_for_backward(hidden, weight, tokens, entropy)
        ctx.temperature = temperature  # type: ignore[attr-defined]
        ctx.chunk_size = chunk_size  # type: ignore[attr-defined]
        ctx.with_entropy = with_entropy  # type: ignore[attr-defined]
        return logprobs, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_logprobs: Tensor | None, grad_entropy: Tensor | None) -> Any:
        hidden, weight, tokens, entropy = ctx.saved_tensors
        if not ctx.with_entropy:
            grad_entropy = None
        if grad_logprobs is None and grad_entropy is None:
            return None, None, None, None, None, None
        rows = hidden.shape[0]
        dtype = _compute_dtype(weight.dtype)
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        # Accumulated over chunks in at least float32, rounded to the weight's dtype once.
        grad_weight = (
            torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need_weight else None
        )
        scratch = _Scratch(min(ctx.chunk_size, rows), weight.shape[0], hidden.device)
        for _, start, end in _row_chunks(1, rows, ctx.chunk_size):
            hidden_chunk = hidden[start:end]
            z = _chunk_logits(hidden_chunk, weight, ctx.temperature, scratch)
            grad_z = _grad_chunk(
                z,
                tokens[start:end],
                entropy[start:end] if grad_entropy is not None else entropy,
                None if grad_logprobs is None else grad_logprobs[start:end],
                None if grad_entropy is None else grad_entropy[start:end],
                ctx.temperature,
                scratch.get("grad", end - start, dtype),
                z,
            )
            if grad_hidden is not None:
                if weight.dtype == dtype:
                    torch.mm(grad_z, weight, out=grad_hidden[start:end])
                else:
                    low = scratch.get("matmul", end - start, weight.dtype).copy_(grad_z)
                    torch.mm(low, weight, out=grad_hidden[start:end])
            if grad_weight is not None:
                grad_weight.addmm_(grad_z.T, hidden_chunk.to(dtype))
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def _as_sequences(logits: Tensor) -> Tensor:
    """``[*batch, time, vocab]`` as ``[sequences, time, vocab]``, without copying when possible.

    A contiguous tensor becomes one long sequence; a shifted slice such as
    ``logits[:, :-1]`` cannot be flattened into rows without a full copy, but
    its sequences can be stacked as a view.
    """
    vocab = logits.shape[-1]
    for shape in ((1, -1, vocab), (-1, logits.shape[-2], vocab)):
        try:
            return logits.view(shape)
        except RuntimeError:
            continue
    return logits.reshape(1, -1, vocab)


def _logit_stats(
    logits: Tensor, tokens: Tensor, temperature: float, chunk_size: int | None, with_entropy: bool
) -> tuple[Tensor, Tensor]:
    vocab = logits.shape[-1]
    _validate(tokens, vocab, temperature, chunk_size)
    batch_shape = tokens.shape
    if chunk_size is None:
        logprobs, entropy = _plain_stats(_scaled(logits, temperature), tokens, with_entropy)
    else:
        sequences = _as_sequences(logits)
        logprobs, entropy = _ChunkedLogitStats.apply(  # type: ignore[no-untyped-call]
            sequences, tokens.reshape(sequences.shape[:2]), temperature, chunk_size, with_entropy
        )
    return logprobs.reshape(batch_shape), entropy.reshape(batch_shape if with_entropy else (0,))


def _hidden_stats(
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
) -> tuple[Tensor, Tensor]:
    _validate(tokens, weight.shape[0], temperature, chunk_size)
    if hidden.dtype != weight.dtype:
        raise TypeError(
            f"hidden ({hidden.dtype}) and lm_head_weight ({weight.dtype}) must share a dtype"
        )
    batch_shape = tokens.shape
    logprobs, entropy = _ChunkedHiddenStats.apply(  # type: ignore[no-untyped-call]
        hidden.reshape(-1, hidden.shape[-1]),
        weight,
        tokens.reshape(-1),
        temperature,
        chunk_size,
        with_entropy,
    )
    return logprobs.reshape(batch_shape), entropy.reshape(batch_shape if with_entropy else (0,))


@typecheck
def token_logprobs(
    logits: Float[Tensor, "*batch time vocab"],
    tokens: Int[Tensor, "*batch time"],
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> Float[Tensor, "*batch time"]:
    """log π(yₜ) = zₜ[yₜ]/τ − logsumexp(zₜ/τ), computed in at least float32.

    ``logits[..., t, :]`` must be the logits that predicted ``tokens[..., t]``
    (shift the model's output by one before calling). With ``chunk_size`` the
    extra memory is ``chunk_size × vocab`` floats instead of ``tokens × vocab``,
    forward and backward; the result equals the plain path.
    """
    return _logit_stats(logits, tokens, temperature, chunk_size, with_entropy=False)[0]


@typecheck
def entropy_from_logits(
    logits: Float[Tensor, "*batch time vocab"],
    chunk_size: int | None = None,
    temperature: float = 1.0,
) -> Float[Tensor, "*batch time"]:
    """Hₜ = logsumexp(zₜ/τ) − Σᵥ πₜ(v) zₜ[v]/τ, the entropy of each token's distribution."""
    tokens = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    return _logit_stats(logits, tokens, temperature, chunk_size, with_entropy=True)[1]


@typecheck
def token_stats(
    logits: Float[Tensor, "*batch time vocab"],
    tokens: Int[Tensor, "*batch time"],
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> TokenStats:
    """`token_logprobs` and `entropy_from_logits` in one pass over the logits."""
    logprobs, entropy = _logit_stats(logits, tokens, temperature, chunk_size, with_entropy=True)
    return TokenStats(logprobs=logprobs, entropy=entropy)


@typecheck
def token_logprobs_from_hidden(
    hidden: Float[Tensor, "*batch time hidden"],
    lm_head_weight: Float[Tensor, "vocab hidden"],
    tokens: Int[Tensor, "*batch time"],
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> Float[Tensor, "*batch time"]:
    """log π(yₜ) with zₜ = W hₜ, never holding more than ``chunk_size`` rows of logits.

    ``hidden`` is the last hidden state (after the final norm), ``lm_head_weight``
    the ``[vocab, hidden]`` output projection (tied or not; an LM head with a
    bias is not supported). Gradients flow to both, recomputing each chunk's
    logits in the backward pass: peak extra memory is ``chunk_size × vocab``
    floats plus the weight's gradient.
    """
    return _hidden_stats(hidden, lm_head_weight, tokens, temperature, chunk_size, False)[0]


@typecheck
def entropy_from_hidden(
    hidden: Float[Tensor, "*batch time hidden"],
    lm_head_weight: Float[Tensor, "vocab hidden"],
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> Float[Tensor, "*batch time"]:
    """Hₜ of πₜ = softmax(W hₜ / τ), without materialising the logits."""
    tokens = torch.zeros(hidden.shape[:-1], dtype=torch.long, device=hidden.device)
    return _hidden_stats(hidden, lm_head_weight, tokens, temperature, chunk_size, True)[1]


@typecheck
def token_stats_from_hidden(
    hidden: Float[Tensor, "*batch time hidden"],
    lm_head_weight: Float[Tensor, "vocab hidden"],
    tokens: Int[Tensor, "*batch time"],
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> TokenStats:
    """`token_logprobs_from_hidden` and `entropy_from_hidden` sharing one matmul per chunk."""
    logprobs, entropy = _hidden_stats(hidden, lm_head_weight, tokens, temperature, chunk_size, True)
    return TokenStats(logprobs=logprobs, entropy=entropy)
