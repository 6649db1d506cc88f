"""The built-in ``cnn_policy`` model type: a convolutional actor-critic over camera images.

It reads ``env_obs["main_images"]`` (uint8 ``[batch, H, W, C]``, channels
last, as ManiSkill and `rlshell.envs.pixels` give them), optionally
``wrist_images`` (a second camera, its own encoder) and ``states`` (a
proprioceptive vector, concatenated after the image features):

    fᵥ = ReLU(W · flatten(CNNᵥ(imageᵥ / 255)))       one encoder per camera v
    h  = ReLU(W_h · [f_main, f_wrist, states])
    π(·|s) = Categorical(W_π h)  or  N(W_π h, σ²),    V(s) = W_V h

Each encoder is the Nature-CNN trunk (Mnih et al. 2015): 8×8 stride 4,
4×4 stride 2 and 3×3 stride 1 convolutions, ReLUs between; on 64×64 images
its feature map is 4×4 (images of at least 36 pixels a side fit). Actor and
critic share the trunk, as CleanRL's Atari PPO does. Two action types, as
``mlp_policy``'s: ``discrete`` (int64 actions, argmax in eval) and
``gaussian`` (a state-independent log-std; the env receives the raw sample u
clipped to [low, high], the update recomputes log π(u); eval acts on the
clipped mean). Weights are orthogonal (gain √2, the policy head 0.01, the
value head 1), biases zero; the distribution maths (`rlcore.distributions`)
runs in fp32.
"""

from __future__ import annotations

import math
from typing import Any, Literal, cast

import torch
from attrs import frozen
from jaxtyping import Float
from torch import Tensor, nn

from rlcore.distributions import (
    categorical_entropy,
    categorical_log_prob,
    categorical_sample,
    gaussian_entropy,
    gaussian_log_prob,
    gaussian_sample,
)
from rlshell.config import ModelConfig
from rlshell.models.base import ActionInfo, BasePolicy
from rlshell.models.model_kwargs import PREFIX, KwargsReader, ModelOption

__all__ = ["CNNPolicy", "CNNPolicySpec", "ImageEncoder", "build_cnn_policy"]

CNNActionType = Literal["discrete", "gaussian"]

# (kernel, stride) of the Nature-CNN's three convolutions.
_CONV_LAYERS = ((8, 4), (4, 2), (3, 1))
_KEYS = (
    "action_dim",
    "action_type",
    "image_size",
    "image_channels",
    "state_dim",
    "wrist_images",
    "conv_channels",
    "feature_dim",
    "hidden_size",
    "action_low",
    "action_high",
    "init_log_std",
)
_CONTINUOUS_KEYS = ("action_low", "action_high", "init_log_std")


def conv_output_size(image_size: int) -> int:
    """The side of the trunk's last feature map for ``image_size``² inputs (≤ 0: too small)."""
    side = image_size
    for kernel, stride in _CONV_LAYERS:
        side = (side - kernel) // stride + 1
    return side


@frozen
class CNNPolicySpec:
    """A `CNNPolicy`'s shape, read from ``model_kwargs`` by `CNNPolicySpec.from_kwargs`."""

    action_dim: int
    action_type: CNNActionType
    image_size: int = 64
    image_channels: int = 3
    state_dim: int = 0
    wrist_images: bool = False
    conv_channels: tuple[int, int, int] = (32, 64, 64)
    feature_dim: int = 256
    hidden_size: int = 256
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    init_log_std: float = 0.0

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, ModelOption]) -> CNNPolicySpec:
        """Parse ``model_kwargs``; a bad, missing or unknown entry raises ValueError naming it."""
        read = KwargsReader(kwargs, "cnn_policy")
        read.reject_unknown(_KEYS)
        action_type = cast(CNNActionType, read.choice("action_type", ("discrete", "gaussian")))
        if action_type == "discrete":
            extra = sorted(set(kwargs) & set(_CONTINUOUS_KEYS))
            if extra:
                raise ValueError(
                    f"{PREFIX}.{extra[0]}: not read with action_type 'discrete' "
                    "(only with 'gaussian')"
                )
        action_dim = read.positive_int("action_dim")
        image_size = read.positive_int("image_size", 64)
        if conv_output_size(image_size) < 1:
            raise ValueError(
                f"{PREFIX}.image_size: {image_size} is too small for cnn_policy's trunk "
                "(8×8/4, 4×4/2, 3×3/1 convolutions); use images of at least 36 pixels a side"
            )
        channels = read.int_list("conv_channels", "32,64,64")
        if len(channels) != len(_CONV_LAYERS):
            raise ValueError(
                f"{PREFIX}.conv_channels: expected {len(_CONV_LAYERS)} comma-separated ints "
                f"(one per convolution), got {kwargs.get('conv_channels')!r}"
            )
        continuous = action_type == "gaussian"
        low, high = read.action_bounds(action_dim) if continuous else ((), ())
        return cls(
            action_dim=action_dim,
            action_type=action_type,
            image_size=image_size,
            image_channels=read.positive_int("image_channels", 3),
            state_dim=read.non_negative_int("state_dim", 0),
            wrist_images=read.bool_("wrist_images", False),
            conv_channels=(channels[0], channels[1], channels[2]),
            feature_dim=read.positive_int("feature_dim", 256),
            hidden_size=read.positive_int("hidden_size", 256),
            action_low=low,
            action_high=high,
            init_log_std=read.float_("init_log_std", 0.0) if continuous else 0.0,
        )

    @property
    def image_keys(self) -> tuple[str, ...]:
        """The ``env_obs`` image entries the policy reads, in feature order."""
        return ("main_images", "wrist_images") if self.wrist_images else ("main_images",)


def _orthogonal(layer: nn.Conv2d | nn.Linear, gain: float) -> nn.Conv2d | nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    assert layer.bias is not None
    nn.init.zeros_(layer.bias)
    return layer


class ImageEncoder(nn.Module):
    """One camera's Nature-CNN trunk: uint8 ``[B, H, W, C]`` → ``[B, feature_dim]``.

    ``_fsdp_wrap_name`` ``"image_encoder"``: ``no_split_names`` can make each
    encoder an FSDP unit.
    """

    _fsdp_wrap_name = "image_encoder"

    def __init__(self, spec: CNNPolicySpec) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        fan_in = spec.image_channels
        for (kernel, stride), fan_out in zip(_CONV_LAYERS, spec.conv_channels, strict=True):
            conv = nn.Conv2d(fan_in, fan_out, kernel, stride)
            layers += [_orthogonal(conv, math.sqrt(2.0)), nn.ReLU()]
            fan_in = fan_out
        side = conv_output_size(spec.image_size)
        layers += [
            nn.Flatten(),
            _orthogonal(nn.Linear(fan_in * side * side, spec.feature_dim), math.sqrt(2.0)),
            nn.ReLU(),
        ]
        self.net = nn.Sequential(*layers)

    def forward(self, images: Tensor) -> Tensor:
        dtype = next(self.parameters()).dtype
        pixels = images.permute(0, 3, 1, 2).to(dtype) / 255.0
        return self.net(pixels)  # type: ignore[no-any-return]


class CNNPolicy(BasePolicy):
    """A CNN actor-critic over ``main_images`` (and ``wrist_images``, ``states`` when configured).

    ``forward_inputs`` hold the uint8 images (and ``states``) as the env gave
    them and ``action``, the raw sampled action (the index, or the unclipped
    u), so log-probs recompute exactly.
    """

    log_std: nn.Parameter | None
    action_low: Tensor
    action_high: Tensor

    def __init__(self, spec: CNNPolicySpec, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.spec = spec
        self.encoders = nn.ModuleDict({key: ImageEncoder(spec) for key in spec.image_keys})
        fused_in = spec.feature_dim * len(spec.image_keys) + spec.state_dim
        self.fusion = nn.Sequential(
            _orthogonal(nn.Linear(fused_in, spec.hidden_size), math.sqrt(2.0)), nn.ReLU()
        )
        self.actor_head = _orthogonal(nn.Linear(spec.hidden_size, spec.action_dim), 0.01)
        self.critic_head = _orthogonal(nn.Linear(spec.hidden_size, 1), 1.0)
        self.log_std = None
        if spec.action_type == "gaussian":
            self.log_std = nn.Parameter(torch.full((spec.action_dim,), spec.init_log_std))
        self.to(dtype)
        # The env's bounds stay fp32 whatever the model dtype.
        self.register_buffer("action_low", torch.tensor(spec.action_low, dtype=torch.float32))
        self.register_buffer("action_high", torch.tensor(spec.action_high, dtype=torch.float32))

    def predict_action_batch(
        self,
        env_obs: dict[str, Any],
        mode: Literal["train", "eval"] = "train",
        compute_values: bool = True,
    ) -> tuple[Tensor, ActionInfo]:
        """Sample (``"train"``) or take the mode (``"eval"``) of π(·|images, states).

        Returns env-ready actions (int64 ``[batch]``, or fp32 ``[batch,
        action_dim]`` within [low, high]), ``prev_logprobs`` ``[batch]``,
        ``prev_values`` ``[batch]`` (with ``compute_values``) and
        ``forward_inputs``: the observation entries read and ``action``.
        """
        if mode not in ("train", "eval"):
            raise ValueError(f"predict_action_batch: mode must be 'train' or 'eval', got {mode!r}")
        inputs = self._observation(env_obs, "env_obs")
        with torch.no_grad():
            hidden = self._hidden(inputs)
            head = self.actor_head(hidden).float()
            if self.log_std is None:
                action = head.argmax(-1) if mode == "eval" else categorical_sample(head)
                logprobs = categorical_log_prob(head, action)
                env_action = action
            else:
                log_std = self.log_std.float()
                action = head.clone() if mode == "eval" else gaussian_sample(head, log_std)
                logprobs = gaussian_log_prob(action, head, log_std)
                env_action = torch.clamp(action, self.action_low, self.action_high)
            info: ActionInfo = {
                "prev_logprobs": logprobs,
                "forward_inputs": {**inputs, "action": action},
            }
            if compute_values:
                info["prev_values"] = self.critic_head(hidden).squeeze(-1).float()
        return env_action, info

    def default_forward(
        self,
        forward_inputs: dict[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = True,
        compute_values: bool = True,
    ) -> dict[str, Tensor]:
        """``logprobs``, ``entropy`` (analytic) and ``values`` (``[batch]`` each) of the actions."""
        hidden = self._hidden(self._observation(forward_inputs, "forward_inputs"))
        out: dict[str, Tensor] = {}
        if compute_logprobs or compute_entropy:
            action = self.require_input(forward_inputs, "action")
            head = self.actor_head(hidden).float()
            if self.log_std is None:
                logprobs = categorical_log_prob(head, action)
                entropy = categorical_entropy(head)
            else:
                log_std = self.log_std.float()
                logprobs = gaussian_log_prob(action.float(), head, log_std)
                entropy = gaussian_entropy(log_std).expand(head.shape[0])  # one σ, every row
            if compute_logprobs:
                out["logprobs"] = logprobs
            if compute_entropy:
                out["entropy"] = entropy
        if compute_values:
            out["values"] = self.critic_head(hidden).squeeze(-1).float()
        # FSDP2 warns about views among a forward's outputs: hand out tensors of their own.
        return {key: value if value._base is None else value.clone() for key, value in out.items()}

    def _observation(self, source: dict[str, Any], name: str) -> dict[str, Tensor]:
        """The entries read, checked: uint8 images ``[B, S, S, C]``, ``states`` ``[B, D]``."""
        spec = self.spec
        inputs: dict[str, Tensor] = {}
        expected = (spec.image_size, spec.image_size, spec.image_channels)
        for key in spec.image_keys:
            images = self.require_input(source, key, source=name)
            if images.dtype != torch.uint8 or tuple(images.shape[1:]) != expected:
                raise ValueError(
                    f"{type(self).__name__}: {name}['{key}'] must be uint8 [batch, "
                    f"{', '.join(map(str, expected))}] (image_size, image_channels), got "
                    f"{images.dtype} {tuple(images.shape)}"
                )
            inputs[key] = images
        if spec.state_dim:
            states = self.require_input(source, "states", source=name)
            if states.dim() != 2 or states.shape[1] != spec.state_dim:
                raise ValueError(
                    f"{type(self).__name__}: {name}['states'] must be [batch, {spec.state_dim}] "
                    f"(state_dim), got {tuple(states.shape)}"
                )
            inputs["states"] = states
        return inputs

    def _hidden(self, inputs: dict[str, Tensor]) -> Float[Tensor, "batch hidden"]:
        features = [self.encoders[key](inputs[key]) for key in self.spec.image_keys]
        if self.spec.state_dim:
            features.append(inputs["states"].to(features[0].dtype))
        return self.fusion(torch.cat(features, dim=-1))  # type: ignore[no-any-return]


def build_cnn_policy(cfg: ModelConfig, dtype: torch.dtype) -> CNNPolicy:
    """``cnn_policy``'s builder: `CNNPolicySpec.from_kwargs(cfg.model_kwargs)` in ``dtype``."""
    if cfg.path is not None:
        raise ValueError(
            f"actor.model.path: cnn_policy is built from model_kwargs, not loaded "
            f"(got path {cfg.path!r}); leave it unset"
        )
    return CNNPolicy(CNNPolicySpec.from_kwargs(cfg.model_kwargs), dtype)
