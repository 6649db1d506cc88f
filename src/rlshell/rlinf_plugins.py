"""RLinf's plug-in signatures: advantages and policy losses written RLinf's way, registered
in rlcore's registries.

RLinf registers its algorithms with decorators over keyword arguments::

    @register_advantage("my_adv")
    def my_adv(rewards, values, dones, gamma=1.0, gae_lambda=1.0, loss_mask=None, **kwargs):
        ...
        return advantages, returns          # returns may be None

    @register_policy_loss("my_loss")
    def my_loss(logprobs, old_logprobs, advantages, clip_ratio_low, clip_ratio_high,
                loss_mask=None, **kwargs):
        ...
        return loss, {"actor/clip_fraction": ...}

The decorators here take such functions unchanged and register an adapter in
`rlcore.registry.ADVANTAGES` / `POLICY_LOSSES`, so a config names them as it
names a built-in (``algorithm.adv_type=my_adv``, ``algorithm.loss_type=my_loss``)
in the reasoning runner and in the embodied PPO runner. The function itself is
returned, as RLinf's decorators return it. Names are lowercased, as RLinf does.

The adapter translates rlcore's records (`rlcore.advantages.AdvantageBatch`,
`rlcore.losses.PolicyLossBatch` and their configs) into RLinf's keyword
arguments (`ADVANTAGE_ARGUMENTS`, `LOSS_ARGUMENTS`; a function that takes
``**kwargs`` gets all of them, one that does not gets the ones it names), and
checks what comes back before anything else reads it: the tuple, each
tensor's shape and dtype, NaN or infinite values where the mask is set, and a
loss that carries no gradient. A wrong one raises `PluginOutputError` naming
the plug-in, the tensor, what it was and what was expected. A function asking
for an argument RLinf passes and rlstack has not (``prev_values``,
``loss_mask_sum``, ``max_episode_steps``...) without a default is refused when
it is registered.

The hyperparameters a plug-in reads are the ones its signature names
(``gamma``, ``gae_lambda``, ``clip_ratio_low``...; all of them with
``**kwargs``): validation then refuses the config keys of those it does not
read (`rlcore.registry.Registry.reads`), as for the built-ins.

No maths lives here: layouts are transposed, checked and handed over.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
import torch
from torch import Tensor

from rlcore.advantages import AdvantageBatch, AdvantageConfig
from rlcore.losses import PolicyLossBatch, PolicyLossConfig
from rlcore.masked import aggregate, masked_sum
from rlcore.registry import ADVANTAGES, POLICY_LOSSES
from rlcore.types import Advantages, LossOutput

__all__ = [
    "ADVANTAGE_ARGUMENTS",
    "LOSS_ARGUMENTS",
    "PluginNonFiniteError",
    "PluginOutputError",
    "RLinfAdvantage",
    "RLinfPolicyLoss",
    "register_advantage",
    "register_policy_loss",
]

F = TypeVar("F", bound=Callable[..., Any])

ADVANTAGE_ARGUMENTS: dict[str, str] = {
    "rewards": "float [T, B]: each step's (token's) reward, time first",
    "loss_mask": "bool [T, B]: the steps that count (a response's tokens, an episode's steps)",
    "dones": "bool [T + 1, B]: dones[t + 1] is True where step t ended its row's episode",
    "values": "float [T + 1, B] or None: the critic's values, a zero row appended to "
    "bootstrap from; None where the run trains no critic",
    "reward_scores": "float [B]: each row's outcome score, the sum of its rewards over loss_mask",
    "group_size": "int: rows b·n … b·n + n − 1 answer the same prompt (or start alike)",
    "gamma": "float: the discount (algorithm.gamma)",
    "gae_lambda": "float: GAE's λ (algorithm.lam)",
    "normalize_advantages": "bool: whether the built-in GAE whitens its advantages",
    "logprobs": "float [T, B] or None: the rollout's log-probabilities",
    "teacher_logprobs": "float [T, B] or None: a teacher's log-probabilities (distillation)",
    "adv_type": "str: the name the plug-in was registered under",
}
"""What an advantage registered with `register_advantage` may take, by RLinf's names. It
returns ``(advantages, returns)``, each float ``[T, B]`` like ``rewards``; ``returns`` may be
None (the advantages then stand for them, as for rlcore's outcome estimators)."""

LOSS_ARGUMENTS: dict[str, str] = {
    "logprobs": "float [B, T]: the policy's log-probabilities now (the gradient flows here)",
    "old_logprobs": "float [B, T]: the behaviour policy's",
    "advantages": "float [B, T]",
    "loss_mask": "bool [B, T]",
    "clip_ratio_low": "float: ε_low (algorithm.clip_low, 0.2 unset)",
    "clip_ratio_high": "float: ε_high (algorithm.clip_high, ε_low unset)",
    "clip_ratio_c": "float or None: the dual clip (algorithm.dual_clip)",
    "behave_weight_threshold": "float or None: decoupled PPO's behaviour weight cap "
    "(algorithm.behavior_weight_cap)",
    "proximal_logprobs": "float [B, T] or None: the proximal policy's (decoupled PPO)",
    "weights": "float [B, T] or None: per-token importance weights (algorithm.rollout_is)",
    "loss_agg_func": "callable (values [B, T], mask [B, T]) -> scalar: the run's aggregation "
    "(algorithm.loss_agg_mode, over the whole batch's normaliser)",
    "loss_type": "str: the name the plug-in was registered under",
}
"""What a policy loss registered with `register_policy_loss` may take, by RLinf's names. It
returns ``(loss, metrics)``: a scalar float tensor that depends on ``logprobs``, and a
dict of scalar metrics (an ``actor/`` prefix is dropped: the shell logs them under
``train/``)."""

# The hyperparameters (rlcore's config fields) each RLinf argument carries.
_ADVANTAGE_HYPERPARAMETERS = {
    "gamma": ("gamma",),
    "gae_lambda": ("lam",),
    "normalize_advantages": ("whiten",),
}
_LOSS_HYPERPARAMETERS = {
    "clip_ratio_low": ("clip_low",),
    "clip_ratio_high": ("clip_low", "clip_high"),  # ε_high follows ε_low when unset
    "clip_ratio_c": ("dual_clip",),
    "behave_weight_threshold": ("behavior_weight_cap",),
    "loss_agg_func": ("agg",),
}
_PPO_CLIP = 0.2


class PluginOutputError(ValueError):
    """A plug-in returned something other than what its kind returns (the message says what)."""


class PluginNonFiniteError(PluginOutputError, FloatingPointError):
    """A plug-in returned NaN or infinite values where they count (a FloatingPointError, as
    the update's own non-finite checks raise)."""


def register_advantage(name: str, *, force: bool = False) -> Callable[[F], F]:
    """Decorator: register ``fn``, an advantage written RLinf's way, as ``name`` (lowercased)
    in `rlcore.registry.ADVANTAGES`; returns ``fn`` unchanged.

    ``fn`` takes keyword arguments of `ADVANTAGE_ARGUMENTS` and returns
    ``(advantages, returns)``, time first (``[T, B]``). ``force``: replace an entry of that
    name.
    """

    def decorator(fn: F) -> F:
        adapter = RLinfAdvantage.of(name.lower(), fn)
        ADVANTAGES.register(adapter.name, adapter, force=force, reads=adapter.reads())
        return fn

    return decorator


def register_policy_loss(name: str, *, force: bool = False) -> Callable[[F], F]:
    """Decorator: register ``fn``, a policy loss written RLinf's way, as ``name`` (lowercased)
    in `rlcore.registry.POLICY_LOSSES`; returns ``fn`` unchanged.

    ``fn`` takes keyword arguments of `LOSS_ARGUMENTS` and returns ``(loss, metrics)``.
    A ``proximal_logprobs`` without a default makes the runner compute them for it
    (`rlcore.registry.Registry.needs`). ``force``: replace an entry of that name.
    """

    def decorator(fn: F) -> F:
        adapter = RLinfPolicyLoss.of(name.lower(), fn)
        POLICY_LOSSES.register(
            adapter.name, adapter, force=force, reads=adapter.reads(), needs=adapter.needs()
        )
        return fn

    return decorator


@attrs.frozen
class _Signature:
    """What a plug-in's signature takes: the arguments it names, whether it takes
    ``**kwargs``, and those it names without a default."""

    named: frozenset[str]
    var_keyword: bool
    required: frozenset[str]

    @classmethod
    def of(
        cls, fn: Callable[..., Any], kind: str, name: str, offered: Mapping[str, str]
    ) -> _Signature:
        try:
            parameters = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError) as error:
            raise TypeError(f"{kind} '{name}': cannot read the signature of {fn!r}") from error
        named, required = set(), set()
        var_keyword = False
        for parameter in parameters:
            if parameter.kind is parameter.VAR_KEYWORD:
                var_keyword = True
            elif parameter.kind is parameter.VAR_POSITIONAL:
                continue
            elif parameter.kind is parameter.POSITIONAL_ONLY:
                raise TypeError(
                    f"{kind} '{name}' ({_describe(fn)}): argument '{parameter.name}' is "
                    "positional-only; RLinf's plug-ins are called with keyword arguments"
                )
            else:
                named.add(parameter.name)
                if parameter.default is parameter.empty:
                    required.add(parameter.name)
        unknown = sorted(required - set(offered))
        if unknown:
            raise TypeError(
                f"{kind} '{name}' ({_describe(fn)}) requires {unknown}, which rlstack does not "
                f"pass; give them defaults or take them from **kwargs. It passes: "
                f"{', '.join(offered)}"
            )
        return cls(frozenset(named), var_keyword, frozenset(required))

    def select(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments the plug-in takes: all with ``**kwargs``, else those it names."""
        if self.var_keyword:
            return arguments
        return {key: value for key, value in arguments.items() if key in self.named}

    def takes(self, argument: str) -> bool:
        return self.var_keyword or argument in self.named

    def reads(self, hyperparameters: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
        return tuple(
            sorted(
                {
                    field
                    for argument, fields in hyperparameters.items()
                    if self.takes(argument)
                    for field in fields
                }
            )
        )


@attrs.frozen
class RLinfAdvantage:
    """`rlcore.advantages.AdvantageEstimator` over a function written RLinf's way.

    Equal when registered again for the same function (an extension loaded twice).
    """

    name: str
    fn: Callable[..., Any]
    signature: _Signature = attrs.field(eq=False)

    @classmethod
    def of(cls, name: str, fn: Callable[..., Any]) -> RLinfAdvantage:
        _check_name(name, "advantage")
        return cls(name, fn, _Signature.of(fn, "advantage", name, ADVANTAGE_ARGUMENTS))

    def reads(self) -> tuple[str, ...]:
        return self.signature.reads(_ADVANTAGE_HYPERPARAMETERS)

    def __call__(self, batch: AdvantageBatch, config: AdvantageConfig) -> Advantages:
        mask = batch.mask.T  # [T, B]
        if "values" in self.signature.required and batch.values is None:
            raise ValueError(
                f"advantage '{self.name}' ({_describe(self.fn)}) requires values, and this "
                "run trains no critic (only algorithm.adv_type='gae' runs do); give values a "
                "default of None to run without one"
            )
        with torch.no_grad():
            # Copies: RLinf's estimators may work in place (its reinpp subtracts from its input).
            rewards = batch.token_rewards.T
            arguments: dict[str, Any] = {
                "rewards": rewards.clone(),
                "loss_mask": mask.clone(),
                "dones": _dones(mask),
                "values": None if batch.values is None else _bootstrapped(batch.values.T),
                "reward_scores": masked_sum(batch.token_rewards, batch.mask, axis=-1),
                "group_size": batch.group_size,
                "gamma": config.gamma,
                "gae_lambda": config.lam,
                "normalize_advantages": config.whiten,
                "logprobs": None if batch.logprobs is None else batch.logprobs.T.clone(),
                "teacher_logprobs": (
                    None if batch.teacher_logprobs is None else batch.teacher_logprobs.T.clone()
                ),
                "adv_type": self.name,
            }
            what = f"advantage '{self.name}' ({_describe(self.fn)})"
            result = _called(self.fn, self.signature.select(arguments), what)
        advantages, returns = _pair(result, what, "(advantages, returns)", "returns may be None")
        advantages = _checked_tensor(advantages, "advantages", what, mask, rewards.dtype)
        if returns is None:
            return Advantages(advantages=advantages.T, returns=advantages.T)
        returns = _checked_tensor(returns, "returns", what, mask, rewards.dtype)
        return Advantages(advantages=advantages.T, returns=returns.T)


@attrs.frozen
class RLinfPolicyLoss:
    """`rlcore.losses.PolicyLoss` over a function written RLinf's way.

    Equal when registered again for the same function (an extension loaded twice).
    """

    name: str
    fn: Callable[..., Any]
    signature: _Signature = attrs.field(eq=False)

    @classmethod
    def of(cls, name: str, fn: Callable[..., Any]) -> RLinfPolicyLoss:
        _check_name(name, "policy loss")
        return cls(name, fn, _Signature.of(fn, "policy loss", name, LOSS_ARGUMENTS))

    def reads(self) -> tuple[str, ...]:
        return self.signature.reads(_LOSS_HYPERPARAMETERS)

    def needs(self) -> tuple[str, ...]:
        return ("proximal_logprobs",) if "proximal_logprobs" in self.signature.required else ()

    def __call__(self, batch: PolicyLossBatch, config: PolicyLossConfig) -> LossOutput:
        what = f"policy loss '{self.name}' ({_describe(self.fn)})"
        if batch.weights is not None and not self.signature.takes("weights"):
            raise ValueError(
                f"{what} takes no weights, and this run weighs each token "
                "(algorithm.rollout_is); take weights (or **kwargs) and apply them, or turn "
                "algorithm.rollout_is off"
            )
        clip_low, clip_high = config.clip_range(_PPO_CLIP)
        mask = batch.mask

        def loss_agg_func(
            values: Tensor, mask: Tensor, loss_mask_ratio: Tensor | None = None
        ) -> Tensor:
            if loss_mask_ratio is not None:
                raise ValueError(
                    f"{what}: loss_agg_func takes no loss_mask_ratio here (rlstack passes no "
                    "max_episode_steps); aggregate with algorithm.loss_agg_mode"
                )
            return aggregate(values, mask, config.agg, batch.normalizer)

        arguments: dict[str, Any] = {
            "logprobs": batch.logprobs,
            "old_logprobs": batch.old_logprobs,
            "advantages": batch.advantages,
            "loss_mask": mask,
            "clip_ratio_low": clip_low,
            "clip_ratio_high": clip_high,
            "clip_ratio_c": config.dual_clip,
            "behave_weight_threshold": config.behavior_weight_cap,
            "proximal_logprobs": batch.proximal_logprobs,
            "weights": batch.weights,
            "loss_agg_func": loss_agg_func,
            "loss_type": self.name,
        }
        result = _called(self.fn, self.signature.select(arguments), what)
        loss, metrics = _pair(result, what, "(loss, metrics)", "metrics a dict")
        if not isinstance(loss, Tensor):
            raise PluginOutputError(
                f"{what} returned a {type(loss).__name__} as its loss; expected a scalar "
                "float tensor"
            )
        if loss.numel() != 1 or loss.dim() > 1:
            raise PluginOutputError(
                f"{what} returned a loss of shape {tuple(loss.shape)}; expected a scalar "
                "(aggregate the per-token losses, e.g. with loss_agg_func)"
            )
        if not loss.is_floating_point():
            raise PluginOutputError(f"{what} returned a {loss.dtype} loss; expected a float one")
        loss = loss.reshape(())
        value = float(loss.detach())
        if value != value or value in (float("inf"), float("-inf")):
            raise PluginNonFiniteError(f"{what} returned a loss of {value}")
        if batch.logprobs.requires_grad and not loss.requires_grad:
            raise PluginOutputError(
                f"{what} returned a loss with no gradient: it does not depend on logprobs "
                "(was it detached, or computed under torch.no_grad?)"
            )
        return LossOutput(loss, _checked_metrics(metrics, what, loss))


def _called(fn: Callable[..., Any], arguments: dict[str, Any], what: str) -> object:
    """``fn(**arguments)``; an error it raises carries a note of what it was given (an RLinf
    plug-in reaching for an argument rlstack does not pass fails inside it)."""
    try:
        return fn(**arguments)
    except Exception as error:
        error.add_note(f"in {what}, called with: {', '.join(arguments)}")
        raise


def _check_name(name: str, kind: str) -> None:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{kind} names must be non-empty strings, got {name!r}")


def _dones(mask: Tensor) -> Tensor:
    """``[T + 1, B]``: row t + 1 is True where step t is its row's last valid step."""
    steps = mask.shape[0]
    index = torch.arange(steps, device=mask.device)[:, None]
    last = torch.where(mask, index, -1).amax(0)  # -1 for a row without valid steps
    dones = torch.zeros((steps + 1, mask.shape[1]), dtype=torch.bool, device=mask.device)
    rows = (last >= 0).nonzero().flatten()
    dones[last[rows] + 1, rows] = True
    return dones


def _bootstrapped(values: Tensor) -> Tensor:
    """``[T, B]`` values with a zero row appended: nothing follows the last step."""
    return torch.cat([values, values.new_zeros((1, values.shape[1]))])


def _pair(result: object, what: str, shape: str, note: str) -> tuple[Any, Any]:
    if not isinstance(result, tuple | list) or len(result) != 2:
        got = (
            f"a {len(result)}-tuple"
            if isinstance(result, tuple | list)
            else f"a {type(result).__name__}"
        )
        raise PluginOutputError(f"{what} returned {got}; RLinf's plug-ins return {shape} ({note})")
    first, second = result
    return first, second


def _checked_tensor(
    value: object, label: str, what: str, mask: Tensor, dtype: torch.dtype
) -> Tensor:
    """``value`` checked to be a float tensor shaped as ``mask`` ([T, B]), finite where it is
    set; zero where it is not, in ``dtype``, without gradient."""
    expected = tuple(mask.shape)
    if not isinstance(value, Tensor):
        raise PluginOutputError(
            f"{what} returned {label} as a {type(value).__name__}; expected a float tensor "
            f"of shape {expected} ([T, B], time first)"
        )
    if tuple(value.shape) != expected:
        hint = (
            " (batch first: RLinf's advantages are time first, [T, B]; transpose it)"
            if tuple(value.shape) == expected[::-1]
            else ""
        )
        raise PluginOutputError(
            f"{what} returned {label} of shape {tuple(value.shape)}; expected {expected} "
            f"([T, B], as rewards){hint}"
        )
    if not value.is_floating_point():
        raise PluginOutputError(f"{what} returned {label} as {value.dtype}; expected a float dtype")
    value = value.detach()
    bad = mask & ~torch.isfinite(value)
    if bool(bad.any()):
        step, row = (int(i) for i in bad.nonzero()[0])
        raise PluginNonFiniteError(
            f"{what} returned {label} with {int(bad.sum())} NaN or infinite value(s) where "
            f"loss_mask is set, the first {float(value[step, row])} at step {step} of row {row}"
        )
    return torch.where(mask, value, 0.0).to(dtype)


def _checked_metrics(metrics: object, what: str, like: Tensor) -> dict[str, Tensor]:
    """Scalar metrics as detached 0-d tensors, an ``actor/`` prefix dropped."""
    if not isinstance(metrics, Mapping):
        raise PluginOutputError(
            f"{what} returned its metrics as a {type(metrics).__name__}; expected a dict of scalars"
        )
    checked: dict[str, Tensor] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise PluginOutputError(f"{what} returned a metric named {key!r}; expected a str")
        short = key.removeprefix("actor/")
        if isinstance(value, Tensor):
            if value.numel() != 1:
                raise PluginOutputError(
                    f"{what} returned metric '{key}' of shape {tuple(value.shape)}; expected a "
                    "scalar"
                )
            checked[short] = value.detach().reshape(()).to(like.dtype)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            checked[short] = torch.tensor(float(value), dtype=like.dtype, device=like.device)
        else:
            raise PluginOutputError(
                f"{what} returned metric '{key}' as a {type(value).__name__}; expected a "
                "scalar tensor or a number"
            )
    return checked


def _describe(fn: object) -> str:
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"{module}.{name}" if module else str(name)
