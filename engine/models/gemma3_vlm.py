"""Gemma 3 vision-language model: a SigLIP encoder, average pooling to a fixed number of image tokens, a
normed linear projector, and the Gemma 3 text model.

An image becomes a run of `tokens_per_image` rows laid out as the reference's processor lays out its ids:

    row 0                 <start_of_image>   (the text embedding of that token)
    rows 1 .. mm_tokens   the image: pixels -> SigLIP -> avg pool -> norm -> projection
    last row              <end_of_image>     (the text embedding of that token)

The processor also puts a blank line ("\\n\\n") before and after the run; that stays text, so it merges
with its neighbours into the same tokens as the reference's (`Gemma3ImageEmbedding.prompt_text`).

The image rows attend to each other in both directions during prefill, as in transformers (its
token_type_ids); every other token, and every row during decode, is causal. The generator hands the step's
token ids to the forward in `batch.token_ids`, from which the image rows and their run ends are found.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch

from engine.config import ModelConfig
from engine.errors import ModelLoadError, UnsupportedArchitectureError
from engine.models.base import Model
from engine.models.batch import Batch
from engine.models.gemma3 import Gemma3ForCausalLM, Gemma3TextSettings
from engine.models.llava import LlavaVision
from engine.models.rope import RotaryTable
from engine.models.vision import load_checked
from engine.models.vision.clip import VisionConfig
from engine.models.vision.gemma3_projector import Gemma3Projector
from engine.models.vision.siglip import SiglipVisionTower
from engine.vision.embedding import FIRST_MM_ID, MAX_TOKENS_PER_IMAGE, MMEmbedding

log = logging.getLogger(__name__)

# transformers' Gemma3Config defaults.
_DEFAULT_MM_TOKENS = 256
_DEFAULT_BOI_ID = 255_999
_DEFAULT_EOI_ID = 256_000
_DEFAULT_IMAGE_ID = 262_144

# Checkpoint prefixes -> (our part, prefix inside that part): the original layout (which transformers 5's
# save_pretrained writes back) and the transformers 4.5x one with everything under "model.".
_CHECKPOINT_PARTS = (
    ("language_model.model.", "language_model", "model."),
    ("model.language_model.", "language_model", "model."),
    ("language_model.lm_head.", "language_model", "lm_head."),
    ("lm_head.", "language_model", "lm_head."),
    ("vision_tower.", "vision_tower", ""),
    ("model.vision_tower.", "vision_tower", ""),
    ("multi_modal_projector.", "multi_modal_projector", ""),
    ("model.multi_modal_projector.", "multi_modal_projector", ""),
)


class Gemma3ImageEmbedding(MMEmbedding):
    """An MMEmbedding whose rows include <start_of_image> and <end_of_image>; in a rendered chat it stands
    between blank lines, as Gemma 3's processor writes it (`prompt_text`, used by render_with_images)."""

    @property
    def prompt_text(self) -> str:
        return f"\n\n{self.text_alias}\n\n"


class Gemma3ForConditionalGeneration(Model):
    """Gemma 3 with images over a paged KV cache (transformers' Gemma3ForConditionalGeneration).

    `forward(inputs, positions, batch)` is the text model's, with the image rows of `batch.token_ids`
    attending within their image both ways; `encode_images` turns pixels into image rows, and `vision`
    (also `vision_model`) is the handle with `get_image_embeddings`.
    """

    architectures = ("Gemma3ForConditionalGeneration",)

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        extra = config.extra
        if config.text_architecture != "Gemma3ForCausalLM":
            raise UnsupportedArchitectureError(
                f"config.json text_config describes {config.text_architecture!r}, but Gemma 3's language model is "
                "gemma3_text; the config is not a Gemma 3 checkpoint's."
            )
        settings = Gemma3TextSettings.from_hf_dict(extra.get("text_config") or {}, config.num_hidden_layers)
        # transformers soft-caps logits in Gemma3ForCausalLM only, not in this class: follow it.
        text_config = replace(config, architecture="Gemma3ForCausalLM", text_architecture=None)
        self.language_model = Gemma3ForCausalLM(text_config, replace(settings, final_logit_softcapping=None))

        vision = extra.get("vision_config") or {}
        model_type = vision.get("model_type", SiglipVisionTower.model_type)
        if model_type != SiglipVisionTower.model_type:
            raise UnsupportedArchitectureError(
                f"Gemma 3's vision_config model_type is {model_type!r}; Tandem runs Gemma 3 with its SigLIP "
                "encoder (siglip_vision_model) only."
            )
        vision_config = VisionConfig.from_hf_dict(vision, SiglipVisionTower.DEFAULTS)
        self.vision_tower = SiglipVisionTower(vision_config)
        self.mm_tokens_per_image = _int(extra, "mm_tokens_per_image", _DEFAULT_MM_TOKENS)
        self.multi_modal_projector = Gemma3Projector(vision_config, config.hidden_size, self.mm_tokens_per_image)
        self.image_token_id = _DEFAULT_IMAGE_ID if config.image_token_id is None else config.image_token_id
        self.boi_token_id = _int(extra, "boi_token_index", _int(extra, "boi_token_id", _DEFAULT_BOI_ID))
        self.eoi_token_id = _int(extra, "eoi_token_index", _int(extra, "eoi_token_id", _DEFAULT_EOI_ID))
        # Ids per image in a prompt: the image rows between <start_of_image> and <end_of_image>.
        self.tokens_per_image: int = self.mm_tokens_per_image + 2
        self.vision = Gemma3Vision(self)

    @property
    def vision_model(self) -> Gemma3Vision:
        """exllamav2's name for `vision`."""
        return self.vision

    @property
    def rope(self) -> RotaryTable:
        return self.language_model.rope

    # --- weights -------------------------------------------------------------------------------------

    def load_tensors(self, tensors: dict[str, Any]) -> None:
        """Split checkpoint tensors by part (either naming layout) and let each part load and check its own."""
        parts: dict[str, dict[str, Any]] = {"language_model": {}, "vision_tower": {}, "multi_modal_projector": {}}
        for name, value in tensors.items():
            for prefix, part, inner in _CHECKPOINT_PARTS:
                if name.startswith(prefix):
                    parts[part][inner + name[len(prefix) :]] = value
                    break
        self.language_model.load_tensors(parts["language_model"])
        self.vision_tower.load_tensors(parts["vision_tower"])
        load_checked(self.multi_modal_projector, parts["multi_modal_projector"], "Gemma 3 projector")

    def tie_weights(self) -> None:
        self.language_model.tie_weights()

    # --- compute -------------------------------------------------------------------------------------

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Scaled text token embeddings [num_tokens, hidden] for vocabulary ids."""
        return self.language_model.embed(input_ids)

    @torch.no_grad()
    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Image rows [N, mm_tokens_per_image, hidden] for preprocessed `pixel_values` [N, 3, H, W]
        (without the <start_of_image> / <end_of_image> rows)."""
        if pixel_values.dim() != 4:
            raise ValueError(
                f"pixel_values must be [num_images, channels, height, width], got {list(pixel_values.shape)}"
            )
        return self.multi_modal_projector(self.vision_tower(pixel_values.to(self.device)))

    @torch.no_grad()
    def image_rows(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The whole run of one image's rows [tokens_per_image, hidden] for `pixel_values` [3, H, W]."""
        ids = torch.tensor([self.boi_token_id, self.eoi_token_id], device=self.device)
        boi, eoi = self.embed(ids).split(1)
        return torch.cat([boi, self.encode_images(pixel_values[None])[0], eoi])

    def forward(self, inputs: torch.Tensor, positions: torch.Tensor, batch: Batch) -> torch.Tensor:
        key_ends = self.image_key_ends(batch, positions) if inputs.is_floating_point() else None
        return self.language_model.run(inputs, positions, batch, key_ends)

    def image_key_ends(self, batch: Batch, positions: torch.Tensor) -> torch.Tensor | None:
        """Per new token, the end (exclusive) of the keys it attends: its own position + 1, or for an image row
        the end of its image's rows. None when the batch holds no image rows (or no `token_ids`: causal)."""
        ids = batch.token_ids
        if ids is None or max(batch.query_lens) == 1:
            return None  # one new token per sequence (decode) has nothing ahead to see; no device sync then
        # An image's ids are first_id + row with first_id a multiple of MAX_TOKENS_PER_IMAGE above FIRST_MM_ID
        # (engine.vision.embedding), so the row is known even when a chunk starts inside the image.
        row = (ids - FIRST_MM_ID) % MAX_TOKENS_PER_IMAGE
        is_image = (ids >= FIRST_MM_ID) & (row >= 1) & (row <= self.mm_tokens_per_image)
        ahead = torch.where(is_image, self.mm_tokens_per_image - row, 0)  # later rows of the same image
        key_ends = positions + 1 + ahead
        query_lens = torch.tensor(batch.query_lens, device=ids.device)
        seq_ends = torch.repeat_interleave(batch.seq_lens, query_lens)
        has_image, cut = torch.stack([ahead.any(), (key_ends > seq_ends).any()]).tolist()  # one sync
        if cut:
            raise ValueError(
                "a prefill chunk ends inside an image: Gemma 3's image rows attend to each other, so all of an "
                "image's ids must be in one forward (the generator keeps image runs whole)"
            )
        return key_ends if has_image else None


class Gemma3Vision(LlavaVision):
    """The image side of a loaded Gemma 3: preprocessing from the folder's processor config, the chat
    template's placeholder, and `get_image_embeddings` (exllamav2's call shape)."""

    @property
    def image_placeholder(self) -> str | None:
        """The text Gemma 3's chat template writes for an image ("<start_of_image>"), or None without a
        usable tokenizer."""
        try:
            tokenizer = self.model.tokenizer
        except (AttributeError, ModelLoadError):
            return None
        return tokenizer.id_to_piece(self.model.boi_token_id)

    def get_image_embeddings(
        self,
        model: object | None = None,
        tokenizer: object | None = None,
        image: Any = None,
        text_alias: str | None = None,
    ) -> Gemma3ImageEmbedding:
        """Embed one image (a PIL image, a path or encoded bytes) as its run of rows, <start_of_image> and
        <end_of_image> included. `model` and `tokenizer` are accepted for exllamav2's call shape."""
        if image is None:
            raise ValueError("get_image_embeddings needs image= (a PIL image, a file path or image bytes)")
        from engine.vision.image import image_content_hash, load_image

        picture = load_image(image)
        rows = self.model.image_rows(self.processor(picture))
        return Gemma3ImageEmbedding(rows, image_hash=image_content_hash(picture), text_alias=text_alias)


def _int(d: dict[str, Any], key: str, default: int) -> int:
    value = d.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelLoadError(f"config.json {key} must be an integer, got {value!r}")
    return value
