"""What a loaded model is made of (Loaded), and what the app's local server shares of it (Serving)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from app.service.catalog import DEMO_VISION_NAME
from engine import Cache, DynamicGeneratorAsync, Model, Tokenizer
from engine.chat.door import ChatFrontDoor
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
    # The one way from a chat to a job on this model; it keeps the model's image embeddings.
    chat: ChatFrontDoor = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.chat = ChatFrontDoor(
            self.model, self.tokenizer, self.template, context_length=self.context_length, vision=self.vision
        )


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
    chat: ChatFrontDoor  # the chats' front door: the server's requests share its image embeddings


def no_vision_message(name: str) -> str:
    return (
        f"The loaded model ({name}) cannot see images. Remove the images to send the text alone, or load a "
        f"vision model such as the bundled {DEMO_VISION_NAME.lower()} (Model menu)."
    )
