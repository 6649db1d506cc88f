"""The built-in ``flow_policy`` model type: a flow-matching action policy under OpenPI's contract.

π0's action expert (Black et al. 2024, arXiv:2410.24164) made small enough for a CPU: an
observation encoder gives a context c, and a velocity network v_θ(x, t | c) carries a
noise chunk ε ~ N(0, I) of shape ``[action_chunk, action_dim]`` to an action chunk in
``num_steps`` = K steps of δ = 1/K, from t = 1 (noise) to t = 0 (the action), on the
straight path x_t = t·ε + (1 − t)·a (`rlcore.distributions`' flow section has the maths).

The encoder is chosen by ``encoder``:

- ``state`` (the default): an MLP over ``states`` (``obs_dim`` wide, ``hidden_sizes``).
- ``vision_language``: π0's VLM prefix, small and of the project's own
  (`rlshell.models.vision_language.VisionLanguageEncoder`): ``main_images`` (and
  ``wrist_images`` with ``wrist_images``) as patch tokens from the vision tower and
  projector ``tiny_vla`` shares (`rlshell.models.vision`), ``task_descriptions`` as one
  token per character (the character tokenizer's ids over ``alphabet``) and, when
  ``obs_dim`` > 0, ``states`` as one more token, read by ``context_layers`` pre-norm
  transformer blocks of width ``context_width``; c is their output at a learned summary
  token, pooled that way into one vector, so the velocity network, value head and σ head
  are unchanged (the action expert does not cross-attend to the prefix). Keys:
  ``image_size``, ``image_channels``, ``patch_size``, ``vision_width``, ``vision_layers``,
  ``wrist_images``, ``text_length``, ``alphabet``, ``context_width``, ``context_layers``,
  ``context_heads``. FSDP units: `VisionTower`, `VisionProjector`, `ContextBlock`.

``detach_value_input`` (default false): the value head reads c detached, so the value
loss trains the head alone and never moves the encoder (a cloned encoder is then shaped
by the policy's loss only).

To give PPO a likelihood, some steps of the chain are Gaussian transitions (πRL, Chen et
al. 2025, arXiv:2510.25889), chosen by ``noise_method``:

- ``flow_sde`` (the default): Flow-SDE. The step from t to t − δ is one Euler–Maruyama
  step of the SDE with the ODE's marginals (`rlcore.distributions.flow_sde_step`, noise
  ``noise_level``); by default one step per sample, drawn uniformly, is stochastic and the
  others follow the ODE (πRL's hybrid ODE–SDE sampling); ``joint_logprob`` makes every step
  stochastic.
- ``flow_noise``: Flow-Noise. Every step is the ODE's Euler step plus Gaussian noise whose
  σ a head predicts from the velocity network's last hidden layer, bounded to
  ``noise_std_range`` (``"low,high"``, RLinf's default 0.08–0.16).

``prev_logprobs`` (and ``default_forward``'s ``logprobs``) is the log-likelihood of the
recorded chain: the sum over its stochastic steps of `flow_step_log_prob`, one number per
sample, as PPO's ratio needs (RLinf averages over steps instead; a sum is the chain's
likelihood, whose ratio is the chain's likelihood ratio). ``entropy`` is the mean over
the stochastic steps of each Gaussian transition's entropy, summed over the chunk (for
Flow-SDE a constant: its σ has no parameters). ``"eval"`` is deterministic: the ODE from
ε = 0, the noise's mode, so an evaluation plays the same actions every time.

``forward_inputs`` is OpenPI's (RLinf's `OpenPi0ForRLActionPrediction`): ``chains``
``[batch, K + 1, chunk, dim]`` (x at t = 1, 1 − δ, ..., 0), ``denoise_inds`` ``[batch, S]``
(the stochastic steps' indices k, step k going from chains[:, k] to chains[:, k + 1]; S = 1
for Flow-SDE's hybrid sampling, K with ``joint_logprob`` or Flow-Noise: RLinf stores a
``[batch, K]`` row repeating its one index instead), ``model_action`` (x at t = 0),
``action`` (what the env received: the model action clipped to ``action_low`` /
``action_high`` where given) and the observation the encoder read (``states``, normalised
with ``normalize_obs`` as `rlshell.models.mlp_policy` does; the uint8 images and the task's
int32 code points, at most ``text_length`` wide). ``default_forward`` recomputes the
log-probabilities from them, bitwise equal to the rollout's in fp32 on the same batch
(the rollout in ``eval()``, the update in ``train()``: nothing here depends on the mode).

``sft_forward(actions=..., **observation)`` (the observation by keyword, as ``env_obs``
holds it) is the flow-matching behaviour-cloning loss
(`rlcore.distributions.flow_matching_loss`) at t ~ 0.001 + 0.999·Beta(1.5, 1) (π0's
emphasis on the noisy end) and a fresh ε.

The env receives ``[batch, action_dim]`` when ``action_chunk`` is 1; a longer chunk gives
``[batch, action_chunk, action_dim]``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any, Literal, cast

import torch
from attrs import frozen
from torch import Tensor, nn

from rlcore.distributions import (
    flow_euler_step,
    flow_interpolate,
    flow_matching_loss,
    flow_sde_step,
    flow_step_log_prob,
    gaussian_entropy,
)
from rlshell.config import ModelConfig
from rlshell.models.base import ActionInfo, BasePolicy
from rlshell.models.mlp_policy import normalized_states, register_bounds_and_stats
from rlshell.models.model_kwargs import PREFIX, KwargsReader, ModelOption
from rlshell.models.vision_language import (
    VISION_LANGUAGE_KEYS,
    VisionLanguageEncoder,
    VisionLanguageSpec,
    checked_images,
    task_codes,
)

__all__ = ["EncoderKind", "FlowPolicy", "FlowPolicySpec", "NoiseMethod", "build_flow_policy"]

NoiseMethod = Literal["flow_sde", "flow_noise"]
EncoderKind = Literal["state", "vision_language"]

_COMMON_KEYS = (
    "obs_dim",
    "action_dim",
    "action_chunk",
    "num_steps",
    "noise_method",
    "encoder",
    "hidden_sizes",
    "time_embed_dim",
    "action_low",
    "action_high",
    "normalize_obs",
    "detach_value_input",
)
# Two independent choices, each with keys of its own.
_KEYS_BY_METHOD: dict[NoiseMethod, tuple[str, ...]] = {
    "flow_sde": ("noise_level", "joint_logprob"),
    "flow_noise": ("noise_std_range",),
}
_KEYS_BY_ENCODER: dict[EncoderKind, tuple[str, ...]] = {
    "state": (),
    "vision_language": VISION_LANGUAGE_KEYS,
}
# Sine–cosine features of t with periods from 4e-3 to 4 (π0's time embedding's range).
_MIN_PERIOD, _MAX_PERIOD = 4e-3, 4.0


@frozen
class FlowPolicySpec:
    """A `FlowPolicy`'s shape, read from ``model_kwargs`` by `FlowPolicySpec.from_kwargs`."""

    obs_dim: int
    action_dim: int
    action_chunk: int = 1
    num_steps: int = 5
    noise_method: NoiseMethod = "flow_sde"
    noise_level: float = 0.5
    joint_logprob: bool = False
    noise_std_range: tuple[float, float] = (0.08, 0.16)
    hidden_sizes: tuple[int, ...] = (256, 256)
    time_embed_dim: int = 32
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    normalize_obs: bool = False
    encoder: EncoderKind = "state"
    vision_language: VisionLanguageSpec | None = None
    detach_value_input: bool = False

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, ModelOption]) -> FlowPolicySpec:
        """Parse ``model_kwargs``; a bad, missing or unknown entry raises ValueError naming it."""
        read = KwargsReader(kwargs, "flow_policy")
        every_method_key = tuple(itertools.chain(*_KEYS_BY_METHOD.values()))
        encoder = read.variant(
            "encoder",
            {
                kind: (*_COMMON_KEYS, *every_method_key, *keys)
                for kind, keys in _KEYS_BY_ENCODER.items()
            },
            "state",
        )
        method = read.variant(
            "noise_method",
            {
                m: (*_COMMON_KEYS, *keys, *_KEYS_BY_ENCODER[encoder])
                for m, keys in _KEYS_BY_METHOD.items()
            },
            "flow_sde",
        )
        # The state encoder reads only states; the vision-language one reads them when
        # obs_dim says they exist.
        if encoder == "state":
            obs_dim, vision_language = read.positive_int("obs_dim"), None
        else:
            obs_dim = read.non_negative_int("obs_dim", 0)
            vision_language = VisionLanguageSpec.from_reader(read, obs_dim)
        normalize = read.bool_("normalize_obs", False)
        if normalize and not obs_dim:
            raise ValueError(
                f"{PREFIX}.normalize_obs: normalises states, but obs_dim is 0 (no states read); "
                "set obs_dim or drop normalize_obs"
            )
        action_dim = read.positive_int("action_dim")
        bounded = "action_low" in kwargs or "action_high" in kwargs
        low, high = read.action_bounds(action_dim) if bounded else ((), ())
        std_range = (0.08, 0.16)
        if method == "flow_noise":
            text = read.string("noise_std_range", "0.08,0.16")
            std_range = _std_range(str(text))
        embed = read.positive_int("time_embed_dim", 32)
        if embed % 2:
            raise ValueError(
                f"actor.model.model_kwargs.time_embed_dim: sine and cosine features come in "
                f"pairs, so it must be even; got {embed}"
            )
        return cls(
            obs_dim=obs_dim,
            action_dim=action_dim,
            action_chunk=read.positive_int("action_chunk", 1),
            num_steps=read.positive_int("num_steps", 5),
            noise_method=method,
            noise_level=read.positive_float("noise_level", 0.5),
            joint_logprob=read.bool_("joint_logprob", False),
            noise_std_range=std_range,
            hidden_sizes=read.int_list("hidden_sizes", "256,256"),
            time_embed_dim=embed,
            action_low=low,
            action_high=high,
            normalize_obs=normalize,
            encoder=encoder,
            vision_language=vision_language,
            detach_value_input=read.bool_("detach_value_input", False),
        )

    @property
    def stochastic_steps(self) -> int:
        """S: the Gaussian steps of a training chain (one, or every one)."""
        if self.noise_method == "flow_noise" or self.joint_logprob:
            return self.num_steps
        return 1


def _std_range(text: str) -> tuple[float, float]:
    key = "actor.model.model_kwargs.noise_std_range"
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{key}: expected 'low,high' (two numbers), got {text!r}") from None
    if not 0.0 < low <= high:
        raise ValueError(f"{key}: expected 0 < low <= high, got {text!r}")
    return low, high


def _mlp(sizes: tuple[int, ...]) -> nn.Sequential:
    """Linear layers through ``sizes`` with SiLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for index, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        if index:
            layers.append(nn.SiLU())
        layers.append(nn.Linear(fan_in, fan_out))
    return nn.Sequential(*layers)


class FlowPolicy(BasePolicy):
    """Encoder, velocity network (and, for Flow-Noise, a σ head) and a value head.

    c = encoder(o);  h = body([x_t ; time features of t ; c]);  v = velocity_out(h);
    σ = low + (high − low)·sigmoid(noise_head(h)) (Flow-Noise);  V(o) = value_head(c),

    the encoder an MLP over ``states`` or a `VisionLanguageEncoder` over the images, the
    task description and (with ``obs_dim``) ``states``.
    """

    obs_count: Tensor
    obs_mean: Tensor
    obs_m2: Tensor
    action_low: Tensor
    action_high: Tensor
    frequencies: Tensor
    times: Tensor

    def __init__(self, spec: FlowPolicySpec, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.spec = spec
        self.action_chunk = spec.action_chunk
        width = spec.hidden_sizes[-1]
        flat = spec.action_chunk * spec.action_dim
        self.encoder: nn.Module
        if spec.vision_language is None:
            self.encoder = nn.Sequential(_mlp((spec.obs_dim, *spec.hidden_sizes)), nn.SiLU())
            context_dim = width
        else:
            self.encoder = VisionLanguageEncoder(spec.vision_language)
            context_dim = spec.vision_language.width
            # FSDP units under the default wrap policy (and by _fsdp_wrap_name).
            self._no_split_modules = ["VisionTower", "VisionProjector", "ContextBlock"]
        self.body = nn.Sequential(
            _mlp((flat + spec.time_embed_dim + context_dim, *spec.hidden_sizes)), nn.SiLU()
        )
        self.velocity_out = nn.Linear(width, flat)
        self.noise_head = nn.Linear(width, flat) if spec.noise_method == "flow_noise" else None
        self.value_head = _mlp((context_dim, width, 1))
        self.to(dtype)
        half = spec.time_embed_dim // 2
        periods = torch.logspace(
            math.log10(_MIN_PERIOD), math.log10(_MAX_PERIOD), half, dtype=torch.float64
        )
        self.register_buffer("frequencies", (2 * math.pi / periods).float(), persistent=False)
        # t_k = 1 − k/K, k = 0..K, once: rollout and training must use the same fp32 times.
        grid = [1.0 - k / spec.num_steps for k in range(spec.num_steps + 1)]
        self.register_buffer("times", torch.tensor(grid, dtype=torch.float32), persistent=False)
        register_bounds_and_stats(
            self, spec.action_low, spec.action_high, spec.obs_dim if spec.normalize_obs else None
        )

    # -------------------------------------------------------------------- rollout

    def predict_action_batch(
        self,
        env_obs: dict[str, Any],
        mode: Literal["train", "eval"] = "train",
        compute_values: bool = True,
    ) -> tuple[Tensor, ActionInfo]:
        """Denoise a chunk for each row of the observation, recording the chain.

        Reads ``env_obs["states"]``, or with the vision-language encoder ``main_images``
        (and ``wrist_images``), ``task_descriptions`` and, with ``obs_dim``, ``states``.
        """
        if mode not in ("train", "eval"):
            raise ValueError(f"predict_action_batch: mode must be 'train' or 'eval', got {mode!r}")
        spec = self.spec
        observation = self._observation(env_obs, "env_obs")
        train = mode == "train"
        with torch.no_grad():
            self._normalize_states(observation, observe=train)
            context = self._context(observation)
            batch, device = context.shape[0], context.device
            shape = (batch, spec.action_chunk, spec.action_dim)
            x = torch.randn(shape, device=device) if train else torch.zeros(shape, device=device)
            denoise_inds = self._draw_denoise_inds(batch) if train else torch.empty(batch, 0)
            denoise_inds = denoise_inds.long().to(device)
            stochastic = torch.zeros(batch, spec.num_steps, dtype=torch.bool, device=device)
            stochastic.scatter_(1, denoise_inds, True)
            chains, logprobs = [x], torch.zeros(batch, device=device)
            for k in range(spec.num_steps):
                t = self.times[k].expand(batch)
                velocity, hidden = self._velocity(x, t, context)
                delta = torch.full((batch,), 1.0 / spec.num_steps, device=device)
                euler = flow_euler_step(x, velocity, delta)
                if bool(stochastic[:, k].any()):
                    mean, log_std = self._transition(x, velocity, hidden, t, delta, euler)
                    sampled = mean + log_std.exp() * torch.randn(shape, device=device)
                    step_log_prob = flow_step_log_prob(sampled, mean, log_std)
                    rows = stochastic[:, k]
                    x = torch.where(rows[:, None, None], sampled, euler)
                    logprobs = logprobs + torch.where(rows, step_log_prob, 0.0)
                else:
                    x = euler
                chains.append(x)
            model_action = x
            action = self._clipped(model_action)
            info: ActionInfo = {
                "prev_logprobs": logprobs,
                "forward_inputs": {
                    **observation,
                    "chains": torch.stack(chains, dim=1),
                    "denoise_inds": denoise_inds,
                    "model_action": model_action,
                    "action": action,
                },
            }
            if compute_values:
                info["prev_values"] = self._value(context)
        env_action = action[:, 0] if spec.action_chunk == 1 else action
        return env_action, info

    def _draw_denoise_inds(self, batch: int) -> Tensor:
        """``[batch, S]``: every step, or one drawn uniformly per row (sorted either way)."""
        spec = self.spec
        if spec.stochastic_steps == spec.num_steps:
            return torch.arange(spec.num_steps).expand(batch, -1).clone()
        return torch.randint(0, spec.num_steps, (batch, 1))

    # ------------------------------------------------------------------- training

    def default_forward(
        self,
        forward_inputs: dict[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = True,
        compute_values: bool = True,
    ) -> dict[str, Tensor]:
        """``logprobs``, ``entropy`` and ``values`` (each ``[batch]``) of the recorded chains."""
        context = self._context(self._observation(forward_inputs, "forward_inputs"))
        out: dict[str, Tensor] = {}
        if compute_logprobs or compute_entropy:
            chains = self.require_input(forward_inputs, "chains")
            denoise_inds = self.require_input(forward_inputs, "denoise_inds").long()
            self._check_chains(chains, denoise_inds)
            batch, device = chains.shape[0], chains.device
            rows = torch.arange(batch, device=device)
            logprobs = torch.zeros(batch, device=device)
            entropy = torch.zeros(batch, device=device)
            for s in range(denoise_inds.shape[1]):
                k = denoise_inds[:, s]
                x, x_next = chains[rows, k], chains[rows, k + 1]
                t = self.times[k]
                velocity, hidden = self._velocity(x, t, context)
                delta = torch.full((batch,), 1.0 / self.spec.num_steps, device=device)
                euler = flow_euler_step(x, velocity, delta)
                mean, log_std = self._transition(x, velocity, hidden, t, delta, euler)
                logprobs = logprobs + flow_step_log_prob(x_next, mean, log_std)
                entropy = entropy + gaussian_entropy(log_std.expand(mean.shape).flatten(-2))
            if compute_logprobs:
                out["logprobs"] = logprobs
            if compute_entropy:
                out["entropy"] = entropy / max(1, denoise_inds.shape[1])
        if compute_values:
            out["values"] = self._value(context)
        return out

    def sft_forward(self, actions: Tensor, **observation: Any) -> dict[str, Tensor]:
        """``{"loss"}``: the flow-matching loss of demonstrated ``actions`` (``[batch, dim]``
        for a chunk of 1, else ``[batch, chunk, dim]``) at the observation, given by keyword
        as ``env_obs`` holds it (``states=...``; ``main_images=..., task_descriptions=...``
        for the vision-language encoder; raw states, normalised here). In ``train()`` the
        states are folded into the running statistics first (``normalize_obs``), as a
        rollout's are: a policy cloned from demonstrations then normalises the states RL
        shows it as it learned to."""
        spec = self.spec
        chunk = actions.reshape(actions.shape[0], spec.action_chunk, spec.action_dim).float()
        inputs = self._observation(observation, "observation")
        self._normalize_states(inputs, observe=self.training)
        context = self._context(inputs)
        beta = torch.distributions.Beta(torch.tensor(1.5), torch.tensor(1.0))
        t = (0.001 + 0.999 * beta.sample((chunk.shape[0],))).to(chunk.device)
        noise = torch.randn_like(chunk)
        velocity, _ = self._velocity(flow_interpolate(chunk, noise, t), t, context)
        return {"loss": flow_matching_loss(velocity, noise, chunk)}

    # -------------------------------------------------------------------- helpers

    def _observation(self, source: Mapping[str, Any], where: str) -> dict[str, Tensor]:
        """The observation entries the encoder reads, checked (task descriptions as code
        points, `rlshell.models.vision_language.task_codes`)."""
        spec, vision_language = self.spec, self.spec.vision_language
        observation: dict[str, Tensor] = {}
        if vision_language is not None:
            for key in vision_language.image_keys:
                images = self.require_input(source, key, source=where)
                observation[key] = checked_images(images, vision_language, f"{where}['{key}']")
            texts = self.require_input(source, "task_descriptions", source=where)
            device = observation["main_images"].device
            where_texts = f"{where}['task_descriptions']"
            observation["task_descriptions"] = task_codes(
                texts, vision_language, where_texts, device
            )
        if spec.obs_dim:
            states = self.require_input(source, "states", source=where)
            if states.dim() != 2 or states.shape[1] != spec.obs_dim:
                raise ValueError(
                    f"flow_policy: {where}['states'] must be [batch, {spec.obs_dim}] (obs_dim), "
                    f"got {tuple(states.shape)}"
                )
            observation["states"] = states
        rows = {key: value.shape[0] for key, value in observation.items()}
        if len(set(rows.values())) > 1:
            raise ValueError(f"flow_policy: {where}'s entries disagree on the batch size: {rows}")
        return observation

    def _normalize_states(self, observation: dict[str, Tensor], observe: bool) -> None:
        if "states" in observation:
            observation["states"] = self._normalized(observation["states"], observe)

    def _context(self, observation: dict[str, Tensor]) -> Tensor:
        """c ``[batch, context width]`` from `_observation`'s entries (states normalised)."""
        vision_language = self.spec.vision_language
        if vision_language is None:
            return cast(Tensor, self.encoder(self._cast(observation["states"])))
        images = [observation[key] for key in vision_language.image_keys]
        states = observation.get("states")
        return cast(Tensor, self.encoder(images, observation["task_descriptions"], states))

    def _velocity(self, x: Tensor, t: Tensor, context: Tensor) -> tuple[Tensor, Tensor]:
        """(v_θ(x, t | c) as ``[batch, chunk, dim]`` in fp32, the body's last hidden layer)."""
        angles = t[:, None] * self.frequencies
        features = torch.cat([x.flatten(1), angles.sin(), angles.cos()], dim=-1)
        hidden = self.body(torch.cat([self._cast(features), context], dim=-1))
        return self.velocity_out(hidden).float().view_as(x), hidden

    def _transition(
        self, x: Tensor, velocity: Tensor, hidden: Tensor, t: Tensor, delta: Tensor, euler: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The Gaussian step's (mean, log σ), log σ broadcastable to the chunk."""
        spec = self.spec
        if spec.noise_method == "flow_sde":
            mean, log_std = flow_sde_step(x, velocity, t, delta, spec.noise_level)
            return mean, log_std[:, None, None]
        assert self.noise_head is not None
        low, high = spec.noise_std_range
        std = low + (high - low) * torch.sigmoid(self.noise_head(hidden).float())
        return euler, torch.log(std).view_as(x)

    def _check_chains(self, chains: Tensor, denoise_inds: Tensor) -> None:
        spec = self.spec
        want = (spec.num_steps + 1, spec.action_chunk, spec.action_dim)
        if tuple(chains.shape[1:]) != want:
            raise ValueError(
                f"flow_policy: forward_inputs['chains'] has shape {tuple(chains.shape)}; this "
                f"policy's chains are [batch, num_steps + 1, action_chunk, action_dim] = "
                f"[batch, {', '.join(map(str, want))}]"
            )
        low, high = (
            (int(denoise_inds.min()), int(denoise_inds.max())) if denoise_inds.numel() else (0, 0)
        )
        if low < 0 or high >= spec.num_steps:
            raise ValueError(
                f"flow_policy: forward_inputs['denoise_inds'] must index steps "
                f"0..{spec.num_steps - 1}, got values in [{low}, {high}]"
            )

    def _clipped(self, action: Tensor) -> Tensor:
        if not self.spec.action_low:
            return action.clone()
        return torch.clamp(action, self.action_low, self.action_high)

    def _normalized(self, states: Tensor, observe: bool) -> Tensor:
        if not self.spec.normalize_obs:
            return states.float()
        return normalized_states(self, states, observe)

    def _cast(self, x: Tensor) -> Tensor:
        return x.to(self.velocity_out.weight.dtype)

    def _value(self, context: Tensor) -> Tensor:
        if self.spec.detach_value_input:
            # The value head learns on the encoder's features without moving them: the
            # value loss's gradient stops here, so only the policy's loss shapes the encoder.
            context = context.detach()
        return cast(Tensor, self.value_head(context).squeeze(-1).float())


def build_flow_policy(cfg: ModelConfig, dtype: torch.dtype) -> FlowPolicy:
    """``flow_policy``'s builder: `FlowPolicySpec.from_kwargs(cfg.model_kwargs)` in ``dtype``."""
    if cfg.path is not None:
        raise ValueError(
            f"actor.model.path: flow_policy is built from model_kwargs, not loaded "
            f"(got path {cfg.path!r}); leave it unset"
        )
    return FlowPolicy(FlowPolicySpec.from_kwargs(cfg.model_kwargs), dtype)
