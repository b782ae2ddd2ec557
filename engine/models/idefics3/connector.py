"""The Idefics3 / SmolVLM connector: pixel shuffle, then one linear map into the text model's width.

Pixel shuffle trades tokens for width: each s x s block of neighbouring patch features becomes one token
whose features are the block's s*s feature vectors side by side (row by row within the block), so a tile of
side x side patches gives (side / s)^2 tokens of s*s*hidden features:

    [N, side*side, D] -> [N, side/s, s, side/s, s, D] -> [N, side/s, side/s, s, s, D] -> [N, (side/s)^2, s*s*D]
"""

from __future__ import annotations

import math

import torch
from torch import nn

from engine.models.linear import Linear


def pixel_shuffle(features: torch.Tensor, scale: int) -> torch.Tensor:
    """[N, side*side, D] patch features of square tiles -> [N, (side/scale)^2, scale*scale*D]."""
    num_tiles, num_patches, dim = features.shape
    side = math.isqrt(num_patches)
    if side * side != num_patches or side % scale:
        raise ValueError(
            f"the connector needs a square grid of patches whose side is a multiple of scale_factor={scale}, "
            f"got {num_patches} patches per tile; the processor's max_image_size does not fit this model"
        )
    blocks = side // scale
    x = features.view(num_tiles, blocks, scale, blocks, scale, dim)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(num_tiles, blocks * blocks, scale * scale * dim)


class ModalityProjection(nn.Module):
    """The bias-free linear map (`proj`, the checkpoint's name) from shuffled features to text width."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.proj = Linear(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Idefics3Connector(nn.Module):
    """Vision-tower output [N, patches, vision_dim] -> text-embedding rows [N, patches / scale^2, text_dim]."""

    def __init__(self, vision_dim: int, text_dim: int, scale_factor: int):
        super().__init__()
        self.scale_factor = scale_factor
        self.modality_projection = ModalityProjection(vision_dim * scale_factor**2, text_dim)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.modality_projection(pixel_shuffle(features, self.scale_factor))
