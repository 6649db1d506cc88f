"""The built-in ``tiny_vla`` model type: a vision-language-action policy in the OpenVLA pattern.

A causal language model reads a camera image and a task description and
writes the action as tokens (Kim et al. 2024, "OpenVLA"), built small enough
to train on a CPU:

    image tokens  = projector(vision_tower(main_images))          [B, P, hidden]
    prompt        = "<bos>what action should the robot take to {task}?"
    a₁ … a_D      ~ LM( [image tokens ; prompt embeddings] ), one token per action dimension

- Vision: a patch embedding (a ``patch_size``-strided convolution) and
  ``vision_layers`` residual 3×3 convolutions give P = (image_size /
  patch_size)² tokens; a two-layer MLP projects them to the LM's width.
  They come first, then the left-padded prompt (``prompt_length`` tokens).
- Action tokens: the last ``n_action_bins`` ids of the LM's vocabulary. Id
  ``vocab_size − n_action_bins + k`` is bin k, the value xₖ = −1 + 2k/(n − 1)
  (n bins evenly spaced on [−1, 1], both ends included). Decoding runs
  Hugging Face ``generate`` with `ActionTokenLogitsProcessor`, which masks
  every other id, for exactly ``action_dim`` tokens; ``"train"`` samples from
  softmax(z_action/τ) (``temperature``), ``"eval"`` takes the argmax.
- De-normalisation (OpenVLA's): with ``norm_stats`` (a JSON object, or the
  path of a JSON file, ``{key: {"action": {"q01": [...], "q99": [...],
  "mask": [...]}}}``, ``mask`` optional) and ``unnorm_key`` (needed when
  there are several keys), a = ½(x + 1)(q99 − q01) + q01 in the dimensions
  the mask selects (all by default), x elsewhere. Without ``norm_stats`` the
  env receives x ∈ [−1, 1].
- Value: V(s) = value_head(h), h the LM's last hidden state (after its
  final norm) at the last prompt position, before any action token.

Log-probabilities: ``prev_logprobs`` and ``default_forward``'s ``logprobs``
are the joint log π(a|s) = Σ_d log π(a_d | s, a_<d), summed over the action
tokens, one number per sample as PPO's ratio needs (``mlp_policy``'s
gaussian sums over dimensions the same way). Each term is
`rlcore.logprobs.token_logprobs` over the action-bin logits only at
temperature τ, the distribution the tokens were sampled from; ``entropy`` is
Σ_d H(π(·|s, a_<d)), the chain-rule entropy along the sampled prefix.
``default_forward`` recomputes them with one teacher-forced forward pass
([image ; prompt ; a₁ … a_{D−1}], ``logits_to_keep=D``), equal to rollout's up
to floating-point rounding.

Supervised fine-tuning (OpenVLA's behaviour cloning): ``sft_forward(actions=...,
**observation)`` takes the expert's env actions ``[B, action_dim]`` and the
observation by keyword as ``env_obs`` holds it. Each action goes to its nearest
bins, the inverse of the de-normalisation (`ActionUnnormalizer.nearest_bins`):
x = 2(a − q01)/(q99 − q01) − 1 in the masked dimensions (a elsewhere), clipped
to [−1, 1], k = round((x + 1)(n − 1)/2). The loss is the bins' mean negative
log-likelihood −(1/BD) Σ_b Σ_d log π(k_d | s_b, k_<d) at temperature 1, from
``default_forward``'s teacher-forced pass; ``accuracy`` beside it is the
fraction of bins the argmax predicts. ``runner.runner_type='sft'`` with
``data.task='demonstrations'`` trains it (`rlshell.workers.embodied_sft`).

``model_kwargs`` holds the keys above and, for a model built from a config,
fields of the transformers config class ``config_class`` (default
``LlamaConfig``; tiny defaults: hidden 64, 2 layers, 4 heads). With
``actor.model.path`` the LM is loaded from that local directory or Hub id instead (and
its tokenizer, unless ``tokenizer_path`` names one); otherwise the tokenizer
is the project's character tokenizer over ``alphabet``, and the vocabulary
is the tokenizer's plus the action bins.

FSDP units: `VisionTower` (``_fsdp_wrap_name`` ``"vision_tower"``),
`VisionProjector` (``"projector"``), `ValueHead` (``"value_head"``) and the
LM's decoder layers (``"decoder_layer"``, and their class, e.g.
``LlamaDecoderLayer``); the default wrap policy (all fields empty) wraps
them all through ``_no_split_modules``. LoRA (``actor.model.is_lora``):
adapters on the LM's ``lora_target_modules``, the value head trained in full.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch
from attrs import frozen
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from rlcore.logprobs import token_logprobs, token_stats
from rlshell.config import ModelConfig
from rlshell.envs.text import texts_of
from rlshell.models.base import ActionInfo, BasePolicy
from rlshell.models.model_kwargs import PREFIX, KwargsReader, ModelOption, Scalar
from rlshell.models.vision import VisionProjector, VisionTower, read_patches
from rlshell.models.vision_language import DEFAULT_VLA_ALPHABET

__all__ = [
    "ActionTokenLogitsProcessor",
    "ActionUnnormalizer",
    "TinyVLA",
    "TinyVLASpec",
    "ValueHead",
    "VisionProjector",
    "VisionTower",
    "build_tiny_vla",
    "load_norm_stats",
]

DEFAULT_PROMPT = "what action should the robot take to {}?"
# The projections LoRA adapts, where the LM has them (Llama, Qwen2, Mistral, Gemma).
LORA_CANDIDATES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# A tiny LM unless model_kwargs says otherwise.
_LM_DEFAULTS: dict[str, Scalar] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
_VLA_KEYS = (
    "action_dim",
    "n_action_bins",
    "image_size",
    "image_channels",
    "patch_size",
    "vision_width",
    "vision_layers",
    "prompt_length",
    "prompt_template",
    "alphabet",
    "temperature",
    "norm_stats",
    "unnorm_key",
    "config_class",
)


@frozen
class TinyVLASpec:
    """A `TinyVLA`'s shape, read from ``model_kwargs`` by `TinyVLASpec.from_kwargs`.

    ``lm_kwargs`` are the transformers config fields (``vocab_size`` filled in
    by the builder when not given); empty when the LM is loaded from a path.
    """

    action_dim: int
    n_action_bins: int = 256
    image_size: int = 64
    image_channels: int = 3
    patch_size: int = 8
    vision_width: int = 64
    vision_layers: int = 2
    prompt_length: int = 64
    prompt_template: str = DEFAULT_PROMPT
    alphabet: str = DEFAULT_VLA_ALPHABET
    temperature: float = 1.0
    norm_stats: str | None = None
    unnorm_key: str | None = None
    config_class: str = "LlamaConfig"
    lm_kwargs: tuple[tuple[str, ModelOption], ...] = ()

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, ModelOption], from_path: bool = False) -> TinyVLASpec:
        """Parse ``model_kwargs``; a bad or unknown entry raises ValueError naming its key."""
        import transformers

        read = KwargsReader(kwargs, "tiny_vla")
        class_name = read.string("config_class", "LlamaConfig") or "LlamaConfig"
        config_class = getattr(transformers, class_name, None)
        if not isinstance(config_class, type) or not issubclass(
            config_class, transformers.PretrainedConfig
        ):
            raise ValueError(f"{PREFIX}.config_class: no transformers config class {class_name}")
        lm_keys = [key for key in kwargs if key not in _VLA_KEYS]
        if lm_keys and from_path:
            raise ValueError(
                f"{PREFIX}.{lm_keys[0]}: the LM is loaded from actor.model.path, so its "
                f"config comes from there; tiny_vla reads only {', '.join(_VLA_KEYS)}"
            )
        defaults = config_class()
        unknown = [key for key in lm_keys if not hasattr(defaults, key)]
        if unknown:
            fields = [key for key in vars(defaults) if not key.startswith("_")]
            close = difflib.get_close_matches(unknown[0], [*_VLA_KEYS, *fields], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ValueError(
                f"unknown key '{PREFIX}.{unknown[0]}'{hint}: neither a tiny_vla key "
                f"({', '.join(_VLA_KEYS)}) nor a field of transformers.{class_name}"
            )
        image_size, patch_size = read_patches(read)
        template = read.string("prompt_template", DEFAULT_PROMPT) or DEFAULT_PROMPT
        if template.count("{}") != 1:
            raise ValueError(
                f"{PREFIX}.prompt_template: needs exactly one '{{}}' where the task goes, "
                f"got {template!r}"
            )
        n_bins = read.positive_int("n_action_bins", 256)
        if n_bins < 2:
            raise ValueError(f"{PREFIX}.n_action_bins: expected at least 2 bins, got {n_bins}")
        lm_kwargs: dict[str, ModelOption] = {} if from_path else {**_LM_DEFAULTS}
        lm_kwargs.update({key: kwargs[key] for key in lm_keys})
        return cls(
            action_dim=read.positive_int("action_dim"),
            n_action_bins=n_bins,
            image_size=image_size,
            image_channels=read.positive_int("image_channels", 3),
            patch_size=patch_size,
            vision_width=read.positive_int("vision_width", 64),
            vision_layers=read.non_negative_int("vision_layers", 2),
            prompt_length=read.positive_int("prompt_length", 64),
            prompt_template=template,
            alphabet=read.string("alphabet", DEFAULT_VLA_ALPHABET) or DEFAULT_VLA_ALPHABET,
            temperature=read.positive_float("temperature", 1.0),
            norm_stats=read.string("norm_stats"),
            unnorm_key=read.string("unnorm_key"),
            config_class=class_name,
            lm_kwargs=tuple(lm_kwargs.items()),
        )


# ---------------------------------------------------------------------------
# Action tokens: the logits processor and the de-normalisation.


class ActionTokenLogitsProcessor(LogitsProcessor):
    """Keeps the scores of the action ids ``[first_id, first_id + count)``; −inf elsewhere.

    Used with ``generate`` (``logits_processor=LogitsProcessorList([...])``):
    sampling, greedy search and the temperature then act on the action bins
    only, the distribution `TinyVLA.default_forward` scores.
    """

    def __init__(self, first_id: int, count: int) -> None:
        self.first_id = first_id
        self.count = count

    def __call__(
        self, input_ids: Int[Tensor, "batch seq"], scores: Float[Tensor, "batch vocab"]
    ) -> Float[Tensor, "batch vocab"]:
        end = self.first_id + self.count
        if scores.shape[-1] < end:
            raise ValueError(
                f"ActionTokenLogitsProcessor: scores have {scores.shape[-1]} ids, "
                f"the action ids end at {end}"
            )
        masked = torch.full_like(scores, float("-inf"))
        masked[:, self.first_id : end] = scores[:, self.first_id : end]
        return masked


def load_norm_stats(source: str) -> dict[str, Any]:
    """``norm_stats``: the JSON text itself (starting with ``{``) or the path of a JSON file."""
    if source.lstrip().startswith("{"):
        try:
            loaded = json.loads(source)
        except json.JSONDecodeError as error:
            raise ValueError(f"{PREFIX}.norm_stats: not valid JSON ({error})") from None
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(
                f"{PREFIX}.norm_stats: {path} is not a file; give a JSON file's path or the "
                'JSON itself, {"<key>": {"action": {"q01": [...], "q99": [...]}}}'
            )
        loaded = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(loaded, dict) or not loaded:
        raise ValueError(f"{PREFIX}.norm_stats: expected a non-empty JSON object of datasets")
    return loaded


class ActionUnnormalizer(nn.Module):
    """Bin ids ↦ env actions: xₖ = −1 + 2k/(n − 1), then a = ½(x + 1)(q99 − q01) + q01 where masked.

    `ActionUnnormalizer.nearest_bins` is the inverse on the bins' values (SFT's
    targets). Buffers are fp32 and not saved (they follow from ``model_kwargs``).
    """

    bin_values: Tensor
    q01: Tensor
    q99: Tensor
    mask: Tensor

    def __init__(self, spec: TinyVLASpec) -> None:
        super().__init__()
        dim = spec.action_dim
        low, high, mask = [-1.0] * dim, [1.0] * dim, [False] * dim
        if spec.norm_stats is not None:
            low, high, mask = _quantiles(load_norm_stats(spec.norm_stats), spec.unnorm_key, dim)
        self.register_buffer("bin_values", torch.linspace(-1.0, 1.0, spec.n_action_bins), False)
        self.register_buffer("q01", torch.tensor(low, dtype=torch.float32), False)
        self.register_buffer("q99", torch.tensor(high, dtype=torch.float32), False)
        self.register_buffer("mask", torch.tensor(mask, dtype=torch.bool), False)

    def forward(self, bins: Int[Tensor, "batch dim"]) -> Float[Tensor, "batch dim"]:
        x = self.bin_values[bins]
        scaled = 0.5 * (x + 1.0) * (self.q99 - self.q01) + self.q01
        return torch.where(self.mask, scaled, x)

    def nearest_bins(self, actions: Float[Tensor, "batch dim"]) -> Int[Tensor, "batch dim"]:
        """Env actions ↦ the nearest bin ids, OpenVLA's normalisation then discretisation.

        x = 2(a − q01)/(q99 − q01) − 1 where masked (a elsewhere), clipped to
        [−1, 1]; then k = round((x + 1)(n − 1)/2), the nearest xₖ. A dimension
        with q99 = q01 acts q01 whatever its bin; it maps there to bin 0.
        ``forward(nearest_bins(forward(k))) == forward(k)`` for every bin k.
        """
        if not bool(torch.isfinite(actions).all()):
            raise ValueError("TinyVLA: the actions to discretise hold NaN or infinity")
        a = actions.float()
        span = self.q99 - self.q01
        scaled = 2.0 * (a - self.q01) / torch.where(span > 0, span, 1.0) - 1.0
        scaled = torch.where(span > 0, scaled, -1.0)
        x = torch.where(self.mask, scaled, a).clamp(-1.0, 1.0)
        last = self.bin_values.shape[0] - 1
        return torch.round((x + 1.0) * (last / 2)).long().clamp(0, last)


def _quantiles(
    stats: dict[str, Any], key: str | None, dim: int
) -> tuple[list[float], list[float], list[bool]]:
    if key is None:
        if len(stats) != 1:
            raise ValueError(
                f"{PREFIX}.unnorm_key: norm_stats holds {len(stats)} datasets "
                f"({', '.join(sorted(stats))}); name the one to de-normalise with"
            )
        key = next(iter(stats))
    if key not in stats:
        raise ValueError(
            f"{PREFIX}.unnorm_key: {key!r} is not in norm_stats; "
            f"it holds {', '.join(sorted(stats))}"
        )
    entry = stats[key].get("action", stats[key]) if isinstance(stats[key], dict) else None
    if not isinstance(entry, dict) or "q01" not in entry or "q99" not in entry:
        raise ValueError(
            f"{PREFIX}.norm_stats[{key!r}]: expected {{'action': {{'q01': [...], 'q99': [...]}}}}"
        )
    values: dict[str, list[float]] = {}
    for name in ("q01", "q99"):
        raw = entry[name]
        if not isinstance(raw, list) or len(raw) != dim:
            raise ValueError(
                f"{PREFIX}.norm_stats[{key!r}].action.{name}: expected {dim} numbers "
                f"(action_dim), got {raw!r}"
            )
        values[name] = [float(v) for v in raw]
    mask = entry.get("mask", [True] * dim)
    if not isinstance(mask, list) or len(mask) != dim:
        raise ValueError(
            f"{PREFIX}.norm_stats[{key!r}].action.mask: expected {dim} booleans, got {mask!r}"
        )
    for i, (lo, hi) in enumerate(zip(values["q01"], values["q99"], strict=True)):
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ValueError(
                f"{PREFIX}.norm_stats[{key!r}].action: dimension {i} has q01 {lo} > q99 {hi} "
                "or a non-finite bound"
            )
    return values["q01"], values["q99"], [bool(m) for m in mask]


# ---------------------------------------------------------------------------
# The value head (the vision tower and projector are `rlshell.models.vision`'s).


def _own(tensor: Tensor) -> Tensor:
    """``tensor``, copied if it is a view: FSDP2 warns about views a unit returns (an in-place
    op on one would skip the unit's backward hook)."""
    return tensor if tensor._base is None else tensor.clone()


class ValueHead(nn.Module):
    """V(s) from the LM's last hidden state: Linear, Tanh, Linear → one value per row."""

    _fsdp_wrap_name = "value_head"

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, hidden_size)
        self.fc2 = nn.Linear(hidden_size, 1)
        nn.init.orthogonal_(self.fc2.weight, 1.0)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        x = hidden.to(self.fc1.weight.dtype)
        return _own(self.fc2(torch.tanh(self.fc1(x))).squeeze(-1).float())


# ---------------------------------------------------------------------------
# The policy.


def _positions(mask: Int[Tensor, "batch seq"]) -> Int[Tensor, "batch seq"]:
    """Position ids that skip padding: cumsum(mask) − 1, 0 on pads (as ``generate`` makes them)."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)


class TinyVLA(BasePolicy):
    """An image + task → action-token policy over a Hugging Face causal LM (see the module doc).

    ``forward_inputs``: ``input_ids`` and ``attention_mask`` (the left-padded
    prompt, ``[B, prompt_length]``), ``pixel_values`` (the uint8 image as the
    env gave it, ``[B, H, W, C]``) and ``action_tokens`` (the generated ids,
    ``[B, action_dim]``). ``sft_forward`` is the behaviour-cloning loss.
    """

    def __init__(
        self,
        spec: TinyVLASpec,
        language_model: nn.Module,
        tokenizer: Any,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.tokenizer = tokenizer
        self.language_model = language_model
        config: Any = getattr(language_model, "config", None)
        hidden_size = int(config.hidden_size)
        self.vocab_size = int(config.vocab_size)
        if self.vocab_size <= spec.n_action_bins:
            raise ValueError(
                f"{PREFIX}.n_action_bins: {spec.n_action_bins} action tokens do not fit a "
                f"vocabulary of {self.vocab_size}"
            )
        self.first_action_id = self.vocab_size - spec.n_action_bins
        self.vision_tower = VisionTower(
            spec.image_channels, spec.vision_width, spec.patch_size, spec.vision_layers
        )
        self.projector = VisionProjector(spec.vision_width, hidden_size)
        self.value_head = ValueHead(hidden_size)
        self.unnormalize = ActionUnnormalizer(spec)
        self.vision_tower.to(dtype)
        self.projector.to(dtype)
        self.value_head.to(dtype)
        self.logits_processor = ActionTokenLogitsProcessor(self.first_action_id, spec.n_action_bins)
        self.pad_token_id = int(getattr(tokenizer, "pad_token_id", None) or 0)
        bos = getattr(tokenizer, "bos_token_id", None)
        self.bos_token_id: int | None = None if bos is None else int(bos)
        self._prompt_ids: dict[str, list[int]] = {}

        layer_classes = sorted(getattr(language_model, "_no_split_modules", None) or ())
        for module in language_model.modules():
            if type(module).__name__ in layer_classes:
                module._fsdp_wrap_name = "decoder_layer"  # type: ignore[assignment]
        self._no_split_modules = [*layer_classes, "VisionTower", "VisionProjector", "ValueHead"]
        names = {name.rsplit(".", 1)[-1] for name, _ in language_model.named_modules()}
        self.lora_target_modules = tuple(name for name in LORA_CANDIDATES if name in names)
        self.lora_trainable_modules = ("value_head",)

    # -- rollout

    def predict_action_batch(
        self,
        env_obs: dict[str, Any],
        mode: Literal["train", "eval"] = "train",
        compute_values: bool = True,
    ) -> tuple[Tensor, ActionInfo]:
        """Generate ``action_dim`` action tokens per row and de-normalise them for the env.

        Reads ``env_obs["main_images"]`` (uint8 ``[B, H, W, C]``) and
        ``env_obs["task_descriptions"]`` (one string per row, or code points
        from `rlshell.envs.text`). Returns fp32 actions ``[B, action_dim]``,
        ``prev_logprobs`` (the joint log-prob, ``[B]``), ``prev_values``
        ``[B]`` and ``forward_inputs``.
        """
        if mode not in ("train", "eval"):
            raise ValueError(f"predict_action_batch: mode must be 'train' or 'eval', got {mode!r}")
        images, input_ids, attention_mask = self._prompted(env_obs, "env_obs")
        dim = self.spec.action_dim
        with torch.no_grad():
            embeds, mask = self._prefix(images, input_ids, attention_mask)
            with self._last_hidden() as captured:
                out = self.language_model.generate(  # type: ignore[operator]
                    inputs_embeds=embeds,
                    attention_mask=mask,
                    position_ids=_positions(mask),
                    generation_config=self._generation_config(sample=mode == "train"),
                    logits_processor=LogitsProcessorList([self.logits_processor]),
                )
            tokens = out.sequences[:, -dim:]
            logits = torch.stack(out.logits, dim=1)
            info: ActionInfo = {
                "prev_logprobs": self._action_logprobs(logits, tokens),
                "forward_inputs": {
                    "input_ids": input_ids,
                    "attention_mask": attention_mask,
                    "pixel_values": images,
                    "action_tokens": tokens,
                },
            }
            if compute_values:
                info["prev_values"] = self.value_head(captured[0][:, -1])
        return self.unnormalize(tokens - self.first_action_id), info

    def tokenize_prompts(
        self, texts: list[str], device: torch.device
    ) -> tuple[Int[Tensor, "batch length"], Int[Tensor, "batch length"]]:
        """The prompts, left-padded to ``prompt_length``: ``(input_ids, attention_mask)``."""
        length = self.spec.prompt_length
        ids = torch.full((len(texts), length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(texts), length), dtype=torch.long)
        for row, text in enumerate(texts):
            tokens = self._prompt_ids.get(text)
            if tokens is None:
                prompt = self.spec.prompt_template.format(text)
                tokens = list(self.tokenizer.encode(prompt, add_special_tokens=False))
                if self.bos_token_id is not None:
                    tokens.insert(0, self.bos_token_id)
                if len(tokens) > length:
                    raise ValueError(
                        f"{PREFIX}.prompt_length: the prompt for task {text!r} has {len(tokens)} "
                        f"tokens, more than prompt_length {length}; raise prompt_length"
                    )
                self._prompt_ids[text] = tokens
            if tokens:
                ids[row, length - len(tokens) :] = torch.tensor(tokens)
                mask[row, length - len(tokens) :] = 1
        return ids.to(device), mask.to(device)

    # -- training

    def default_forward(
        self,
        forward_inputs: dict[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = True,
        compute_values: bool = True,
    ) -> dict[str, Tensor]:
        """``logprobs``, ``entropy`` and ``values`` (each ``[B]``) in one teacher-forced pass."""
        images = self._images(self.require_input(forward_inputs, "pixel_values"))
        input_ids = self.require_input(forward_inputs, "input_ids")
        attention_mask = self.require_input(forward_inputs, "attention_mask")
        tokens = self.require_input(forward_inputs, "action_tokens")
        dim = self.spec.action_dim
        if tokens.dim() != 2 or tokens.shape[1] != dim:
            raise ValueError(
                f"TinyVLA: forward_inputs['action_tokens'] must be [batch, {dim}] "
                f"(action_dim), got {tuple(tokens.shape)}"
            )
        action_logits, prompt_hidden = self._teacher_forced(
            images, input_ids, attention_mask, tokens
        )
        results: dict[str, Tensor] = {}
        if compute_logprobs or compute_entropy:
            stats = token_stats(action_logits, tokens - self.first_action_id, self.spec.temperature)
            if compute_logprobs:
                results["logprobs"] = stats.logprobs.sum(-1)
            if compute_entropy:
                results["entropy"] = stats.entropy.sum(-1)
        if compute_values:
            results["values"] = self.value_head(prompt_hidden)
        return {key: _own(value) for key, value in results.items()}

    def sft_forward(self, actions: Tensor, **observation: Any) -> dict[str, Tensor]:
        """Behaviour cloning (OpenVLA's): ``{"loss", "accuracy"}`` for the expert's ``actions``.

        ``actions`` are env actions ``[batch, action_dim]``; the observation is given by
        keyword as ``env_obs`` holds it (``main_images=..., task_descriptions=...``).
        Each action becomes its nearest bins (`ActionUnnormalizer.nearest_bins`) and
        ``loss`` is their mean negative log-likelihood −(1/BD) Σ log π(k_d | s, k_<d) at
        temperature 1 under teacher forcing (`default_forward`'s pass); ``accuracy`` is
        the fraction of bins the logits' argmax gets right (no gradient).
        """
        images, input_ids, attention_mask = self._prompted(observation, "observation")
        dim = self.spec.action_dim
        if actions.shape != (images.shape[0], dim):
            raise ValueError(
                f"TinyVLA.sft_forward: actions must be [batch, action_dim] = "
                f"[{images.shape[0]}, {dim}] (one action per image), got {tuple(actions.shape)}"
            )
        bins = self.unnormalize.nearest_bins(actions)
        action_logits, _ = self._teacher_forced(
            images, input_ids, attention_mask, bins + self.first_action_id
        )
        loss = -token_logprobs(action_logits, bins).mean()
        accuracy = (action_logits.detach().argmax(-1) == bins).float().mean()
        return {"loss": loss, "accuracy": accuracy}

    def gradient_checkpointing_enable(self) -> None:
        """Checkpoint the LM's decoder layers (``actor.model.gradient_checkpointing``)."""
        self.language_model.gradient_checkpointing_enable()  # type: ignore[operator]

    # -- pieces

    def _prompted(
        self, source: dict[str, Any], where: str
    ) -> tuple[Tensor, Int[Tensor, "batch length"], Int[Tensor, "batch length"]]:
        """``main_images`` (checked) and the prompts of ``task_descriptions``, from ``source``."""
        images = self._images(self.require_input(source, "main_images", source=where))
        texts = texts_of(self.require_input(source, "task_descriptions", source=where))
        if len(texts) != images.shape[0]:
            raise ValueError(
                f"TinyVLA: {len(texts)} task descriptions for {images.shape[0]} images"
            )
        input_ids, attention_mask = self.tokenize_prompts(texts, images.device)
        return images, input_ids, attention_mask

    def _teacher_forced(
        self,
        images: Tensor,
        input_ids: Int[Tensor, "batch length"],
        attention_mask: Int[Tensor, "batch length"],
        tokens: Int[Tensor, "batch dim"],
    ) -> tuple[Float[Tensor, "batch dim bins"], Float[Tensor, "batch hidden"]]:
        """One pass over [image ; prompt ; a₁ … a_{D−1}] (``tokens`` are vocabulary ids):
        the action-bin logits that score a₁ … a_D (``logits_to_keep=D``) and the LM's
        last hidden state at the last prompt position, where rollout reads the value."""
        prefix, prefix_mask = self._prefix(images, input_ids, attention_mask)
        embed = self.language_model.get_input_embeddings()  # type: ignore[operator]
        embeds = torch.cat([prefix, embed(tokens[:, :-1])], dim=1)
        mask = torch.cat([prefix_mask, torch.ones_like(tokens[:, :-1])], dim=1)
        with self._last_hidden() as captured:
            out = self.language_model(
                inputs_embeds=embeds,
                attention_mask=mask,
                position_ids=_positions(mask),
                logits_to_keep=tokens.shape[1],
            )
        return out.logits[..., self.first_action_id :], captured[0][:, prefix.shape[1] - 1]

    def _images(self, images: Tensor) -> Tensor:
        spec = self.spec
        expected = (spec.image_size, spec.image_size, spec.image_channels)
        if images.dtype != torch.uint8 or tuple(images.shape[1:]) != expected:
            raise ValueError(
                f"TinyVLA: images must be uint8 [batch, {', '.join(map(str, expected))}] "
                f"(image_size, image_channels), got {images.dtype} {tuple(images.shape)}"
            )
        return images

    def _prefix(
        self, images: Tensor, input_ids: Tensor, attention_mask: Tensor
    ) -> tuple[Float[Tensor, "batch seq hidden"], Int[Tensor, "batch seq"]]:
        """[image tokens ; prompt embeddings] and its attention mask (image tokens always seen)."""
        embed = self.language_model.get_input_embeddings()  # type: ignore[operator]
        text = embed(input_ids)
        image_tokens = self.projector(self.vision_tower(images)).to(text.dtype)
        seen = torch.ones(image_tokens.shape[:2], dtype=attention_mask.dtype, device=images.device)
        return torch.cat([image_tokens, text], dim=1), torch.cat([seen, attention_mask], dim=1)

    def _action_logprobs(
        self, logits: Float[Tensor, "batch dim vocab"], tokens: Int[Tensor, "batch dim"]
    ) -> Float[Tensor, " batch"]:
        action_logits = logits[..., self.first_action_id :]
        bins = tokens - self.first_action_id
        return token_logprobs(action_logits, bins, self.spec.temperature).sum(-1)

    def _generation_config(self, sample: bool) -> GenerationConfig:
        options: dict[str, Any] = {
            "max_new_tokens": self.spec.action_dim,
            "pad_token_id": self.pad_token_id,
            "eos_token_id": None,
            "output_logits": True,
            "return_dict_in_generate": True,
        }
        if sample:
            options.update(do_sample=True, temperature=self.spec.temperature, top_k=0, top_p=1.0)
        else:
            options.update(do_sample=False)
        return GenerationConfig(**options)  # type: ignore[no-untyped-call]

    @contextmanager
    def _last_hidden(self) -> Iterator[list[Tensor]]:
        """The LM's last hidden state (after its final norm) of the first pass inside the block.

        A forward hook on the LM's decoder: the first pass is the whole
        sequence (the prompt, in ``generate``), later ones are single tokens.
        """
        captured: list[Tensor] = []

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not captured:
                hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state
                captured.append(hidden)

        decoder: nn.Module = self.language_model.get_decoder()  # type: ignore[operator]
        handle = decoder.register_forward_hook(hook)
        try:
            yield captured
        finally:
            handle.remove()


# ---------------------------------------------------------------------------
# The builder.


def _load_tokenizer(cfg: ModelConfig, spec: TinyVLASpec) -> Any:
    from rlshell.tokenizer import build_char_tokenizer, load_tokenizer

    source = cfg.tokenizer_path or cfg.path
    if source is not None:
        return load_tokenizer(source)
    return build_char_tokenizer(spec.alphabet)


def _language_model(
    cfg: ModelConfig, spec: TinyVLASpec, vocab: int, dtype: torch.dtype
) -> nn.Module:
    import transformers

    if cfg.path is not None:
        from rlshell.hub import from_pretrained

        loaded: nn.Module = from_pretrained(
            transformers.AutoModelForCausalLM, cfg.path, "actor.model.path", dtype=dtype
        )
        return loaded
    config_class: Callable[..., Any] = getattr(transformers, spec.config_class)
    fields = dict(spec.lm_kwargs)
    needed = vocab + spec.n_action_bins
    given = fields.setdefault("vocab_size", needed)
    if not isinstance(given, int) or isinstance(given, bool) or given < needed:
        raise ValueError(
            f"{PREFIX}.vocab_size: {given!r} is too small for the tokenizer's {vocab} ids and "
            f"{spec.n_action_bins} action tokens (at least {needed})"
        )
    built: nn.Module = transformers.AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
        config_class(**fields), dtype=dtype
    )
    return built


def build_tiny_vla(cfg: ModelConfig, dtype: torch.dtype) -> TinyVLA:
    """``tiny_vla``'s builder: the LM from ``model_kwargs`` (or ``path``), then the heads."""
    spec = TinyVLASpec.from_kwargs(cfg.model_kwargs, from_path=cfg.path is not None)
    tokenizer = _load_tokenizer(cfg, spec)
    language_model = _language_model(cfg, spec, len(tokenizer), dtype)
    return TinyVLA(spec, language_model, tokenizer, dtype)
