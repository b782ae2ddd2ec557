"""LLaVA: a ViT encoder (CLIP or SigLIP), a two-layer projector, and a Llama-family language model.

An image becomes `tokens_per_image` rows in the text model's embedding space:

    pixels [N,3,H,W] -> vision tower -> hidden states of the chosen layers (concatenated on features,
    class token dropped under the "default" strategy) -> projector -> [N, tokens_per_image, text_hidden]

The language model never sees pixels: callers splice those rows into the input embeddings where the
prompt holds the image (`model.vision.get_image_embeddings` wraps them in an MMEmbedding for the
generator), and `forward` is the text model's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from PIL import Image

from engine.config.model import ModelConfig
from engine.errors import ModelLoadError
from engine.models.llava.clip import VisionConfig
from engine.models.llava.projector import LlavaProjector
from engine.models.llava.towers import vision_tower_class
from engine.models.vlm import VisionLanguageModel
from engine.vision.handle import VisionHandle
from engine.vision.layers import read_feature_layers

# transformers' LlavaConfig defaults: a llava-1.5 CLIP ViT-L/14-336 tower when vision_config is absent.
_DEFAULT_VISION = {
    "model_type": "clip_vision_model",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "image_size": 336,
    "patch_size": 14,
}
_DEFAULT_IMAGE_TOKEN_ID = 32000
_STRATEGIES = ("default", "full")


class LlavaForConditionalGeneration(VisionLanguageModel):
    """LLaVA over a paged KV cache (see VisionLanguageModel); `encode_images` turns pixels into image rows.

    Attributes: `image_token_id` (the vocabulary's image placeholder), `tokens_per_image`, `vision` (the
    handle with `get_image_embeddings`; `vision_model` is the exllamav2 name for it).
    """

    architectures = ("LlavaForConditionalGeneration",)

    def __new__(cls, config: ModelConfig, *args: Any, **kwargs: Any):
        # Pixtral-12B is saved as LLaVA with a Pixtral encoder, whose pictures keep their own sizes and are
        # laid out in rows: engine/models/mistral3.py's design, so a class from there serves it (built here,
        # and not an instance of this class, so Python does not run __init__ on it again).
        vision = config.extra.get("vision_config")
        is_pixtral = isinstance(vision, dict) and vision.get("model_type") == "pixtral"
        if cls is LlavaForConditionalGeneration and is_pixtral:
            from engine.models.mistral3.model import PixtralLlavaForConditionalGeneration

            return PixtralLlavaForConditionalGeneration(config, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        extra = config.extra
        self.language_model = self.build_language_model(config)
        vision = extra.get("vision_config") or dict(_DEFAULT_VISION)
        tower_cls = vision_tower_class(vision.get("model_type", "clip_vision_model"))
        vision_config = VisionConfig.from_hf_dict(vision, tower_cls.DEFAULTS)
        self.feature_layers = read_feature_layers(
            extra.get("vision_feature_layer", -2), vision_config.num_hidden_layers
        )
        self.select_strategy = extra.get("vision_feature_select_strategy", "default")
        if self.select_strategy not in _STRATEGIES:
            raise ModelLoadError(
                f"config.json vision_feature_select_strategy is {self.select_strategy!r}; expected one of "
                f"{', '.join(_STRATEGIES)}."
            )
        # Layers after the deepest selected one never influence the image rows, so they are not built.
        self.vision_tower = tower_cls(vision_config, num_layers=max(self.feature_layers), post_layernorm=False)
        self.multi_modal_projector = LlavaProjector(
            vision_config.hidden_size * len(self.feature_layers),
            config.hidden_size,
            act=extra.get("projector_hidden_act", "gelu"),
            bias=bool(extra.get("multimodal_projector_bias", True)),
        )
        self.image_token_id: int = _DEFAULT_IMAGE_TOKEN_ID if config.image_token_id is None else config.image_token_id
        # "default" drops the first position (CLIP's class token; for SigLIP, HF drops a patch all the same).
        self.tokens_per_image: int = self.vision_tower.num_positions - int(self.select_strategy == "default")
        self.vision = LlavaVision(self)

    # --- compute -------------------------------------------------------------------------------------

    @torch.no_grad()
    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Embedding rows [N, tokens_per_image, hidden] for preprocessed `pixel_values` [N, 3, H, W]."""
        if pixel_values.dim() != 4:
            raise ValueError(
                f"pixel_values must be [num_images, channels, height, width], got {list(pixel_values.shape)}"
            )
        states = self.vision_tower.hidden_states(pixel_values.to(self.device))
        features = [states[i] for i in self.feature_layers]
        if self.select_strategy == "default":
            features = [f[:, 1:] for f in features]
        return self.multi_modal_projector(torch.cat(features, dim=-1))


class LlavaVision(VisionHandle):
    """The image side of a loaded LLaVA: preprocessing (from the model folder's preprocessor_config.json),
    `get_image_embeddings` and `count_image_tokens` (every picture takes `tokens_per_image` ids)."""

    def read_processor(self, folder: Path):
        from engine.models.llava.processor import ImageProcessor

        return ImageProcessor.from_folder(folder)

    def embed_picture(self, picture: Image.Image, tokenizer: Any | None) -> torch.Tensor:
        pixels = self.processor(picture)  # [3, H, W] float32
        return self.model.encode_images(pixels.unsqueeze(0))[0]  # [tokens_per_image, hidden]

    def num_image_tokens(self, height: int, width: int) -> int:
        return self.model.tokens_per_image
