"""What a chat asks of the front door: the conversation (ChatRequest) and how to generate its answer
(AnswerOptions). Both are frozen: a request built on the event loop may be read on a worker thread."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from engine.chat.overflow import OverflowPolicy
from engine.generator.filters import Filter
from engine.generator.sampler_settings import SamplerSettings
from engine.vision.embedding import MMEmbedding


@dataclass(frozen=True)
class AnswerOptions:
    """How one answer is generated, whatever asked for it (a chat tab, an API request, a raw completion).

    `max_new_tokens` None lets the answer take the room the prompt leaves. When it asks for more than that
    room, `shorten_to_fit` True cuts it to the room (the app: an answer longer than the context cannot be had)
    and False refuses the request with ContextOverflow (the server: the client asked for exactly that many).
    `json_mode` holds the answer to one JSON object and ends it when the object closes; `filters` are the
    caller's own constraints (a response_format schema). `split_reasoning` makes results tell a reasoning
    model's thinking from its answer (a chat reply; False for a raw completion).
    """

    settings: SamplerSettings | None = None  # None: the engine's defaults
    max_new_tokens: int | None = None
    shorten_to_fit: bool = True
    min_new_tokens: int = 0
    stop: tuple[int | str, ...] = ()  # beside the tokenizer's end-of-turn tokens, which always stop
    seed: int | None = None
    json_mode: bool = False
    filters: tuple[Filter, ...] = ()
    return_logits: bool = False  # logprobs need every generated token's logits
    prompt_penalties: bool = True  # False: presence/frequency penalties count the answer only (OpenAI's rule)
    split_reasoning: bool = True
    priority: int = 0  # DynamicJob.priority: higher is admitted first
    decode_special_tokens: bool = False  # the text keeps special tokens (a tool-call syntax made of them)
    identifier: object = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "filters", tuple(self.filters))


@dataclass(frozen=True)
class ChatRequest:
    """A conversation to answer: `messages` are {"role", "content"} dicts, a non-empty `system_prompt` goes
    first as a system message, and a user message may hold images as content parts ({"type": "image"}, see
    engine.vision.prompt.user_message) whose embeddings are `images`, in the order the parts appear.
    `template_options` become chat template variables (enable_thinking=False switches a Qwen3-style model's
    thinking off). `overflow` is what happens when the conversation outgrows the context (engine.chat.overflow)."""

    messages: Sequence[Mapping[str, Any]]
    system_prompt: str = ""
    images: Sequence[MMEmbedding] = ()
    template_options: Mapping[str, Any] = field(default_factory=dict)
    answer: AnswerOptions = field(default_factory=AnswerOptions)
    overflow: OverflowPolicy = OverflowPolicy.STOP

    def __post_init__(self) -> None:
        object.__setattr__(self, "overflow", OverflowPolicy.parse(self.overflow))
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(self, "images", tuple(self.images))
        object.__setattr__(self, "template_options", MappingProxyType(dict(self.template_options)))
