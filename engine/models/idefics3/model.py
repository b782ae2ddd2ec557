"""Idefics3 and SmolVLM: a SigLIP-style encoder over image tiles, a pixel-shuffle connector, a Llama text model.

One picture becomes several square tiles plus a global view (processor.py), and its
prompt text interleaves marker tokens with image tokens:

    <fake_token_around_image><row_1_col_1><image>*n<fake_token_around_image><row_1_col_2><image>*n\\n
    \\n<fake_token_around_image><global-img><image>*n<fake_token_around_image>

`Idefics3Vision.get_image_embeddings` returns ONE MMEmbedding per picture whose rows cover that whole text:
marker tokens take their vocabulary embedding, image tokens the connector's rows, in prompt order. So a
picture is still one alias in the prompt and one id run in a job, and `tokenizer.encode(text, embeddings=)`,
the page hashes (same picture -> same ids -> cached pages) and the generator's splicing work unchanged.
The rows equal the input embeddings transformers builds for the same prompt, because the markers'
embeddings do not depend on their position and the run starts and ends on special tokens, which split
the surrounding text the same way in both tokenizations.

SmolVLMForConditionalGeneration is the same network under another name (its checkpoints say "smolvlm" where
Idefics3's say "idefics3"); both are served by this class.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from engine.config.model import ModelConfig
from engine.errors import ModelLoadError
from engine.models.idefics3.connector import Idefics3Connector
from engine.models.idefics3.processor import FAKE_IMAGE_TOKEN, GLOBAL_IMAGE_TOKEN, image_prompt
from engine.models.idefics3.tower import Idefics3VisionTower
from engine.models.llava.clip import VisionConfig
from engine.models.vlm import VisionLanguageModel
from engine.vision.handle import VisionHandle
from engine.vision.layers import config_value

# transformers' Idefics3Config defaults.
_DEFAULT_IMAGE_TOKEN_ID = 128257
_DEFAULT_SCALE_FACTOR = 2


class Idefics3ForConditionalGeneration(VisionLanguageModel):
    """Idefics3 / SmolVLM over a paged KV cache (see VisionLanguageModel); `encode_images` turns tiles into
    image rows.

    Attributes: `image_token_id`, `scale_factor`, `tokens_per_image` (image rows per tile when tiles are the
    encoder's own image_size, transformers' `image_seq_len`; a picture cut into R x C tiles takes R*C+1 such
    runs plus its marker tokens), `vision` (the handle with `get_image_embeddings`; `vision_model` in
    exllamav2's sense is `vision`, while `vision_tower` is the encoder module).
    """

    architectures = ("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration")
    # Every transformers version writes this layout.
    checkpoint_parts = (
        ("model.text_model.", "language_model", "model."),
        ("lm_head.", "language_model", "lm_head."),
        ("model.vision_model.", "vision_tower", ""),
        ("model.connector.", "connector", ""),
    )

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        extra = config.extra
        self.language_model = self.build_language_model(config)
        vision = extra.get("vision_config") or {}
        if not isinstance(vision, dict):
            raise ModelLoadError(f"config.json vision_config must be an object, got {type(vision).__name__}")
        vision_config = VisionConfig.from_hf_dict(vision, Idefics3VisionTower.DEFAULTS)
        self.vision_tower = Idefics3VisionTower(vision_config)
        self.scale_factor: int = config_value(extra, "scale_factor", _DEFAULT_SCALE_FACTOR, int)
        if self.scale_factor < 1:
            raise ModelLoadError(f"config.json scale_factor is {self.scale_factor}; it must be a positive integer.")
        self.connector = Idefics3Connector(vision_config.hidden_size, config.hidden_size, self.scale_factor)
        self.image_token_id: int = _DEFAULT_IMAGE_TOKEN_ID if config.image_token_id is None else config.image_token_id
        self.patch_size: int = vision_config.patch_size
        self.tokens_per_image: int = self.tokens_per_tile(vision_config.image_size)
        self.vision = Idefics3Vision(self)

    def tokens_per_tile(self, tile_size: int) -> int:
        """Image rows of one square tile of `tile_size` pixels: its patches, pixel-shuffled."""
        side = tile_size // self.patch_size
        return side * side // self.scale_factor**2

    @torch.no_grad()
    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Image rows [num_tiles, tokens_per_tile, hidden] for preprocessed tiles [num_tiles, 3, H, W]."""
        if pixel_values.dim() != 4:
            raise ValueError(
                f"pixel_values must be [num_tiles, channels, height, width], got {list(pixel_values.shape)}"
            )
        return self.connector(self.vision_tower(pixel_values.to(self.device)))


class Idefics3Vision(VisionHandle):
    """The image side of a loaded Idefics3 / SmolVLM: tiling (from the folder's preprocessor_config.json),
    `get_image_embeddings` (one MMEmbedding covering a picture's tiles and marker tokens) and
    `count_image_tokens` (the length of that run, from the tile grid and the marker text's tokens)."""

    def read_processor(self, folder: Path):
        from engine.models.idefics3.processor import Idefics3ImageProcessor

        return Idefics3ImageProcessor.from_folder(folder)

    def prompt_ids(self, tokenizer: Any, rows: int, cols: int, tokens_per_tile: int) -> torch.Tensor:
        """Token ids [num_tokens] of one picture's prompt text (markers and image tokens), see `image_prompt`."""
        image_token = tokenizer.id_to_piece(self.model.image_token_id)
        fake_token, global_token = self._marker_tokens()
        if image_token is None or tokenizer.piece_to_id(fake_token) is None:
            raise ValueError(
                f"the tokenizer has no token {fake_token!r} or none with the image token id "
                f"{self.model.image_token_id} (config.json image_token_id); use the model's own tokenizer"
            )
        text = image_prompt(
            rows, cols, tokens_per_tile, image_token=image_token, fake_token=fake_token, global_token=global_token
        )
        ids = tokenizer.encode(text, encode_special_tokens=True)[0]
        expected = (rows * cols + 1) * tokens_per_tile
        found = int((ids == self.model.image_token_id).sum())
        if found != expected:
            raise ValueError(
                f"the image prompt holds {found} image tokens {image_token!r} but the picture has {expected} "
                "image rows; the tokenizer splits the image token, use the model's own tokenizer"
            )
        return ids

    def embed_picture(self, picture: Image.Image, tokenizer: Any | None) -> torch.Tensor:
        split = self.processor(picture)
        features = self.model.encode_images(split.pixel_values)  # [num_tiles, tokens_per_tile, hidden]
        self._check_seq_len(features.shape[1])
        tokenizer = self.model.tokenizer if tokenizer is None else tokenizer
        return self.layout_rows(self.prompt_ids(tokenizer, split.rows, split.cols, features.shape[1]), features)

    def num_image_tokens(self, height: int, width: int) -> int:
        rows, cols = self.processor.tile_grid(height, width)
        tokens_per_tile = self.model.tokens_per_tile(self.processor.tile_size)
        self._check_seq_len(tokens_per_tile)
        return len(self.prompt_ids(self.model.tokenizer, rows, cols, tokens_per_tile))

    def _check_seq_len(self, tokens_per_tile: int) -> None:
        stated = getattr(self.processor, "image_seq_len", None)
        if stated is not None and stated != tokens_per_tile:
            # transformers would write `stated` image tokens per tile and then fail to place the rows.
            raise ValueError(
                f"processor_config.json says image_seq_len={stated}, but the vision tower gives {tokens_per_tile} "
                "rows per tile; the processor config and config.json do not belong together"
            )

    def _marker_tokens(self) -> tuple[str, str]:
        """(fake-token, global-image-token) texts. SmolVLM's processor reads them from the tokenizer config's
        named extra special tokens (falling back to the usual ones); Idefics3's are fixed."""
        named: Any = None
        source = self.model.source_path
        if self.model.config.architecture.startswith("SmolVLM") and source is not None:
            try:
                config = json.loads((Path(source) / "tokenizer_config.json").read_text(encoding="utf-8"))
                named = config.get("extra_special_tokens") if isinstance(config, dict) else None
            except (OSError, ValueError):
                named = None
        named = named if isinstance(named, dict) else {}
        fake, global_ = named.get("fake_image_token"), named.get("global_image_token")
        return (
            fake if isinstance(fake, str) else FAKE_IMAGE_TOKEN,
            global_ if isinstance(global_, str) else GLOBAL_IMAGE_TOKEN,
        )
