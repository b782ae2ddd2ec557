"""SigLIP vision encoder: CLIP's encoder without a class token or pre-norm, with a biased patch projection.

SiglipVisionModel also has an attention-pooling head; vision-language models read hidden states, so the
head is not built and its tensors are ignored at load.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from engine.models.llava.clip import ClipVisionTower, VisionConfig


class SiglipVisionTower(ClipVisionTower):
    """SigLIP's vision transformer (transformers' SiglipVisionModel without the pooling head).

    `hidden_states` index 0 is the patch embeddings, index i the output of layer i; `forward` returns the
    last hidden state after `post_layernorm`, as HF's `last_hidden_state`.
    """

    model_type: ClassVar[str] = "siglip_vision_model"
    has_class_token: ClassVar[bool] = False
    has_patch_bias: ClassVar[bool] = True
    # transformers' SiglipVisionConfig defaults.
    DEFAULTS: ClassVar[VisionConfig] = VisionConfig(
        model_type="siglip_vision_model",
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        image_size=224,
        patch_size=16,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-6,
    )

    def build_pre_norm(self, config: VisionConfig) -> None:
        pass  # SigLIP feeds the embeddings to the first layer as they are

    def embed(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.embeddings(pixel_values)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The last hidden state after the final norm, [num_images, num_positions, hidden]."""
        if self.post_layernorm is None:
            raise RuntimeError("this tower was built with post_layernorm=False; read hidden_states() instead")
        return self.post_layernorm(self.hidden_states(pixel_values)[-1])
