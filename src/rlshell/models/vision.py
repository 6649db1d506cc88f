"""Camera images to patch tokens: the vision tower and projector the VLA-style policies share.

``tiny_vla`` feeds the tokens to its language model, ``flow_policy``'s vision-language
encoder to its context transformer:

    tokens = projector(vision_tower(images))      uint8 [B, H, W, C] → [B, P, width]

with P = (H / patch_size)·(W / patch_size). Both are FSDP units by ``_fsdp_wrap_name``
(``"vision_tower"``, ``"projector"``) and by class name.
"""

from __future__ import annotations

import torch.nn.functional as F
from jaxtyping import Float, UInt8
from torch import Tensor, nn

from rlshell.models.model_kwargs import PREFIX, KwargsReader

__all__ = ["VisionProjector", "VisionTower", "read_patches"]


class VisionTower(nn.Module):
    """uint8 images ``[B, H, W, C]`` → patch features ``[B, P, width]``.

    Pixels scaled to [−1, 1], a ``patch_size``-strided convolution, then ``layers``
    residual blocks x ← x + GELU(conv₃ₓ₃(x)), then a LayerNorm over each patch's features.
    """

    _fsdp_wrap_name = "vision_tower"

    def __init__(self, image_channels: int, width: int, patch_size: int, layers: int) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(image_channels, width, patch_size, patch_size)
        self.blocks = nn.ModuleList(nn.Conv2d(width, width, 3, padding=1) for _ in range(layers))
        self.norm = nn.LayerNorm(width)

    def forward(self, images: UInt8[Tensor, "batch h w c"]) -> Float[Tensor, "batch p width"]:
        dtype = self.patch_embed.weight.dtype
        pixels = images.permute(0, 3, 1, 2).to(dtype) * (2.0 / 255.0) - 1.0
        x = self.patch_embed(pixels)
        for block in self.blocks:
            x = x + F.gelu(block(x))
        return self.norm(x.flatten(2).transpose(1, 2))  # type: ignore[no-any-return]


class VisionProjector(nn.Module):
    """Patch features → the consumer's width: Linear, GELU, Linear (OpenVLA's MLP projector)."""

    _fsdp_wrap_name = "projector"

    def __init__(self, vision_width: int, hidden_size: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(vision_width, hidden_size)
        self.fc2 = nn.Linear(hidden_size, hidden_size)

    def forward(self, features: Tensor) -> Tensor:
        out: Tensor = self.fc2(F.gelu(self.fc1(features)))
        # A copy of a view: FSDP2 warns about views a unit returns.
        return out if out._base is None else out.clone()


def read_patches(read: KwargsReader) -> tuple[int, int]:
    """``image_size`` and ``patch_size`` of a vision tower's ``model_kwargs`` (64 and 8); a
    patch that does not tile the image raises ValueError naming the key."""
    image_size = read.positive_int("image_size", 64)
    patch_size = read.positive_int("patch_size", 8)
    if image_size % patch_size:
        raise ValueError(
            f"{PREFIX}.patch_size: {patch_size} does not divide image_size {image_size}"
        )
    return image_size, patch_size
