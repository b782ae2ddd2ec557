"""The seam between the chat UI and whatever answers: the `Backend` protocol.

The chat tab and the compare view talk only to a Backend. The local engine (EngineService) is one; a remote
OpenAI-compatible server (app.service.remote.RemoteBackend) is another. Neither view knows which it has.

    ChatTab / CompareView --start_answer(messages, system_prompt, images, GenerationSettings)--> Backend
                          <------------- AnswerJob: async for result in job; await job.cancel() ---

How a view gets its backend: it is handed one when built (`ChatTab(store, backend)`,
`CompareView(store, backend)`) and a new one by `set_backend(backend)` when the window switches (say, from
the local model to a server). A view reads its `backend` attribute afresh for every answer and count, so
a switch takes effect with the next send; an answer already streaming finishes on the job it has.

A job streams AnswerChunks: the engine's result dicts (see the seed documents) reduced to what the views read,
with the text already split into thinking and answer by the backend, once, as it streams.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal, Protocol, TypedDict, runtime_checkable

from app.service.generation import GenerationSettings
from app.service.images import ImageSource, KnownImage  # a stored file's path, bytes, or bytes with their digest
from app.service.tool_request import ToolRequest
from engine.errors import ChatTemplateError, ImageError  # what start_answer raises for a bad image or template
from engine.vision.prompt import user_message  # a user message with n {"type": "image"} parts: start_answer's form

__all__ = [
    "AnswerChunk",
    "AnswerJob",
    "Backend",
    "ChatTemplateError",
    "ContextFull",
    "ImageError",
    "ImageSource",
    "KnownImage",
    "ModelSwapped",
    "user_message",
]


class ContextFull(ValueError):
    """The conversation leaves no room for an answer in the model's context; the message says what to do."""


class ModelSwapped(RuntimeError):
    """The backend's model changed while an answer was being prepared: the conversation must be built again
    for the new model (which may see images the old one did not, or not), then sent again."""


class _ChunkText(TypedDict):
    # the keys every AnswerChunk has
    job: AnswerJob
    stage: Literal["streaming"]
    eos: bool
    text: str
    thinking: str
    answer: str
    num_tokens: int  # tokens this chunk adds to the answer


class AnswerChunk(_ChunkText, total=False):
    """One piece of an answer, what the chat tab and the compare view read from any backend.

    `text` is as the model wrote it, reasoning tags included (the form an answer is stored in); `thinking` and
    `answer` are that text split by the backend as it streams (tags left out), so a view shows them as given.
    The last chunk ("eos" True) adds the answer's numbers; a backend that cannot know one leaves it out or 0.
    """

    identifier: object  # the one start_answer was given, when not None
    # the last chunk
    eos_reason: str  # the engine's: "stop_token", "stop_string", "max_new_tokens", "end_filter"
    full_completion: str
    new_tokens: int
    prompt_tokens: int
    cached_tokens: int
    time_enqueued: float
    time_prefill: float
    time_generate: float
    accepted_draft_tokens: int  # when the engine speculates
    rejected_draft_tokens: int
    # an answer given tools (app.service.tool_request) that calls them: OpenAI's tool_calls, on the last chunk
    tool_calls: list[dict[str, Any]]


# The numbers of a last chunk, taken as they are from the engine's (or a server's) eos result.
EOS_KEYS = tuple(sorted(AnswerChunk.__optional_keys__ - {"identifier", "tool_calls"}))


@runtime_checkable
class AnswerJob(Protocol):
    """One answer on its way: `async for chunk in job` reads its AnswerChunks; `await job.cancel()` stops it
    (what arrived stays; the iteration then ends without an eos chunk)."""

    def __aiter__(self) -> AsyncIterator[AnswerChunk]: ...

    async def cancel(self) -> None: ...


@runtime_checkable
class Backend(Protocol):
    """What the chat UI asks of a model, wherever it runs."""

    @property
    def name(self) -> str | None:
        """The model's display name (None with no model)."""

    @property
    def is_loaded(self) -> bool:
        """Whether a model is there to answer."""

    @property
    def context_length(self) -> int:
        """Tokens one chat may hold; 0 when unknown (a server that does not say) or with no model."""

    @property
    def can_see_images(self) -> bool:
        """Whether user messages may carry images."""

    @property
    def images_off_reason(self) -> str | None:
        """Why a model that came with a vision part cannot see images (a GGUF's mmproj that did not pair),
        for the chat to say; None otherwise."""

    def count_tokens(
        self,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str = "",
        *,
        image_sources: Sequence[ImageSource] | None = None,
    ) -> int | None:
        """The prompt's length in tokens, for the context meter; None when this backend cannot count (a
        remote server's tokenizer is not here), and the meter then hides. May block: call it off the GUI
        thread."""

    async def start_answer(
        self,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str,
        images: Sequence[ImageSource],
        settings: GenerationSettings,
        identifier: object = None,
        tools: ToolRequest | None = None,
    ) -> AnswerJob:
        """Start answering `messages` ({"role", "content"} dicts; a user message's content may hold
        {"type": "image"} parts, whose files are `images`, in order) after `system_prompt` (none when empty),
        generated as `settings` say. With `tools` the answer may call them, its calls on its last chunk
        ("tool_calls"), and `messages` may hold assistant tool_calls and tool results (app.service.tool_loop). Raises ContextFull (a ValueError) when the conversation fills the
        model's context, ImageError (a ValueError) for an image that cannot be read, ChatTemplateError when
        the model's template refuses the conversation, ModelSwapped when the model changed meanwhile,
        RuntimeError with no model; a backend may raise later failures from the job instead."""
