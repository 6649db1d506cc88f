"""A policy's rollout call compiled into one graph (``rollout.compile``), and the inductor
settings every compiled call of the embodied runner uses.

A small policy's ``predict_action_batch`` on a handful of envs is a few
dozen tiny torch ops: dispatch, not arithmetic, is its cost (about 0.3 ms a
call for a 64×64 MLP on 8 CartPole envs, one core), and it runs once per env
step. `CompiledPredict` traces the call once (``make_fx`` on fake tensors,
the policy's parameters and buffers as inputs through
``torch.func.functional_call``) and compiles the graph with inductor
(`inductor_compile`): one call per env step.

- Random draws stay torch's: inductor runs them as the eager kernels on
  torch's default generator (``fallback_random``), so a seeded rollout draws
  the same actions as the eager call.
- Buffers the call updates (running observation statistics) are updated in
  place, as the eager call does.
- The graph holds for the traced observation layout (keys, shapes, dtypes,
  devices) and the policy's ``training`` flag; another layout raises
  ValueError (the runner calls the eager policy for the rows of truncated
  episodes, whose count varies).
- A policy whose call cannot be traced (a branch on a tensor's value, a
  Python-side ``.item()``, ``generate``) gets `CompileError` naming the
  policy and the cause.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn

from rlshell.models.base import ActionInfo, BasePolicy

__all__ = ["CompileError", "CompiledPredict", "inductor_compile"]

# Inductor's C++ wrapper (~50 µs less per call than its Python one on a small graph), and
# tanh as 2 / (1 + e^(−2x)) − 1: within 1.8e-7 of torch.tanh (absolute), a third of its
# time on a CPU.
_INDUCTOR_OPTIONS = {"cpp_wrapper": True, "cpp.use_decompose_tanh": True}


class CompileError(RuntimeError):
    """A policy call could not be traced for compilation; the message names why."""


def inductor_compile(
    graph: torch.fx.GraphModule, inputs: list[Any], *, eager_random: bool = False
) -> Callable[..., list[Tensor]]:
    """``graph`` (traced by ``make_fx``) compiled by inductor, without a dynamo frame.

    No dynamo guards run per call (about 0.15 ms less than ``torch.compile`` on
    a graph of ~60 inputs): the caller checks that its inputs match ``inputs``'
    layout. ``eager_random`` runs random ops as torch's eager kernels on its
    default generator (the same draws as eager) instead of inductor's own.
    """
    from torch import _inductor

    options: dict[str, Any] = dict(_INDUCTOR_OPTIONS)
    if eager_random:
        options["fallback_random"] = True
    compiled: Callable[..., list[Tensor]] = _inductor.compile(graph, inputs, options)
    return compiled


_Layout = tuple[tuple[str, tuple[int, ...], torch.dtype, torch.device], ...]


def _layout(env_obs: Mapping[str, Any]) -> _Layout:
    entries = []
    for key in sorted(env_obs):
        value = env_obs[key]
        if not isinstance(value, Tensor):
            raise TypeError(
                f"rollout.compile: env_obs['{key}'] is a {type(value).__name__}; the compiled "
                "call takes tensors only"
            )
        entries.append((key, tuple(value.shape), value.dtype, value.device))
    return tuple(entries)


class _Call(nn.Module):
    """``policy.predict_action_batch`` as a module's forward, for ``functional_call``."""

    def __init__(
        self, policy: BasePolicy, mode: Literal["train", "eval"], compute_values: bool
    ) -> None:
        super().__init__()
        self.policy = policy
        self.mode: Literal["train", "eval"] = mode
        self.compute_values = compute_values

    def forward(self, env_obs: dict[str, Tensor]) -> tuple[Tensor, ActionInfo]:
        return self.policy.predict_action_batch(
            env_obs, mode=self.mode, compute_values=self.compute_values
        )


class CompiledPredict:
    """``policy.predict_action_batch(env_obs, mode, compute_values)`` for observations laid
    out as ``example_obs``, as one compiled call; see the module docstring.

    ``bind`` re-reads the policy's parameters and buffers (a checkpoint load may
    replace them); the runner calls it once per rollout window.
    """

    def __init__(
        self,
        policy: BasePolicy,
        example_obs: Mapping[str, Tensor],
        mode: Literal["train", "eval"] = "train",
        compute_values: bool = True,
    ) -> None:
        from torch.fx.experimental.proxy_tensor import make_fx

        self.policy = policy
        self.mode = mode
        self.compute_values = compute_values
        self.training = policy.training
        self.layout = _layout(example_obs)
        self._keys = [key for key, *_ in self.layout]
        self._state: list[Tensor] = []
        self._names: list[str] = []
        self.bind(policy)
        call = _Call(policy, mode, compute_values)
        names = [f"policy.{name}" for name in self._names]
        spec: list[pytree.TreeSpec] = []

        def traced(*tensors: Tensor) -> list[Tensor]:
            state = dict(zip(names, tensors[: len(names)], strict=True))
            env_obs = dict(zip(self._keys, tensors[len(names) :], strict=True))
            out = torch.func.functional_call(call, state, (env_obs,))
            flat, tree = pytree.tree_flatten(out)
            spec[:] = [tree]
            return list(flat)

        # Copies: make_fx traces inputs that share storage as one.
        inputs: list[Any] = [t.detach().clone() for t in (*self._state, *self._obs(example_obs))]
        name = type(policy).__name__
        try:
            graph = make_fx(traced, tracing_mode="fake")(*inputs)
        except Exception as error:
            raise CompileError(
                f"rollout.compile: cannot trace {name}.predict_action_batch on env_obs "
                f"{_shown(self.layout)} ({type(error).__name__}: {error}); a compiled call "
                "must not branch on tensor values or call out of torch. Set "
                "rollout.compile=false to run it eager"
            ) from error
        self._spec = spec[0]
        self._compiled = inductor_compile(graph, inputs, eager_random=True)

    def bind(self, policy: BasePolicy) -> None:
        """Read ``policy``'s parameters and buffers: the graph's leading inputs."""
        if policy is not self.policy:
            raise ValueError(
                f"CompiledPredict was built for a {type(self.policy).__name__} at "
                f"{id(self.policy):#x}, not this {type(policy).__name__}: build one per policy"
            )
        named = [*policy.named_parameters(), *policy.named_buffers()]
        names = [name for name, _ in named]
        if self._names and names != self._names:
            raise ValueError(
                f"CompiledPredict: {type(policy).__name__}'s parameters and buffers changed "
                "since it was compiled; build a new one"
            )
        self._names = names
        self._state = [tensor.detach() for _, tensor in named]

    def __call__(self, env_obs: Mapping[str, Tensor]) -> tuple[Tensor, ActionInfo]:
        """``(actions, info)`` as ``policy.predict_action_batch`` returns them."""
        if self.policy.training != self.training:
            raise ValueError(
                f"rollout.compile: {type(self.policy).__name__} was compiled in "
                f"{'train' if self.training else 'eval'} mode (module.training), called in the "
                "other"
            )
        layout = _layout(env_obs)
        if layout != self.layout:
            raise ValueError(
                f"rollout.compile: {type(self.policy).__name__}.predict_action_batch was "
                f"compiled for env_obs {_shown(self.layout)}, called with {_shown(layout)}"
            )
        out = self._compiled(*self._state, *self._obs(env_obs))
        result: tuple[Tensor, ActionInfo] = pytree.tree_unflatten(out, self._spec)
        return result

    def _obs(self, env_obs: Mapping[str, Tensor]) -> list[Tensor]:
        return [env_obs[key] for key in self._keys]


def _shown(layout: _Layout) -> str:
    return ", ".join(
        f"{key} {list(shape)} {str(dtype).removeprefix('torch.')} on {device}"
        for key, shape, dtype, device in layout
    )
