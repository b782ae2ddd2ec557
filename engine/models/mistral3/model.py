"""Mistral 3 (Mistral Small 3.1 and kin): a Pixtral encoder, a patch-merging projector, a Mistral text model.

One picture, kept at (nearly) its own size, becomes a grid of image tokens laid out row by row:

    pixels [3, H, W] -> Pixtral encoder (patch p) -> RMSNorm -> patch merger (each m x m block of patches
    -> one row, m = spatial_merge_size) -> linear -> act -> linear -> rows x cols image rows, rows = H/(p*m)

and the prompt holds `[IMG]*cols [IMG_BREAK]` per row, the last break being `[IMG_END]`
(processor.py). `PixtralVision.get_image_embeddings` returns ONE MMEmbedding per picture
whose rows cover that whole layout: break and end tokens take their vocabulary embedding, image tokens the
projector's rows. So a picture is one alias in the prompt and one id run in a job, and the page hashes (same
picture -> same ids) and the generator's splicing work unchanged. The rows equal the input embeddings
transformers builds, since those token embeddings do not depend on position and the run starts and ends on
special tokens, which split the surrounding text the same way in both tokenizations.

Pixtral-12B is saved as LlavaForConditionalGeneration with a Pixtral encoder: the same design without the
merger or norm, LLaVA's projector instead (`PixtralLlavaForConditionalGeneration`, which llava.py hands such
configs to).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import nn

from engine.config.model import ModelConfig
from engine.errors import ModelLoadError
from engine.models.layers import RMSNorm
from engine.models.linear import Linear
from engine.models.llava.projector import LlavaProjector
from engine.models.mistral3.pixtral import PixtralVisionConfig, PixtralVisionTower
from engine.models.vlm import VisionLanguageModel
from engine.vision.handle import VisionHandle
from engine.vision.layers import activation, config_value, read_feature_layers

# transformers' Mistral3Config builds this encoder when config.json leaves vision_config out (a partial one
# takes PixtralVisionConfig's own defaults instead). Its text defaults are in engine/config/families.py.
_MISTRAL3_VISION = PixtralVisionConfig(patch_size=14, image_size=1540)


class PatchMerger(nn.Module):
    """Each m x m block of an image's patch grid -> one vector (the block's m*m patches concatenated
    channel-major, as torch's unfold orders them) -> a learned linear map back to the encoder width."""

    def __init__(self, hidden_size: int, merge_size: int):
        super().__init__()
        self.merge_size = merge_size
        self.merging_layer = Linear(hidden_size * merge_size**2, hidden_size, bias=False)

    def forward(self, features: torch.Tensor, grids: Sequence[tuple[int, int]]) -> torch.Tensor:
        """[sum(rows * cols), hidden] for patches [total_patches, hidden] of images with these patch grids;
        an image's rows = grid rows // m, cols = grid cols // m (a partial block at the edge is dropped)."""
        m, hidden = self.merge_size, features.shape[-1]
        merged = []
        for image, (h, w) in zip(features.split([h * w for h, w in grids]), grids):
            grid = image.view(h, w, hidden)[: h - h % m, : w - w % m]
            # [rows, cols, hidden, m, m]: per block, channel by channel, its m x m patches row by row
            blocks = grid.reshape(h // m, m, w // m, m, hidden).permute(0, 2, 4, 1, 3)
            merged.append(blocks.reshape(-1, hidden * m * m))
        return self.merging_layer(torch.cat(merged))


class Mistral3Projector(nn.Module):
    """RMSNorm -> patch merger -> linear_1 -> act -> linear_2, from encoder width to the text model's."""

    def __init__(self, vision_dim: int, text_dim: int, merge_size: int, eps: float, act: str, bias: bool):
        super().__init__()
        self.norm = RMSNorm(vision_dim, eps)
        self.patch_merger = PatchMerger(vision_dim, merge_size)
        self.linear_1 = Linear(vision_dim, text_dim, bias=bias)
        self.act = activation(act, "projector_hidden_act")
        self.linear_2 = Linear(text_dim, text_dim, bias=bias)

    def forward(self, features: torch.Tensor, grids: Sequence[tuple[int, int]]) -> torch.Tensor:
        merged = self.patch_merger(self.norm(features)[0], grids)
        return self.linear_2(self.act(self.linear_1(merged)))


class Mistral3ForConditionalGeneration(VisionLanguageModel):
    """Mistral 3 over a paged KV cache (see VisionLanguageModel); `encode_images` turns preprocessed pictures
    into image rows.

    Attributes: `image_token_id`, `merge_size`, `token_patch` (pixels per image token side: encoder patch times
    merge size), `tokens_per_image` (the most ids a picture can take, a square at the encoder's image_size;
    pictures take rows * (cols + 1)), `vision` (the handle with `get_image_embeddings`; also `vision_model`).
    """

    architectures = ("Mistral3ForConditionalGeneration",)
    default_text_architecture = "MistralForCausalLM"
    default_feature_layer: Any = -1
    default_image_token_id = 10

    def __init__(self, config: ModelConfig):
        self.check_config(config)
        super().__init__(config)
        extra = config.extra
        self.language_model = self.build_language_model(config)
        vision = extra.get("vision_config")
        if vision is None:
            vision = {"model_type": "pixtral", **vars(_MISTRAL3_VISION)}
        if not isinstance(vision, dict):
            raise ModelLoadError(f"config.json vision_config must be an object, got {type(vision).__name__}")
        vision_config = PixtralVisionConfig.from_hf_dict(vision)
        self.feature_layers = read_feature_layers(
            extra.get("vision_feature_layer", self.default_feature_layer), vision_config.num_hidden_layers
        )
        self.merge_size = self.read_merge_size(extra)
        # Layers after the deepest selected one never influence the image rows, so they are not built.
        self.vision_tower = PixtralVisionTower(vision_config, num_layers=max(self.feature_layers))
        self.multi_modal_projector = self.build_projector(config, vision_config)
        self.image_token_id: int = (
            self.default_image_token_id if config.image_token_id is None else config.image_token_id
        )
        self.token_patch: int = vision_config.patch_size * self.merge_size
        side = max(vision_config.image_size // self.token_patch, 1)
        self.tokens_per_image: int = side * (side + 1)
        self.vision = PixtralVision(self)

    # --- what differs from Pixtral-12B (PixtralLlavaForConditionalGeneration) ---------------------------------

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        """Raise ModelLoadError for a config this design cannot run (none of Mistral 3's)."""

    @staticmethod
    def read_merge_size(extra: dict[str, Any]) -> int:
        merge = config_value(extra, "spatial_merge_size", 2, int)
        if merge < 1:
            raise ModelLoadError(f"config.json spatial_merge_size is {merge}; it must be a positive integer.")
        return merge

    def build_projector(self, config: ModelConfig, vision_config: PixtralVisionConfig) -> nn.Module:
        if len(self.feature_layers) != 1:
            # transformers' projector norm is as wide as one layer, so a list of layers cannot run there either.
            raise ModelLoadError(
                f"config.json vision_feature_layer {config.extra.get('vision_feature_layer')!r} names several "
                "layers; Mistral 3's projector takes exactly one."
            )
        return Mistral3Projector(
            vision_config.hidden_size,
            config.hidden_size,
            self.merge_size,
            config.rms_norm_eps,
            act=config.extra.get("projector_hidden_act", "gelu"),
            bias=bool(config.extra.get("multimodal_projector_bias", False)),
        )

    def project(self, features: torch.Tensor, grids: Sequence[tuple[int, int]]) -> torch.Tensor:
        """Image rows [sum(rows * cols), text_hidden] for encoder features [total_patches, vision_dim]."""
        return self.multi_modal_projector(features, grids)

    # --- compute -------------------------------------------------------------------------------------

    @torch.no_grad()
    def encode_images(self, images: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Per preprocessed picture [3, H, W] (sizes may differ), its image rows [rows * cols, hidden] in row
        order, rows = H // token_patch and cols = W // token_patch."""
        if isinstance(images, torch.Tensor) and images.dim() == 3:
            raise ValueError("encode_images takes a list of images [3, H, W] (or a [N, 3, H, W] tensor), not one")
        states = self.vision_tower.hidden_states([image.to(self.device) for image in images])
        features = torch.cat([states[i] for i in self.feature_layers], dim=-1)  # [total_patches, dim]
        grids = [self.vision_tower.grid(image) for image in images]
        rows = self.project(features, grids)
        m = self.merge_size
        return list(rows.split([(h // m) * (w // m) for h, w in grids]))


class PixtralLlavaForConditionalGeneration(Mistral3ForConditionalGeneration):
    """Pixtral-12B: LlavaForConditionalGeneration with a Pixtral encoder. Mistral 3's design without the norm and
    patch merger; LLaVA's two-layer projector (over one or several encoder layers) and LLaVA's defaults.

    Not registered itself: `LlavaForConditionalGeneration(config)` returns one when config.json's vision_config
    is a Pixtral one, so `config.architecture` stays "LlavaForConditionalGeneration".
    """

    architectures = ()
    default_feature_layer = -2
    default_image_token_id = 32000

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        """Refuse a feature strategy that drops a patch (LLaVA's defaults come from engine/config/families.py)."""
        strategy = config.extra.get("vision_feature_select_strategy", "default")
        if strategy != "full":
            # "default" drops the first token of the whole multi-image sequence (CLIP's class token elsewhere),
            # which leaves one image row fewer than the prompt's image tokens; transformers fails there too.
            raise ModelLoadError(
                f"config.json vision_feature_select_strategy is {strategy!r}; a LLaVA with a Pixtral encoder "
                "keeps every patch, so it must be 'full' (as Pixtral-12B's config.json says)."
            )

    @staticmethod
    def read_merge_size(extra: dict[str, Any]) -> int:
        return 1

    def build_projector(self, config: ModelConfig, vision_config: PixtralVisionConfig) -> nn.Module:
        return LlavaProjector(
            vision_config.hidden_size * len(self.feature_layers),
            config.hidden_size,
            act=config.extra.get("projector_hidden_act", "gelu"),
            bias=bool(config.extra.get("multimodal_projector_bias", True)),
        )

    def project(self, features: torch.Tensor, grids: Sequence[tuple[int, int]]) -> torch.Tensor:
        return self.multi_modal_projector(features)


class PixtralVision(VisionHandle):
    """The image side of a loaded Pixtral-family model: preprocessing (from the model folder),
    `get_image_embeddings` (one MMEmbedding covering a picture's image, break and end tokens) and
    `count_image_tokens` (rows * (cols + 1) of its resized token grid)."""

    def read_processor(self, folder: Path):
        from engine.models.mistral3.processor import PixtralImageProcessor

        return PixtralImageProcessor.from_folder(folder, patch_size=self.model.token_patch)

    def prompt_ids(self, tokenizer: Any, rows: int, cols: int) -> torch.Tensor:
        """Token ids [rows * (cols + 1)] of one picture's layout (see processor.py)."""
        from engine.models.mistral3.processor import image_layout

        processor = self.processor
        ids = [tokenizer.piece_to_id(t) for t in (processor.image_break_token, processor.image_end_token)]
        if None in ids or tokenizer.id_to_piece(self.model.image_token_id) is None:
            raise ValueError(
                f"the tokenizer has no token {processor.image_break_token!r} or {processor.image_end_token!r}, or "
                f"none with the image token id {self.model.image_token_id} (config.json image_token_index); use "
                "the model's own tokenizer"
            )
        return image_layout(rows, cols, self.model.image_token_id, ids[0], ids[1])

    def embed_picture(self, picture: Image.Image, tokenizer: Any | None) -> torch.Tensor:
        tokenizer = self.model.tokenizer if tokenizer is None else tokenizer
        self._check_patch()
        pixels = self.processor(picture)  # [3, H, W] float32
        features = self.model.encode_images([pixels])[0]  # [rows * cols, hidden]
        rows, cols = self._token_grid(pixels.shape[-2], pixels.shape[-1])
        return self.layout_rows(self.prompt_ids(tokenizer, rows, cols), features)

    def num_image_tokens(self, height: int, width: int) -> int:
        self._check_patch()
        rows, cols = self._token_grid(*self.processor.output_hw(height, width))
        return rows * (cols + 1)

    def _token_grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, cols) of image tokens of a preprocessed height x width picture."""
        return height // self.model.token_patch, width // self.model.token_patch

    def _check_patch(self) -> None:
        stated = getattr(self.processor, "stated_patch_size", None)
        if stated is not None and stated != self.model.token_patch:
            # transformers would resize to `stated` and then write a token grid the model cannot fill.
            raise ValueError(
                f"processor_config.json's patch_size x spatial_merge_size is {stated}, but config.json gives image "
                f"tokens of {self.model.token_patch} pixels; the processor config and config.json do not belong "
                "together"
            )
