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

from dataclasses import replace
from typing import Any

import torch
from PIL import Image

from engine.config.model import ModelConfig
from engine.errors import UnsupportedArchitectureError
from engine.models.batch import Batch
from engine.models.gemma3.projector import Gemma3Projector
from engine.models.gemma3.text import Gemma3TextSettings
from engine.models.llava.clip import VisionConfig
from engine.models.llava.model import LlavaVision
from engine.models.llava.siglip import SiglipVisionTower
from engine.models.vlm import VisionLanguageModel
from engine.vision.embedding import FIRST_MM_ID, MAX_TOKENS_PER_IMAGE, MMEmbedding
from engine.vision.layers import config_int

# transformers' Gemma3Config defaults.
_DEFAULT_MM_TOKENS = 256
_DEFAULT_BOI_ID = 255_999
_DEFAULT_EOI_ID = 256_000
_DEFAULT_IMAGE_ID = 262_144


class Gemma3ImageEmbedding(MMEmbedding):
    """An MMEmbedding whose rows include <start_of_image> and <end_of_image>; in a rendered chat it stands
    between blank lines, as Gemma 3's processor writes it (`prompt_text`, used by render_with_images)."""

    @property
    def prompt_text(self) -> str:
        return f"\n\n{self.text_alias}\n\n"


class Gemma3ForConditionalGeneration(VisionLanguageModel):
    """Gemma 3 with images over a paged KV cache (transformers' Gemma3ForConditionalGeneration).

    `forward(inputs, positions, batch)` is the text model's, with the image rows of `batch.token_ids`
    attending within their image both ways; `encode_images` turns pixels into image rows, and `vision`
    (also `vision_model`) is the handle with `get_image_embeddings`.
    """

    architectures = ("Gemma3ForConditionalGeneration",)
    default_text_architecture = "Gemma3ForCausalLM"
    text_architectures = ("Gemma3ForCausalLM",)

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        extra = config.extra
        settings = Gemma3TextSettings.from_hf_dict(extra.get("text_config") or {}, config.num_hidden_layers)
        # transformers soft-caps logits in Gemma3ForCausalLM only, not in this class: follow it.
        self.language_model = self.build_language_model(
            config, settings=replace(settings, final_logit_softcapping=None)
        )

        vision = extra.get("vision_config") or {}
        model_type = vision.get("model_type", SiglipVisionTower.model_type)
        if model_type != SiglipVisionTower.model_type:
            raise UnsupportedArchitectureError(
                f"Gemma 3's vision_config model_type is {model_type!r}; Tandem runs Gemma 3 with its SigLIP "
                "encoder (siglip_vision_model) only."
            )
        vision_config = VisionConfig.from_hf_dict(vision, SiglipVisionTower.DEFAULTS)
        self.vision_tower = SiglipVisionTower(vision_config)
        self.mm_tokens_per_image = config_int(extra, "mm_tokens_per_image", _DEFAULT_MM_TOKENS)
        self.multi_modal_projector = Gemma3Projector(vision_config, config.hidden_size, self.mm_tokens_per_image)
        self.image_token_id = _DEFAULT_IMAGE_ID if config.image_token_id is None else config.image_token_id
        self.boi_token_id = config_int(extra, "boi_token_index", config_int(extra, "boi_token_id", _DEFAULT_BOI_ID))
        self.eoi_token_id = config_int(extra, "eoi_token_index", config_int(extra, "eoi_token_id", _DEFAULT_EOI_ID))
        # Ids per image in a prompt: the image rows between <start_of_image> and <end_of_image>.
        self.tokens_per_image: int = self.mm_tokens_per_image + 2
        self.vision = Gemma3Vision(self)

    # --- compute -------------------------------------------------------------------------------------

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
    """The image side of a loaded Gemma 3: LLaVA's, with each picture's run framed by <start_of_image> and
    <end_of_image> (`tokens_per_image` ids in all) and written between blank lines in a chat."""

    @property
    def image_placeholder(self) -> str | None:
        """The text Gemma 3's chat template writes for an image ("<start_of_image>"), or None without a
        usable tokenizer."""
        return self.piece(self.model.boi_token_id)

    def embed_picture(self, picture: Image.Image, tokenizer: Any | None) -> torch.Tensor:
        return self.model.image_rows(self.processor(picture))

    def wrap(self, rows: torch.Tensor, image_hash: str, height: int, width: int, text_alias: str | None):
        return Gemma3ImageEmbedding(rows, image_hash=image_hash, text_alias=text_alias)
