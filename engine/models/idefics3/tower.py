"""The Idefics3 / SmolVLM vision encoder: SigLIP whose learned positions stretch over any patch grid.

SigLIP learns one position per cell of a `side x side` grid (side = image_size // patch_size). Idefics3
feeds tiles of the processor's `max_image_size`, which need not match that grid, so each patch takes the
learned position of the grid cell its fractional coordinate falls in (NaViT's bucketing):

    patch (i, j) of an h x w grid -> cell (bucket(i / h), bucket(j / w)) of the learned side x side grid

The processor always cuts full square tiles, so every patch is real: the padded-patch mask transformers
supports for batches of unequal images is never needed here.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from engine.models.llava.clip import VisionConfig
from engine.models.llava.siglip import SiglipVisionTower


class Idefics3VisionTower(SiglipVisionTower):
    """transformers' Idefics3VisionTransformer (SmolVLMVisionTransformer is the same class).

    `forward(pixel_values)` takes [N, 3, H, W] with H and W any multiples of the patch size and returns the
    last hidden state after `post_layernorm`, [N, (H / patch) * (W / patch), hidden].
    """

    model_type: ClassVar[str] = "idefics3_vision"
    # transformers' Idefics3VisionConfig defaults (SmolVLMVisionConfig has the same).
    DEFAULTS: ClassVar[VisionConfig] = VisionConfig(
        model_type="idefics3_vision",
        hidden_size=1152,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=16,
        image_size=224,
        patch_size=32,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-6,
    )

    def embed(self, pixel_values: torch.Tensor) -> torch.Tensor:
        patch = self.config.patch_size
        grid_h, grid_w = pixel_values.shape[-2] // patch, pixel_values.shape[-1] // patch
        if grid_h < 1 or grid_w < 1:
            raise ValueError(
                f"pixel_values are {pixel_values.shape[-2]}x{pixel_values.shape[-1]}, smaller than one "
                f"{patch}x{patch} patch; prepare images with the model's image processor"
            )
        conv = self.embeddings.patch_embedding
        x = conv(pixel_values.to(conv.weight.dtype)).flatten(2).transpose(1, 2)  # [N, grid_h * grid_w, hidden]
        return x + self.embeddings.position_embedding(self.position_ids(grid_h, grid_w, x.device))

    def position_ids(self, grid_h: int, grid_w: int, device: torch.device) -> torch.Tensor:
        """Learned-position index [grid_h * grid_w] of each patch of a grid_h x grid_w image, row-major."""
        side = self.config.image_size // self.config.patch_size
        # Same float32 arithmetic as transformers (1/n as a float32 division, the same arange of bucket
        # edges), so a coordinate that lands on an edge falls into the same bucket.
        edges = torch.arange(1 / side, 1.0, 1 / side, device=device)

        def buckets(n: int) -> torch.Tensor:
            step = 1.0 / torch.tensor(n, device=device)
            coords = torch.arange(n, device=device, dtype=torch.float32) * step
            return torch.bucketize(coords.clamp(max=1.0 - 1e-6), edges, right=True)

        return (buckets(grid_h)[:, None] * side + buckets(grid_w)[None, :]).flatten()
