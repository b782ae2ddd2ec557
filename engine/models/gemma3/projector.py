"""Gemma 3's multimodal projector: SigLIP patch features pooled to a fixed token grid, normed, projected.

[N, P*P, C] patches (row-major grid) -> [N, C, P, P] -> average pool, kernel k = P / T
-> [N, T*T, C] -> RMSNorm (1 + weight) -> @ mm_input_projection_weight [C, text_hidden]
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ModelLoadError
from engine.models.gemma3.text import GemmaRMSNorm
from engine.models.llava.clip import VisionConfig


class Gemma3Projector(nn.Module):
    """Pools each image's patch grid to `mm_tokens` tokens (a square grid) and maps them to `text_dim`."""

    def __init__(self, vision: VisionConfig, text_dim: int, mm_tokens: int):
        super().__init__()
        self.patches_per_side = vision.image_size // vision.patch_size
        self.tokens_per_side = math.isqrt(mm_tokens)
        if self.tokens_per_side**2 != mm_tokens or self.patches_per_side % self.tokens_per_side:
            raise ModelLoadError(
                f"config.json mm_tokens_per_image={mm_tokens} must be a square number whose side divides the "
                f"{self.patches_per_side} patches per side of the image (vision_config image_size "
                f"{vision.image_size} / patch_size {vision.patch_size})."
            )
        self.kernel = self.patches_per_side // self.tokens_per_side
        self.mm_input_projection_weight = nn.Parameter(torch.zeros(vision.hidden_size, text_dim))
        self.mm_soft_emb_norm = GemmaRMSNorm(vision.hidden_size, vision.layer_norm_eps)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[N, patches, vision_hidden] -> [N, mm_tokens, text_dim] in the features' dtype."""
        n, _, channels = features.shape
        side = self.patches_per_side
        grid = features.transpose(1, 2).reshape(n, channels, side, side)
        pooled = F.avg_pool2d(grid, kernel_size=self.kernel, stride=self.kernel)  # [N, C, T, T]
        tokens = self.mm_soft_emb_norm(pooled.flatten(2).transpose(1, 2))  # [N, T*T, C]
        return torch.matmul(tokens, self.mm_input_projection_weight).to(features.dtype)
