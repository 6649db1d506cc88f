"""Per-token log-probabilities and entropies of a categorical policy, memory-bounded.

For logits zₜ ∈ ℝⱽ at temperature τ and sampled token yₜ:

    log πₜ(yₜ) = zₜ[yₜ]/τ − log Σᵥ exp(zₜ[v]/τ)
    Hₜ = − Σᵥ πₜ(v) log πₜ(v)

The plain path (``chunk_size=None``) is ``log_softmax(z/τ).gather(y)``: it
holds a float32 ``[tokens, vocab]`` copy, 2.5 GB for 4,096 tokens of a
151,936-word vocabulary. With ``chunk_size`` the rows are processed
``chunk_size`` at a time by a custom autograd function that keeps only the
input and recomputes each chunk's softmax in the backward pass, so the extra
memory is ``chunk_size × vocab`` floats, forward and backward.

The ``*_from_hidden`` functions go one step further: they take the final
hidden states and the LM-head weight and never materialise the logits at all
(the logits of one chunk exist at a time, in the forward and again in the
backward pass). This is the cure for the out-of-memory errors of long
reasoning rollouts, where ``[tokens, vocab]`` logits dominate the memory.
"""

from __future__ import annotations

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


def _chunk_stats(z: Tensor, tokens: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Log-softmax of one chunk of scaled logits; returns (logsoftmax, logprobs, entropy)."""
    log_softmax = torch.log_softmax(z, dim=-1)
    logprobs = log_softmax.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(dim=-1) if with_entropy else z.new_zeros(0)
    return log_softmax, logprobs, entropy


def _chunk_grad(
    log_softmax: Tensor,
    tokens: Tensor,
    grad_logprobs: Tensor | None,
    grad_entropy: Tensor | None,
    temperature: float,
) -> Tensor:
    """∂/∂z of gₗ·log π(y) + gₕ·H for one chunk, z the unscaled logits.

    ∂ log π(y)/∂zᵥ = (𝟙[v=y] − πᵥ)/τ,   ∂H/∂zᵥ = −πᵥ (log πᵥ + H)/τ.
    """
    probs = log_softmax.exp()
    grad = torch.zeros_like(log_softmax)
    if grad_logprobs is not None:
        grad = grad - probs * grad_logprobs.unsqueeze(-1)
        grad.scatter_add_(-1, tokens.unsqueeze(-1), grad_logprobs.unsqueeze(-1))
    if grad_entropy is not None:
        entropy = -(probs * log_softmax).sum(dim=-1, keepdim=True)
        grad = grad - probs * (log_softmax + entropy) * grad_entropy.unsqueeze(-1)
    if temperature != 1.0:
        grad = grad / temperature
    return grad


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    z = logits.to(_compute_dtype(logits.dtype))
    return z / temperature if temperature != 1.0 else z


class _ChunkedLogitStats(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx,
        logits: Tensor,
        tokens: Tensor,
        temperature: float,
        chunk_size: int,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        rows = logits.shape[0]
        dtype = _compute_dtype(logits.dtype)
        logprobs = logits.new_empty(rows, dtype=dtype)
        entropy = logits.new_empty(rows if with_entropy else 0, dtype=dtype)
        for start in range(0, rows, chunk_size):
            end = min(start + chunk_size, rows)
            z = _scaled(logits[start:end], temperature)
            _, logprobs[start:end], chunk_entropy = _chunk_stats(z, tokens[start:end], with_entropy)
            if with_entropy:
                entropy[start:end] = chunk_entropy
        ctx.save_for_backward(logits, tokens)
        ctx.temperature = temperature  # type: ignore[attr-defined]
        ctx.chunk_size = chunk_size  # type: ignore[attr-defined]
        ctx.with_entropy = with_entropy  # type: ignore[attr-defined]
        return logprobs, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_logprobs: Tensor | None, grad_entropy: Tensor | None) -> Any:
        logits, tokens = ctx.saved_tensors
        if not ctx.with_entropy:
            grad_entropy = None
        grad_logits = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk_size):
            end = min(start + ctx.chunk_size, logits.shape[0])
            z = _scaled(logits[start:end], ctx.temperature)
            log_softmax = torch.log_softmax(z, dim=-1)
            grad = _chunk_grad(
                log_softmax,
                tokens[start:end],
                None if grad_logprobs is None else grad_logprobs[start:end],
                None if grad_entropy is None else grad_entropy[start:end],
                ctx.temperature,
            )
            grad_logits[start:end] = grad
        return grad_logits, None, None, None, None


class _ChunkedHiddenStats(torch.autograd.Function):
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
        rows = hidden.shape[0]
        dtype = _compute_dtype(hidden.dtype)
        logprobs = hidden.new_empty(rows, dtype=dtype)
        entropy = hidden.new_empty(rows if with_entropy else 0, dtype=dtype)
        for start in range(0, rows, chunk_size):
            end = min(start + chunk_size, rows)
            z = _scaled(hidden[start:end] @ weight.T, temperature)
            _, logprobs[start:end], chunk_entropy = _chunk_stats(z, tokens[start:end], with_entropy)
            if with_entropy:
                entropy[start:end] = chunk_entropy
        ctx.save_for_backward(hidden, weight, tokens)
        ctx.temperature = temperature  # type: ignore[attr-defined]
        ctx.chunk_size = chunk_size  # type: ignore[attr-defined]
        ctx.with_entropy = with_entropy  # type: ignore[attr-defined]
        return logprobs, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_logprobs: Tensor | None, grad_entropy: Tensor | None) -> Any:
        hidden, weight, tokens = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not ctx.with_entropy:
            grad_entropy = None
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=_compute_dtype(weight.dtype), device=weight.device)
            if need_weight
            else None
        )
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            end = min(start + ctx.chunk_size, hidden.shape[0])
            hidden_chunk = hidden[start:end]
            z = _scaled(hidden_chunk @ weight.T, ctx.temperature)
            grad_z = _chunk_grad(
                torch.log_softmax(z, dim=-1),
                tokens[start:end],
                None if grad_logprobs is None else grad_logprobs[start:end],
                None if grad_entropy is None else grad_entropy[start:end],
                ctx.temperature,
            )
            if grad_hidden is not None:
                grad_hidden[start:end] = grad_z.to(weight.dtype) @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad_z.T, hidden_chunk.to(grad_weight.dtype))
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def _logit_stats(
    logits: Tensor, tokens: Tensor, temperature: float, chunk_size: int | None, with_entropy: bool
) -> tuple[Tensor, Tensor]:
    vocab = logits.shape[-1]
    _validate(tokens, vocab, temperature, chunk_size)
    batch_shape = tokens.shape
    flat_logits = logits.reshape(-1, vocab)
    flat_tokens = tokens.reshape(-1)
    if chunk_size is None:
        _, logprobs, entropy = _chunk_stats(
            _scaled(flat_logits, temperature), flat_tokens, with_entropy
        )
    else:
        logprobs, entropy = _ChunkedLogitStats.apply(  # type: ignore[no-untyped-call]
            flat_logits, flat_tokens, temperature, chunk_size, with_entropy
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
