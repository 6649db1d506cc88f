"""The built-in ``mlp_policy`` model type: an MLP actor (and critic) over state vectors.

Three action types, chosen by ``model_kwargs.action_type``:

- ``discrete``: a categorical over ``action_dim`` logits; actions are int64
  ``[batch]``; eval takes the argmax.
- ``gaussian`` (PPO on continuous control): a state-independent log-std
  parameter; the raw action u ~ N(μ(s), σ²) is cached for training and the env
  receives clip(u, low, high), as SB3 and CleanRL do; eval acts on clip(μ).
- ``tanh_gaussian`` (SAC): state-dependent μ(s) and log σ(s) ∈ [−5, 2];
  a = tanh(u), u ~ N(μ, σ²), and the env receives low + (a + 1)/2 · (high − low);
  eval acts on tanh(μ). Twin Q heads ``q1``, ``q2`` read (s, a) with a ∈ [−1, 1].

``discrete`` and ``gaussian`` carry a separate MLP critic V(s); ``tanh_gaussian``
has none (SAC learns Q through ``sac_q_forward``). Values are left out of the
results, never filled with zeros, when not asked for or when there is no critic.

With ``orthogonal_init`` (the default) weights are orthogonal with gain √2,
the policy head's 0.01 and the value and Q heads' 1.0, biases zero (CleanRL,
SB3). Layers are built in fp32, initialised, then cast to the model dtype; the
distribution maths (`rlcore.distributions`) always runs in fp32.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any, Literal, cast

import torch
from attrs import frozen
from jaxtyping import Float
from torch import Tensor, nn

from rlcore import normalize as running_stats
from rlcore.distributions import (
    categorical_entropy,
    categorical_log_prob,
    categorical_sample,
    gaussian_entropy,
    gaussian_log_prob,
    gaussian_sample,
    tanh_gaussian_log_prob,
)
from rlshell.config import ModelConfig
from rlshell.models.base import ActionInfo, BasePolicy, ForwardType
from rlshell.models.model_kwargs import KwargsReader, ModelOption

__all__ = [
    "ActionType",
    "MLPPolicy",
    "MLPPolicySpec",
    "build_mlp_policy",
    "normalized_states",
    "register_bounds_and_stats",
]

ActionType = Literal["discrete", "gaussian", "tanh_gaussian"]
Activation = Literal["tanh", "relu"]

LOG_STD_MIN = -5.0
LOG_STD_MAX = 2.0
OBS_CLIP = 10.0  # normalised states are clipped to ±10 (CleanRL's wrappers, SB3's VecNormalize)


# ---------------------------------------------------------------------------
# Configuration, read from model_kwargs.

_COMMON_KEYS = (
    "obs_dim",
    "action_dim",
    "action_type",
    "hidden_sizes",
    "activation",
    "orthogonal_init",
)
_KEYS_BY_TYPE: dict[ActionType, tuple[str, ...]] = {
    "discrete": (*_COMMON_KEYS, "normalize_obs"),
    "gaussian": (*_COMMON_KEYS, "action_low", "action_high", "init_log_std", "normalize_obs"),
    "tanh_gaussian": (*_COMMON_KEYS, "action_low", "action_high"),
}


@frozen
class MLPPolicySpec:
    """An `MLPPolicy`'s shape, read from ``model_kwargs`` by `MLPPolicySpec.from_kwargs`.

    ``action_low`` / ``action_high`` hold one bound per action dimension.
    """

    obs_dim: int
    action_dim: int
    action_type: ActionType
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: Activation = "tanh"
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    init_log_std: float = 0.0
    orthogonal_init: bool = True
    normalize_obs: bool = False

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, ModelOption]) -> MLPPolicySpec:
        """Parse ``model_kwargs``; a bad or missing entry raises ValueError naming its key."""
        read = KwargsReader(kwargs, "mlp_policy")
        action_type = read.variant("action_type", _KEYS_BY_TYPE)
        action_dim = read.positive_int("action_dim")
        low, high = read.action_bounds(action_dim) if action_type != "discrete" else ((), ())
        hidden = read.int_list("hidden_sizes", "64,64")
        return cls(
            obs_dim=read.positive_int("obs_dim"),
            action_dim=action_dim,
            action_type=action_type,
            hidden_sizes=hidden,
            activation=cast(Activation, read.choice("activation", ("tanh", "relu"), "tanh")),
            action_low=low,
            action_high=high,
            init_log_std=read.float_("init_log_std", 0.0),
            orthogonal_init=read.bool_("orthogonal_init", True),
            normalize_obs=read.bool_("normalize_obs", False),
        )


# ---------------------------------------------------------------------------
# The networks.

_ACTIVATIONS: dict[Activation, Callable[[], nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def _mlp(
    in_dim: int, hidden: tuple[int, ...], out_dim: int, spec: MLPPolicySpec, out_gain: float
) -> nn.Sequential:
    """in → hidden… → out, activations between; orthogonal init (gain √2, head ``out_gain``)."""
    sizes = (in_dim, *hidden)
    layers: list[nn.Module] = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        layers += [_linear(fan_in, fan_out, math.sqrt(2.0), spec), _ACTIVATIONS[spec.activation]()]
    layers.append(_linear(sizes[-1], out_dim, out_gain, spec))
    return nn.Sequential(*layers)


def _linear(fan_in: int, fan_out: int, gain: float, spec: MLPPolicySpec) -> nn.Linear:
    layer = nn.Linear(fan_in, fan_out)
    if spec.orthogonal_init:
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return layer


class MLPPolicy(BasePolicy):
    """An MLP actor over ``env_obs["states"]``, with a critic (discrete, gaussian) or twin Qs.

    ``forward_inputs`` hold ``states`` and ``action``, the raw sampled action:
    the index (discrete), the unclipped u (gaussian) or the pre-tanh u
    (tanh_gaussian), so that log-probs recompute exactly.

    With ``normalize_obs`` (PPO's discrete and gaussian heads) the networks
    see s̃ = clip((s − μ) / √(σ² + 10⁻⁸), ±10), with μ and σ² running
    statistics of every state seen in ``"train"`` mode
    (`rlcore.normalize`, kept in the model's buffers, so checkpoints and
    evaluation carry them); ``forward_inputs["states"]`` holds s̃ as the
    rollout computed it, so the update recomputes the same log-probs.
    """

    log_std: nn.Parameter | None
    action_low: Tensor
    action_high: Tensor
    obs_count: Tensor
    obs_mean: Tensor
    obs_m2: Tensor

    def __init__(self, spec: MLPPolicySpec, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.spec = spec
        heads = 2 * spec.action_dim if spec.action_type == "tanh_gaussian" else spec.action_dim
        self.actor = _mlp(spec.obs_dim, spec.hidden_sizes, heads, spec, out_gain=0.01)
        self.critic: nn.Sequential | None = None
        self.q1: nn.Sequential | None = None
        self.q2: nn.Sequential | None = None
        self.log_std = None
        if spec.action_type == "tanh_gaussian":
            q_in = spec.obs_dim + spec.action_dim
            self.q1 = _mlp(q_in, spec.hidden_sizes, 1, spec, out_gain=1.0)
            self.q2 = _mlp(q_in, spec.hidden_sizes, 1, spec, out_gain=1.0)
        else:
            self.critic = _mlp(spec.obs_dim, spec.hidden_sizes, 1, spec, out_gain=1.0)
        if spec.action_type == "gaussian":
            self.log_std = nn.Parameter(torch.full((spec.action_dim,), spec.init_log_std))
        self.to(dtype)
        register_bounds_and_stats(
            self, spec.action_low, spec.action_high, spec.obs_dim if spec.normalize_obs else None
        )

    def predict_action_batch(
        self,
        env_obs: dict[str, Any],
        mode: Literal["train", "eval"] = "train",
        compute_values: bool = True,
    ) -> tuple[Tensor, ActionInfo]:
        """Sample (``"train"``) or take the mode (``"eval"``) of π(·|s) for ``env_obs["states"]``.

        Returns env-ready actions (int64 ``[batch]`` or fp32 ``[batch, action_dim]``
        within [low, high]) and ``prev_logprobs`` ``[batch]``, ``prev_values``
        ``[batch]`` (only with ``compute_values`` and a critic) and
        ``forward_inputs`` ``{"states", "action"}``.
        """
        if mode not in ("train", "eval"):
            raise ValueError(f"predict_action_batch: mode must be 'train' or 'eval', got {mode!r}")
        states = self.require_input(env_obs, "states", source="env_obs")
        deterministic = mode == "eval"
        with torch.no_grad():
            states = self._normalized(states, observe=not deterministic)
            hidden = self.actor(self._cast(states)).float()
            kind = self.spec.action_type
            if kind == "discrete":
                action = hidden.argmax(-1) if deterministic else categorical_sample(hidden)
                logprobs = categorical_log_prob(hidden, action)
                env_action = action
            else:
                mean, log_std = self._gaussian_params(hidden)
                # In eval the mode μ, a tensor of its own (μ may be a view of the head).
                action = mean.clone() if deterministic else gaussian_sample(mean, log_std)
                if kind == "gaussian":
                    logprobs = gaussian_log_prob(action, mean, log_std)
                    env_action = torch.clamp(action, self.action_low, self.action_high)
                else:
                    logprobs = tanh_gaussian_log_prob(action, mean, log_std)
                    env_action = self._to_env_range(torch.tanh(action))
            info: ActionInfo = {
                "prev_logprobs": logprobs,
                "forward_inputs": {"states": states, "action": action},
            }
            if compute_values and self.critic is not None:
                info["prev_values"] = self._value(states)
        return env_action, info

    def default_forward(
        self,
        forward_inputs: dict[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = True,
        compute_values: bool = True,
    ) -> dict[str, Tensor]:
        """``logprobs``, ``entropy`` and ``values`` (each ``[batch]``) of the cached actions.

        Entropy: analytic for discrete and gaussian; for tanh_gaussian, which
        has no closed form, the one-sample estimate −log π(a) at the cached
        action. ``values`` only with a critic.
        """
        states = self.require_input(forward_inputs, "states")
        out: dict[str, Tensor] = {}
        if compute_logprobs or compute_entropy:
            action = self.require_input(forward_inputs, "action")
            hidden = self.actor(self._cast(states)).float()
            kind = self.spec.action_type
            if kind == "discrete":
                logprobs = categorical_log_prob(hidden, action)
                entropy = categorical_entropy(hidden) if compute_entropy else None
            else:
                mean, log_std = self._gaussian_params(hidden)
                u = action.float()
                if kind == "gaussian":
                    logprobs = gaussian_log_prob(u, mean, log_std)
                    # One σ for every row: its entropy, broadcast to the batch.
                    entropy = (
                        gaussian_entropy(log_std).expand(u.shape[0]) if compute_entropy else None
                    )
                else:
                    logprobs = tanh_gaussian_log_prob(u, mean, log_std)
                    entropy = -logprobs
            if compute_logprobs:
                out["logprobs"] = logprobs
            if entropy is not None and compute_entropy:
                out["entropy"] = entropy
        if compute_values and self.critic is not None:
            out["values"] = self._value(states)
        # FSDP2 warns about views among a forward's outputs (an in-place op on one would skip
        # its backward hook): hand out tensors of their own.
        return {key: value if value._base is None else value.clone() for key, value in out.items()}

    def sac_forward(
        self, states: Float[Tensor, "batch obs"]
    ) -> tuple[Float[Tensor, "batch dim"], Float[Tensor, " batch"]]:
        """Reparameterised a = tanh(μ + σ ε), ε ~ N(0, I), a ∈ [−1, 1], and log π(a) ``[batch]``.

        Gradients flow from both outputs into the actor (SAC's actor loss
        α log π(a|s) − min Q(s, a)).
        """
        self._require_sac(ForwardType.SAC)
        mean, log_std = self._gaussian_params(self.actor(self._cast(states)).float())
        u = gaussian_sample(mean, log_std)
        return torch.tanh(u), tanh_gaussian_log_prob(u, mean, log_std)

    def sac_q_forward(
        self, states: Float[Tensor, "batch obs"], actions: Float[Tensor, "batch dim"]
    ) -> tuple[Float[Tensor, " batch"], Float[Tensor, " batch"]]:
        """Twin Q(s, a) ``[batch]`` each, for a ∈ [−1, 1] (the squashed action, not the env's)."""
        self._require_sac(ForwardType.SAC_Q)
        assert self.q1 is not None
        assert self.q2 is not None
        x = self._cast(torch.cat([states, actions.to(states.dtype)], dim=-1))
        return self.q1(x).squeeze(-1).float(), self.q2(x).squeeze(-1).float()

    def _require_sac(self, forward_type: ForwardType) -> None:
        if self.spec.action_type != "tanh_gaussian":
            raise NotImplementedError(
                f"{type(self).__name__} does not support forward_type '{forward_type.value}' "
                f"with action_type '{self.spec.action_type}' (SAC needs 'tanh_gaussian')"
            )

    def _cast(self, x: Tensor) -> Tensor:
        return x.to(self.action_dtype)

    def _normalized(self, states: Tensor, observe: bool) -> Tensor:
        if not self.spec.normalize_obs:
            return states
        return normalized_states(self, states, observe)

    @property
    def action_dtype(self) -> torch.dtype:
        """The dtype of the networks' weights (``cfg.precision``): the first layer's."""
        # Indexing, not parameters(): a generator over the module tree costs ~8 µs, twice per
        # rollout step on a policy whose whole forward takes ~60.
        first = self.actor[0]
        assert isinstance(first, nn.Linear)
        return first.weight.dtype

    def _gaussian_params(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """(μ, log σ): gaussian's log σ is a parameter; tanh_gaussian's a clamped head."""
        if self.log_std is not None:
            return hidden, self.log_std.float()
        mean, log_std = hidden.chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def _to_env_range(self, squashed: Tensor) -> Tensor:
        """a ∈ [−1, 1] ↦ low + (a + 1)/2 · (high − low), kept inside [low, high] after rounding."""
        scaled = self.action_low + (squashed + 1.0) * 0.5 * (self.action_high - self.action_low)
        return torch.clamp(scaled, self.action_low, self.action_high)

    def _value(self, states: Tensor) -> Tensor:
        assert self.critic is not None
        return self.critic(self._cast(states)).squeeze(-1).float()  # type: ignore[no-any-return]


def register_bounds_and_stats(
    policy: nn.Module, low: tuple[float, ...], high: tuple[float, ...], obs_dim: int | None
) -> None:
    """``policy``'s buffers ``action_low`` and ``action_high`` (fp32 whatever the model
    dtype: a bf16 bound is off by ~0.4%) and, for ``obs_dim`` states normalised by running
    statistics, ``obs_count``, ``obs_mean`` and ``obs_m2`` (`normalized_states` reads them)."""
    policy.register_buffer("action_low", torch.tensor(low, dtype=torch.float32))
    policy.register_buffer("action_high", torch.tensor(high, dtype=torch.float32))
    if obs_dim is not None:
        stats = running_stats.init((obs_dim,))
        policy.register_buffer("obs_count", stats.count)
        policy.register_buffer("obs_mean", stats.mean)
        policy.register_buffer("obs_m2", stats.m2)


def normalized_states(policy: nn.Module, states: Tensor, observe: bool) -> Tensor:
    """s̃ = clip((s − μ) / √(σ² + 10⁻⁸), ±10) in fp32 under ``policy``'s running statistics
    (its ``obs_count``, ``obs_mean`` and ``obs_m2`` buffers, `rlcore.normalize`), folding
    ``states`` into them first if ``observe``."""
    buffers = dict(policy.named_buffers(recurse=False))
    stats = running_stats.RunningStats(buffers["obs_count"], buffers["obs_mean"], buffers["obs_m2"])
    if observe:
        stats = running_stats.update(stats, states.to(torch.float64))
        buffers["obs_count"].copy_(stats.count)
        buffers["obs_mean"].copy_(stats.mean)
        buffers["obs_m2"].copy_(stats.m2)
    scaled = running_stats.normalize(stats, states.to(torch.float64), clip=OBS_CLIP)
    return scaled.to(torch.float32)


def build_mlp_policy(cfg: ModelConfig, dtype: torch.dtype) -> MLPPolicy:
    """``mlp_policy``'s builder: `MLPPolicySpec.from_kwargs(cfg.model_kwargs)` in ``dtype``."""
    if cfg.path is not None:
        raise ValueError(
            f"actor.model.path: mlp_policy is built from model_kwargs, not loaded "
            f"(got path {cfg.path!r}); leave it unset"
        )
    return MLPPolicy(MLPPolicySpec.from_kwargs(cfg.model_kwargs), dtype)
