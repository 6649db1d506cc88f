"""The embodied policy contract, kept from RLinf so models port with renamed imports.

A policy is an ``nn.Module`` with two entry points:

- ``predict_action_batch(env_obs, mode, compute_values)`` at rollout time:
  ``env_obs`` holds ``states``, ``main_images``, ``wrist_images``,
  ``extra_view_images`` and ``task_descriptions`` (the optional ones may be
  absent). It returns ``(actions, {"prev_logprobs", "prev_values",
  "forward_inputs"})``: actions the env can execute as they are (any
  post-processing happens inside the policy), and ``forward_inputs``, the
  tensors that ``default_forward`` needs to recompute the log-probs (the
  observation tensors and the sampled raw action). ``mode="eval"`` is
  deterministic.
- ``forward(forward_type, **kwargs)`` at training time, so that FSDP and
  hooks see one ``__call__``: ``ForwardType.DEFAULT`` recomputes
  ``{"logprobs", "entropy", "values"}`` from ``forward_inputs``; ``SFT``,
  ``SAC`` (actions and log-probs, reparameterised) and ``SAC_Q`` (twin Q
  values) are optional and raise `NotImplementedError` unless a policy
  overrides them.
"""

from __future__ import annotations

import abc
import difflib
import enum
from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict, TypeVar

from torch import Tensor, nn

__all__ = ["ActionInfo", "BasePolicy", "ForwardType", "MissingInputError"]


class ForwardType(enum.StrEnum):
    """What a policy's ``forward`` computes; a plain string of the same value is accepted.

    A ``StrEnum``: a ``str`` and an ``Enum``, as RLinf's ``(str, Enum)``, so
    ``ForwardType.SAC == "sac"``.
    """

    DEFAULT = "default"
    SFT = "sft"
    SAC = "sac"
    SAC_Q = "sac_q"

    @classmethod
    def parse(cls, value: ForwardType | str) -> ForwardType:
        """``value`` as a `ForwardType`; an unknown string raises ValueError listing the valid."""
        if isinstance(value, ForwardType):
            return value
        try:
            return cls(value)
        except ValueError:
            valid = [member.value for member in cls]
            close = difflib.get_close_matches(str(value), valid, n=1, cutoff=0.5)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            shown = ", ".join(f"'{v}'" for v in valid)
            raise ValueError(
                f"unknown forward_type {value!r}{hint}; expected one of {shown}"
            ) from None


class ActionInfo(TypedDict):
    """What `BasePolicy.predict_action_batch` returns beside the actions.

    ``prev_logprobs``: log π(a|s) of the sampled action under the rollout
    weights; ``prev_values``: V(s), present only when asked for and the policy
    has a value head; ``forward_inputs``: what `BasePolicy.default_forward` reads.
    """

    prev_logprobs: Tensor
    prev_values: NotRequired[Tensor]
    forward_inputs: dict[str, Tensor]


class MissingInputError(KeyError):
    """A policy was handed a dict (``forward_inputs``, ``env_obs``) without a key it needs."""

    def __init__(self, policy: str, source: str, key: str, present: list[str]) -> None:
        super().__init__(key)
        self.policy = policy
        self.source = source
        self.key = key
        self.present = present

    def __str__(self) -> str:
        # KeyError's own __str__ would show the repr of the key only.
        where = f"{self.policy} needs {self.source}['{self.key}']"
        if not self.present:
            return f"{where}, but it is empty"
        return f"{where}, but it holds only {', '.join(repr(k) for k in self.present)}"


V = TypeVar("V")

# ForwardType -> the method that computes it: one table, not an if/elif chain.
_FORWARD_METHODS: dict[ForwardType, str] = {
    ForwardType.DEFAULT: "default_forward",
    ForwardType.SFT: "sft_forward",
    ForwardType.SAC: "sac_forward",
    ForwardType.SAC_Q: "sac_q_forward",
}


class BasePolicy(nn.Module, abc.ABC):
    """An embodied policy: ``predict_action_batch`` for rollout, ``forward`` for training."""

    action_chunk: int = 1
    """Env steps one ``predict_action_batch`` call's actions cover (RLinf's
    ``num_action_chunks``): above 1 its actions are ``[batch, action_chunk, *action_shape]``,
    stepped one after the other (`rlshell.envs.stepper.EnvStepper.step`'s ``chunk``)."""

    def forward(self, forward_type: ForwardType | str = ForwardType.DEFAULT, **kwargs: Any) -> Any:
        """Dispatch to ``<forward_type>_forward(**kwargs)`` (``default_forward`` by default)."""
        method = getattr(self, _FORWARD_METHODS[ForwardType.parse(forward_type)])
        return method(**kwargs)

    @abc.abstractmethod
    def default_forward(
        self,
        forward_inputs: dict[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = True,
        compute_values: bool = True,
    ) -> dict[str, Tensor]:
        """Recompute ``{"logprobs", "entropy", "values"}`` (those requested) from rollout's cache.

        ``forward_inputs`` is the dict `predict_action_batch` returned; the
        log-probs are those of the action it cached, under the current weights.
        """

    @abc.abstractmethod
    def predict_action_batch(
        self,
        env_obs: dict[str, Any],
        mode: Literal["train", "eval"] = "train",
        compute_values: bool = True,
    ) -> tuple[Tensor, ActionInfo]:
        """Act on a batch: ``(actions, {"prev_logprobs", "prev_values", "forward_inputs"})``.

        ``env_obs`` maps ``states``, ``main_images``, ``wrist_images`` and
        ``extra_view_images`` to tensors with a leading batch dimension and
        ``task_descriptions`` to one string per row; a policy reads the keys it
        needs. ``actions`` are ready for the env; ``forward_inputs`` is a
        ``dict[str, Tensor]`` that `default_forward` accepts. ``"eval"`` is
        deterministic (the mode of the action distribution).
        """

    def sft_forward(self, *args: Any, **kwargs: Any) -> Any:
        """Supervised fine-tuning loss inputs; optional."""
        raise self._unsupported(ForwardType.SFT)

    def sac_forward(self, *args: Any, **kwargs: Any) -> Any:
        """Reparameterised actions and their log-probs for SAC's actor loss; optional."""
        raise self._unsupported(ForwardType.SAC)

    def sac_q_forward(self, *args: Any, **kwargs: Any) -> Any:
        """Twin Q values for SAC's critic loss; optional."""
        raise self._unsupported(ForwardType.SAC_Q)

    def require_input(self, inputs: Mapping[str, V], key: str, source: str = "forward_inputs") -> V:
        """``inputs[key]``, else a `MissingInputError` naming the key, policy and keys present."""
        try:
            return inputs[key]
        except KeyError:
            raise MissingInputError(type(self).__name__, source, key, sorted(inputs)) from None

    def _unsupported(self, forward_type: ForwardType) -> NotImplementedError:
        return NotImplementedError(
            f"{type(self).__name__} does not support forward_type '{forward_type.value}'"
        )
