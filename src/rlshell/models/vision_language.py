"""Camera images, a task description and the robot's state to one context vector: a small VLM.

π0 (Black et al. 2024, arXiv:2410.24164) conditions its flow action expert on a
vision-language model's prefix: image tokens and the task's text tokens, read by one
transformer. `VisionLanguageEncoder` is that prefix at a size that trains on a CPU, for
``flow_policy``'s ``encoder="vision_language"``:

    image tokens  = projector(vision_tower(image_v)) + p_v     P per camera v (main, wrist)
    text tokens   = E[ids(task description)] + q               one per character, ≤ text_length
    state token   = W_s · states                               when state_dim > 0
    h             = blocks([z ; image tokens ; text tokens ; state token])   padding masked
    c             = LayerNorm(h at z)                          [batch, width]

z is a learned summary token (ViT's class token): c is its output, so the action expert
reads one vector, as it reads the state encoder's. p_v (one per camera and patch) and q
(one per character position) are learned position embeddings; one vision tower
(`rlshell.models.vision`) serves every camera, as π0's SigLIP does. Each block is pre-norm:
x ← x + MHA(LN(x)), x ← x + MLP(LN(x)), with the attention written out (softmax(QKᵀ/√d)V in
fp32) rather than `torch.nn.TransformerEncoder`, whose inference fast path (an ``eval()``
module under ``no_grad``, as rollout runs) rounds differently from the path training takes,
and the recomputed log-probabilities must equal the rollout's bitwise.

Characters are ids of the project's character tokenizer (`rlshell.tokenizer.
build_char_tokenizer` over ``alphabet``: ``<pad>`` 0, ``<unk>`` 3, character i at 4 + i),
looked up from the code points `rlshell.envs.text` encodes, on the tensors' device.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from attrs import frozen
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from rlshell.envs.text import encode_texts, texts_of
from rlshell.models.model_kwargs import PREFIX, KwargsReader
from rlshell.models.vision import VisionProjector, VisionTower, read_patches

__all__ = [
    "DEFAULT_VLA_ALPHABET",
    "VISION_LANGUAGE_KEYS",
    "ContextBlock",
    "VisionLanguageEncoder",
    "VisionLanguageSpec",
    "checked_images",
    "task_codes",
]

# Printable ASCII without the whitespace other than the space.
DEFAULT_VLA_ALPHABET = "".join(c for c in string.printable if c not in "\t\n\r\x0b\x0c")
# The model_kwargs a vision-language encoder reads (beside the policy's own).
VISION_LANGUAGE_KEYS = (
    "image_size",
    "image_channels",
    "patch_size",
    "vision_width",
    "vision_layers",
    "wrist_images",
    "text_length",
    "alphabet",
    "context_width",
    "context_layers",
    "context_heads",
)


@frozen
class VisionLanguageSpec:
    """A `VisionLanguageEncoder`'s shape; ``state_dim`` 0 reads no ``states``."""

    state_dim: int = 0
    image_size: int = 64
    image_channels: int = 3
    patch_size: int = 8
    vision_width: int = 64
    vision_layers: int = 2
    wrist_images: bool = False
    text_length: int = 64
    alphabet: str = DEFAULT_VLA_ALPHABET
    width: int = 64
    layers: int = 2
    heads: int = 4

    @classmethod
    def from_reader(cls, read: KwargsReader, state_dim: int) -> VisionLanguageSpec:
        """The `VISION_LANGUAGE_KEYS` of ``read``; a bad entry raises ValueError naming its key."""
        image_size, patch_size = read_patches(read)
        width = read.positive_int("context_width", 64)
        heads = read.positive_int("context_heads", 4)
        if width % heads:
            raise ValueError(
                f"{PREFIX}.context_heads: {heads} heads do not divide context_width {width}"
            )
        alphabet = read.string("alphabet", DEFAULT_VLA_ALPHABET) or DEFAULT_VLA_ALPHABET
        repeated = sorted({c for c in alphabet if alphabet.count(c) > 1})
        if repeated or "\0" in alphabet:
            raise ValueError(
                f"{PREFIX}.alphabet: list each character once and leave out NUL (the padding "
                f"code point); repeated: {repeated!r}"
            )
        return cls(
            state_dim=state_dim,
            image_size=image_size,
            image_channels=read.positive_int("image_channels", 3),
            patch_size=patch_size,
            vision_width=read.positive_int("vision_width", 64),
            vision_layers=read.non_negative_int("vision_layers", 2),
            wrist_images=read.bool_("wrist_images", False),
            text_length=read.positive_int("text_length", 64),
            alphabet=alphabet,
            width=width,
            layers=read.positive_int("context_layers", 2),
            heads=heads,
        )

    @property
    def image_keys(self) -> tuple[str, ...]:
        """The ``env_obs`` image entries read, in token order."""
        return ("main_images", "wrist_images") if self.wrist_images else ("main_images",)

    @property
    def patches(self) -> int:
        """P: the tokens of one camera's image."""
        return (self.image_size // self.patch_size) ** 2


def checked_images(images: Tensor, spec: VisionLanguageSpec, where: str) -> Tensor:
    """``images`` if uint8 ``[batch, image_size, image_size, image_channels]``, else ValueError."""
    expected = (spec.image_size, spec.image_size, spec.image_channels)
    if images.dtype != torch.uint8 or images.dim() != 4 or tuple(images.shape[1:]) != expected:
        raise ValueError(
            f"{where} must be uint8 [batch, {', '.join(map(str, expected))}] (image_size, "
            f"image_size, image_channels), got {images.dtype} {tuple(images.shape)}"
        )
    return images


def task_codes(
    value: Any, spec: VisionLanguageSpec, where: str, device: torch.device
) -> Int[Tensor, "batch length"]:
    """Task descriptions as int32 code points ``[batch, ≤ text_length]`` (`rlshell.envs.text`).

    A code-point tensor passes through, its all-padding columns past ``text_length``
    dropped; a list of strings is encoded ``text_length`` wide (so every step's rows stack).
    A description longer than ``text_length`` characters raises ValueError.
    """
    length = spec.text_length
    too_long = (
        f"{where}: a task description is longer than {PREFIX}.text_length ({length} "
        "characters); raise text_length"
    )
    if not isinstance(value, Tensor):
        texts = texts_of(value, where)
        if any(len(text) > length for text in texts):
            raise ValueError(too_long)
        return encode_texts(texts, length, device)
    codes: Tensor = value
    if codes.dim() != 2 or codes.is_floating_point() or codes.dtype == torch.bool:
        raise ValueError(
            f"{where} must be int code points [batch, width] (rlshell.envs.text.encode_texts) "
            f"or a list of strings, got {codes.dtype} {tuple(codes.shape)}"
        )
    if codes.shape[1] > length:
        if bool(codes[:, length:].any()):
            raise ValueError(too_long)
        codes = codes[:, :length]
    return codes


class ContextBlock(nn.Module):
    """A pre-norm transformer block: x ← x + MHA(LN(x)); x ← x + W₂ GELU(W₁ LN(x)).

    Attention is softmax(QKᵀ/√d)V per head, in fp32, with padded keys masked out. An FSDP
    unit by class name and ``_fsdp_wrap_name`` ``"context_block"``.
    """

    _fsdp_wrap_name = "context_block"

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attention_norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.attention_out = nn.Linear(width, width)
        self.mlp_norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(
        self, x: Float[Tensor, "batch seq width"], padding: Bool[Tensor, "batch seq"]
    ) -> Float[Tensor, "batch seq width"]:
        """``padding``: True where a token is padding (no token attends to it)."""
        batch, seq, width = x.shape
        head_dim = width // self.heads
        qkv = self.qkv(self.attention_norm(x)).view(batch, seq, 3, self.heads, head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).float()  # each [batch, heads, seq, head_dim]
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
        weights = scores.masked_fill(padding[:, None, None, :], float("-inf")).softmax(-1)
        mixed = (weights @ v).transpose(1, 2).reshape(batch, seq, width).to(x.dtype)
        x = x + self.attention_out(mixed)
        out: Tensor = x + self.fc2(F.gelu(self.fc1(self.mlp_norm(x))))
        return out


def _char_table(alphabet: str) -> tuple[Tensor, int, int, int]:
    """The character tokenizer's (code point → id lookup, ``<pad>`` id, ``<unk>`` id,
    vocabulary size)."""
    from rlshell.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer(alphabet)
    pad, unk = int(tokenizer.pad_token_id), int(tokenizer.unk_token_id)
    table = torch.full((max(map(ord, alphabet)) + 1,), unk, dtype=torch.long)
    ids = tokenizer.convert_tokens_to_ids(list(alphabet))
    table[[ord(c) for c in alphabet]] = torch.tensor(ids, dtype=torch.long)
    table[0] = pad
    return table, pad, unk, len(tokenizer)


class VisionLanguageEncoder(nn.Module):
    """Images, task code points and states → the context c ``[batch, width]`` (module doc)."""

    char_ids: Tensor

    def __init__(self, spec: VisionLanguageSpec) -> None:
        super().__init__()
        self.spec = spec
        width = spec.width
        self.vision_tower = VisionTower(
            spec.image_channels, spec.vision_width, spec.patch_size, spec.vision_layers
        )
        self.projector = VisionProjector(spec.vision_width, width)
        cameras = len(spec.image_keys)
        self.image_positions = nn.Parameter(0.02 * torch.randn(cameras, spec.patches, width))
        table, self.pad_id, self.unk_id, vocab = _char_table(spec.alphabet)
        self.register_buffer("char_ids", table, persistent=False)
        self.text_embed = nn.Embedding(vocab, width)
        self.text_positions = nn.Parameter(0.02 * torch.randn(spec.text_length, width))
        self.state_proj = nn.Linear(spec.state_dim, width) if spec.state_dim else None
        self.summary = nn.Parameter(0.02 * torch.randn(width))
        self.blocks = nn.ModuleList(ContextBlock(width, spec.heads) for _ in range(spec.layers))
        self.norm = nn.LayerNorm(width)

    def forward(
        self,
        images: Sequence[Tensor],
        codes: Int[Tensor, "batch length"],
        states: Tensor | None = None,
    ) -> Float[Tensor, "batch width"]:
        """c from one uint8 image batch per camera (`VisionLanguageSpec.image_keys`' order),
        the task's code points (≤ ``text_length`` wide) and, with ``state_dim``, ``states``."""
        batch = codes.shape[0]
        dtype = self.summary.dtype
        tokens = [self.summary.expand(batch, 1, -1)]
        for camera, pixels in enumerate(images):
            tokens.append(self.projector(self.vision_tower(pixels)) + self.image_positions[camera])
        ids = self.token_ids(codes)
        tokens.append(self.text_embed(ids) + self.text_positions[: ids.shape[1]])
        if self.state_proj is not None:
            if states is None:
                raise ValueError("VisionLanguageEncoder: state_dim > 0, so it needs states")
            tokens.append(self.state_proj(states.to(dtype))[:, None])
        x = torch.cat([token.to(dtype) for token in tokens], dim=1)
        padding = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device)
        start = 1 + len(images) * self.spec.patches
        padding[:, start : start + ids.shape[1]] = ids == self.pad_id
        for block in self.blocks:
            x = block(x, padding)
        return self.norm(x[:, 0])  # type: ignore[no-any-return]

    def token_ids(self, codes: Int[Tensor, "batch length"]) -> Int[Tensor, "batch length"]:
        """The character tokenizer's ids of code points (0, padding, → ``<pad>``; a code point
        outside the alphabet → ``<unk>``)."""
        table = self.char_ids
        codes = codes.long()
        inside = (codes >= 0) & (codes < table.shape[0])
        return torch.where(inside, table[codes.clamp(0, table.shape[0] - 1)], self.unk_id)
