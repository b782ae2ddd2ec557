"""What every vision-language model shares: a language model it hands the text work to, a checkpoint that
splits into parts by name prefix, and a vision handle.

    checkpoint tensors --(first matching prefix of `checkpoint_parts`)--> language_model  -> its own load_tensors
                                                                      \\-> vision parts    -> theirs, or load_checked

`forward`, `embed`, `rope` and `tie_weights` are the language model's; a subclass changes one only where its
reference does something else (Gemma 3's image rows attend both ways).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, ClassVar

import torch
from torch import nn

from engine.config.model import ModelConfig
from engine.errors import UnsupportedArchitectureError
from engine.models.base import Model
from engine.models.batch import Batch
from engine.models.rope import RotaryTable
from engine.vision.handle import VisionHandle
from engine.vision.layers import load_checked

log = logging.getLogger(__name__)

# (checkpoint prefix, our part, prefix inside that part), tried in order.
CheckpointParts = tuple[tuple[str, str, str], ...]

# transformers >= 4.52 nests everything under "model." with the head at "lm_head."; older checkpoints (and
# transformers 5's save_pretrained, which writes the original layout back) use "language_model.model." /
# "language_model.lm_head.". LLaVA, Gemma 3 and Mistral 3 share these names.
LLAVA_CHECKPOINT_PARTS: CheckpointParts = (
    ("model.language_model.", "language_model", "model."),
    ("language_model.model.", "language_model", "model."),
    ("language_model.lm_head.", "language_model", "lm_head."),
    ("lm_head.", "language_model", "lm_head."),
    ("model.vision_tower.", "vision_tower", ""),
    ("vision_tower.", "vision_tower", ""),
    ("model.multi_modal_projector.", "multi_modal_projector", ""),
    ("multi_modal_projector.", "multi_modal_projector", ""),
)


class VisionLanguageModel(Model):
    """Base of the models that take images.

    A subclass's __init__ builds `language_model` (with `build_language_model`), its vision modules under the
    part names its `checkpoint_parts` use, `image_token_id`, and last `vision` (its VisionHandle; `vision_model`
    is exllamav2's name for it). `forward(inputs, positions, batch)` is the language model's, with inputs
    token ids or embeddings that have image rows spliced in.
    """

    checkpoint_parts: ClassVar[CheckpointParts] = LLAVA_CHECKPOINT_PARTS
    # The language model class a config without text_config names, and (None: any text model) the ones allowed.
    default_text_architecture: ClassVar[str] = "LlamaForCausalLM"
    text_architectures: ClassVar[tuple[str, ...] | None] = None

    language_model: Model
    image_token_id: int
    vision: VisionHandle

    def build_language_model(self, config: ModelConfig, **kwargs: Any) -> Model:
        """The text model config.json's text_config describes, built from `config` (its text fields)."""
        from engine.models.text_models import text_model_class  # imported here: it imports the text models

        arch = config.text_architecture or self.default_text_architecture
        allowed = self.text_architectures
        if allowed is not None and arch not in allowed:
            raise UnsupportedArchitectureError(
                f"config.json text_config describes {arch!r}, but {config.architecture}'s language model is "
                f"{' or '.join(allowed)}; the config is not this model's."
            )
        try:
            cls = text_model_class(arch)
        except UnsupportedArchitectureError as e:
            raise UnsupportedArchitectureError(
                f"the language model of this {config.architecture} (text_config): {e}"
            ) from None
        return cls(replace(config, architecture=arch, text_architecture=None), **kwargs)

    @property
    def vision_model(self) -> VisionHandle:
        """exllamav2's name for `vision`."""
        return self.vision

    @property
    def rope(self) -> RotaryTable:
        return self.language_model.rope

    # --- weights -------------------------------------------------------------------------------------

    def split_checkpoint(self, tensors: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Checkpoint tensors grouped by our part ({part: {name inside the part: tensor}}); others dropped."""
        parts: dict[str, dict[str, Any]] = {part: {} for _, part, _ in self.checkpoint_parts}
        ignored = 0
        for name, value in tensors.items():
            for prefix, part, inner in self.checkpoint_parts:
                if name.startswith(prefix):
                    parts[part][inner + name[len(prefix) :]] = value
                    break
            else:
                ignored += 1
        if ignored:
            log.debug("ignored %d checkpoint tensors that belong to no %s part", ignored, self.config.architecture)
        return parts

    def load_tensors(self, tensors: dict[str, Any]) -> None:
        """Split checkpoint tensors by part (any naming layout the class lists) and let each part load and check
        its own: a part with `load_tensors` (the language model, the encoders) itself, the rest by name."""
        parts = self.split_checkpoint(tensors)
        self.load_language_model(parts.pop("language_model"))
        for part, named in parts.items():
            module = getattr(self, part)
            if hasattr(module, "load_tensors"):
                module.load_tensors(named)
            else:
                load_checked(module, named, f"{part} of {self.config.architecture}")

    def load_language_model(self, tensors: dict[str, Any]) -> None:
        self.language_model.load_tensors(tensors)
        head, embeddings = tensors.get("lm_head.weight"), tensors.get("model.embed_tokens.weight")
        own_head = isinstance(head, torch.Tensor) and isinstance(embeddings, torch.Tensor)
        if self.config.tie_word_embeddings and own_head and not torch.equal(head, embeddings):
            # transformers ties only when the checkpoint's head is absent or equal to the embeddings (Gemma 3's
            # and Mistral 3's configs say "tied" by default, even for checkpoints with a head of their own).
            log.info("config.json ties the word embeddings but the checkpoint has its own lm_head; using it")
            self.language_model.lm_head.weight = nn.Parameter(head, requires_grad=False)

    def tie_weights(self) -> None:
        self.language_model.tie_weights()

    # --- compute -------------------------------------------------------------------------------------

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Text token embeddings [num_tokens, hidden] for vocabulary ids (the language model's own, scaled
        where it scales them)."""
        return self.language_model.embed(input_ids)

    def forward(self, inputs: torch.Tensor, positions: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.language_model(inputs, positions, batch)
