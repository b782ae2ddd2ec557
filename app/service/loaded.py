"""What a loaded model is made of (Loaded), and what the app's local server shares of it (Serving)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from app.service.catalog import DEMO_VISION_NAME
from app.service.images import IMAGE_CACHE_SIZE, EmbeddingCache
from engine import Cache, DynamicGeneratorAsync, Model, Tokenizer
from engine.chat_template import ChatTemplate


@dataclasses.dataclass
class Loaded:
    """A model ready to serve: everything the loader thread built."""

    path: Path
    name: str
    model: Model
    tokenizer: Tokenizer
    template: ChatTemplate
    cache: Cache
    context_length: int
    context_request: int | None = None  # the context the load asked for (None: the default)
    vision: Any | None = None  # the model's vision handle (get_image_embeddings), None for a text model
    images: EmbeddingCache = dataclasses.field(default_factory=lambda: EmbeddingCache(IMAGE_CACHE_SIZE))


@dataclasses.dataclass(frozen=True)
class Serving:
    """The loaded model and the generator the chats use, for the app's local server to share (its requests'
    jobs join this generator, so they batch with the chats and reuse their cached prefixes)."""

    name: str
    model: Model
    tokenizer: Tokenizer
    template: ChatTemplate
    cache: Cache
    generator: DynamicGeneratorAsync
    context_length: int
    vision: Any | None


def no_vision_message(name: str) -> str:
    return (
        f"The loaded model ({name}) cannot see images. Remove the images to send the text alone, or load a "
        f"vision model such as the bundled {DEMO_VISION_NAME.lower()} (Model menu)."
    )
