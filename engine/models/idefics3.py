"""Idefics3 and SmolVLM: a SigLIP-style encoder over image tiles, a pixel-shuffle connector, a Llama text model.

One picture becomes several square tiles plus a global view (engine/vision/idefics3_processor.py), and its
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
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from engine.config import ModelConfig
from engine.errors import ModelLoadError, UnsupportedArchitectureError
from engine.models.base import Model
from engine.models.batch import Batch
from engine.models.rope import RotaryTable
from engine.models.vision import config_value, load_checked
from engine.models.vision.clip import VisionConfig
from engine.models.vision.handle import VisionHandle
from engine.models.vision.idefics3_connector import Idefics3Connector
from engine.models.vision.idefics3_vision import Idefics3VisionTower
from engine.vision.embedding import MMEmbedding
from engine.vision.idefics3_processor import FAKE_IMAGE_TOKEN, GLOBAL_IMAGE_TOKEN, image_prompt

log = logging.getLogger(__name__)

# transformers' Idefics3Config defaults.
_DEFAULT_IMAGE_TOKEN_ID = 128257
_DEFAULT_SCALE_FACTOR = 2
# transformers builds an absent text_config as Llama with this norm epsilon (Llama's own default is 1e-6).
_DEFAULT_TEXT_RMS_NORM_EPS = 1e-5

# Checkpoint prefixes -> (our part, prefix inside that part). Every transformers version writes this layout.
_CHECKPOINT_PARTS = (
    ("model.text_model.", "language_model", "model."),
    ("lm_head.", "language_model", "lm_head."),
    ("model.vision_model.", "vision_tower", ""),
    ("model.connector.", "connector", ""),
)


class Idefics3ForConditionalGeneration(Model):
    """Idefics3 / SmolVLM over a paged KV cache. `forward(inputs, positions, batch)` is the text model's
    (inputs may be embeddings with image rows spliced in); `encode_images` turns tiles into image rows.

    Attributes: `image_token_id`, `scale_factor`, `tokens_per_image` (image rows per tile when tiles are the
    encoder's own image_size, transformers' `image_seq_len`; a picture cut into R x C tiles takes R*C+1 such
    runs plus its marker tokens), `vision` (the handle with `get_image_embeddings`; `vision_model` in
    exllamav2's sense is `vision`, while `vision_tower` is the encoder module).
    """

    architectures = ("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration")

    def __init__(self, config: ModelConfig):
        extra = config.extra
        if extra.get("text_config") is None:
            config = replace(config, rms_norm_eps=_DEFAULT_TEXT_RMS_NORM_EPS)
        super().__init__(config)
        self.language_model = _language_model(config)
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
        grid = vision_config.image_size // vision_config.patch_size
        self.tokens_per_image: int = grid * grid // self.scale_factor**2
        self.vision = Idefics3Vision(self)

    @property
    def vision_model(self) -> Idefics3Vision:
        """exllamav2's name for `vision`."""
        return self.vision

    @property
    def rope(self) -> RotaryTable:
        return self.language_model.rope

    # --- weights -------------------------------------------------------------------------------------

    def load_tensors(self, tensors: dict[str, Any]) -> None:
        """Split checkpoint tensors by part and let each part load and check its own."""
        parts: dict[str, dict[str, Any]] = {"language_model": {}, "vision_tower": {}, "connector": {}}
        ignored = 0
        for name, value in tensors.items():
            for prefix, part, inner in _CHECKPOINT_PARTS:
                if name.startswith(prefix):
                    parts[part][inner + name[len(prefix) :]] = value
                    break
            else:
                ignored += 1
        if ignored:
            log.debug("ignored %d checkpoint tensors that belong to no Idefics3 part", ignored)
        self.language_model.load_tensors(parts["language_model"])
        self.vision_tower.load_tensors(parts["vision_tower"])
        load_checked(self.connector, parts["connector"], "Idefics3 connector")

    def tie_weights(self) -> None:
        self.language_model.tie_weights()

    # --- compute -------------------------------------------------------------------------------------

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Text token embeddings [num_tokens, hidden] for vocabulary ids."""
        return self.language_model.embed(input_ids)

    @torch.no_grad()
    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Image rows [num_tiles, tokens_per_tile, hidden] for preprocessed tiles [num_tiles, 3, H, W]."""
        if pixel_values.dim() != 4:
            raise ValueError(
                f"pixel_values must be [num_tiles, channels, height, width], got {list(pixel_values.shape)}"
            )
        return self.connector(self.vision_tower(pixel_values.to(self.device)))

    def forward(self, inputs: torch.Tensor, positions: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.language_model(inputs, positions, batch)


class Idefics3Vision(VisionHandle):
    """The image side of a loaded Idefics3 / SmolVLM: tiling (from the folder's preprocessor_config.json) and
    `get_image_embeddings`, shaped like exllamav2's vision model so code written for it runs."""

    def read_processor(self, folder: Path):
        from engine.vision.idefics3_processor import Idefics3ImageProcessor

        return Idefics3ImageProcessor.from_folder(folder)

    @property
    def image_placeholder(self) -> str | None:
        """The tokenizer's text for the image token ("<image>"), or None without a usable tokenizer."""
        try:
            tokenizer = self.model.tokenizer
        except (AttributeError, ModelLoadError):
            return None
        return tokenizer.id_to_piece(self.model.image_token_id)

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

    def get_image_embeddings(
        self,
        model: object | None = None,
        tokenizer: object | None = None,
        image: Any = None,
        text_alias: str | None = None,
    ) -> MMEmbedding:
        """Embed one image (a PIL image, a path or encoded bytes) as an MMEmbedding whose rows cover its whole
        prompt text (marker tokens and tiles).

        `model` is accepted for exllamav2's call shape (this handle already belongs to its model);
        `tokenizer` tokenizes the marker text, the model's own tokenizer when None.
        """
        if image is None:
            raise ValueError("get_image_embeddings needs image= (a PIL image, a file path or image bytes)")
        from engine.vision.image import image_content_hash, load_image

        tokenizer = self.model.tokenizer if tokenizer is None else tokenizer
        picture = load_image(image)
        split = self.processor(picture)
        features = self.model.encode_images(split.pixel_values)  # [num_tiles, tokens_per_tile, hidden]
        self._check_seq_len(features.shape[1])
        ids = self.prompt_ids(tokenizer, split.rows, split.cols, features.shape[1]).to(self.model.device)
        is_image = ids == self.model.image_token_id
        with torch.no_grad():
            rows = self.model.embed(torch.where(is_image, torch.zeros_like(ids), ids))  # [num_tokens, hidden]
        rows[is_image] = features.reshape(-1, features.shape[-1]).to(rows.dtype)
        return MMEmbedding(rows, image_hash=image_content_hash(picture), text_alias=text_alias)

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


def _language_model(config: ModelConfig) -> Model:
    from engine.models.registry import model_class  # the registry imports this module

    arch = config.text_architecture or "LlamaForCausalLM"
    try:
        cls = model_class(arch)
    except UnsupportedArchitectureError as e:
        raise UnsupportedArchitectureError(
            f"the language model of this {config.architecture} (text_config): {e}"
        ) from None
    if cls is Idefics3ForConditionalGeneration:
        raise UnsupportedArchitectureError(
            f"config.json text_config names {config.architecture} itself as the text model"
        )
    return cls(replace(config, architecture=arch, text_architecture=None))
