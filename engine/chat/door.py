"""ChatFrontDoor: the one way from a chat to a job, for the app's local backend and the server alike.

    embed_image(bytes, key)       image -> MMEmbedding through this model's EmbeddingCache   (blocking)
    prompt(ChatRequest)           template_inputs -> overflow policy -> encode_chat -> ChatPrompt (blocking)
    prompt_ids(ChatRequest)       prompt(...).ids [1, n]                                     (blocking)
    fit(num_prompt, answer)       room in the context -> max_new_tokens, else ContextOverflow
    start_job(generator, ids, answer, max_new_tokens=..., images=...) -> DynamicJobAsync    (event loop)

Every step is synchronous: each caller decides what runs off its event loop (the app's worker threads, the
server's). The context-overflow policy (engine.chat.overflow) applies in `prompt`; tool definitions plug into
`template_inputs`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.chat.errors import ContextOverflow, NoVisionError
from engine.chat.images import IMAGE_CACHE_SIZE, EmbeddingCache
from engine.chat.overflow import keep_messages
from engine.chat.prompt import encode_chat
from engine.chat.request import AnswerOptions, ChatRequest
from engine.chat_template import ChatTemplate
from engine.generator.dynamic_async import DynamicGeneratorAsync, DynamicJobAsync
from engine.generator.filters import JSONFilter
from engine.reasoning import ReasoningFormat, reasoning_format_of
from engine.vision.embedding import MMEmbedding
from engine.vision.image import ImageSource, decode_image
from engine.vision.prompt import DEFAULT_PLACEHOLDER, count_images

log = logging.getLogger(__name__)

# What "JSON mode" holds an answer to: one JSON object, any keys and values.
JSON_MODE_SCHEMA = {"type": "object"}


@dataclass(frozen=True)
class ChatPrompt:
    """A request's prompt ids [1, n], the image embeddings in them (those of the messages still seen), and
    which of the request's messages the overflow policy dropped (indices into `request.messages`)."""

    ids: torch.Tensor
    images: tuple[MMEmbedding, ...]
    dropped: range

    @property
    def first_seen(self) -> int | None:
        """Index in `request.messages` where the model's view resumes after dropped turns; None: all seen."""
        return self.dropped.stop if self.dropped else None


class ChatFrontDoor:
    """Turns chats into jobs for one loaded model: its tokenizer, chat template, vision handle (None for a text
    model) and the most tokens one chat may hold (`context_length`, prompt and answer together).

    Jobs go to the generator each `start_job` names: a generator may be rebuilt over the same model (the app's
    speculation setting) while the door, and the image embeddings it keeps, stay.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        template: ChatTemplate,
        *,
        context_length: int,
        vision: Any = None,
        image_cache_size: int = IMAGE_CACHE_SIZE,
    ):
        if context_length < 1:
            raise ValueError(f"context_length must be a positive number of tokens, got {context_length}")
        self.model = model
        self.tokenizer = tokenizer
        self.template = template
        self.vision = vision
        self.context_length = context_length
        self.images = EmbeddingCache(image_cache_size)
        # How the model marks its thinking (from its template and vocabulary), None when it does not.
        self.reasoning = reasoning_format_of(template, tokenizer)
        self.stop_token_ids = sorted(set(tokenizer.eos_token_ids) | _format_stops(self.reasoning, tokenizer))
        self._vision_lock = threading.Lock()  # the tower is not re-entrant; the app and its server share a door
        self._json_filter: JSONFilter | None = None  # built on first use (llguidance compiles the grammar)

    @property
    def image_placeholder(self) -> str:
        """The text the chat template writes for an image ("<image>" for LLaVA)."""
        return getattr(self.vision, "image_placeholder", None) or DEFAULT_PLACEHOLDER

    # --- images --------------------------------------------------------------------------------------------

    def embed_image(self, data: bytes, *, name: str | None = None, key: str | None = None) -> MMEmbedding:
        """The embedding of one encoded image (blocking: the vision tower runs here on a miss).

        Kept by `key`, the sha256 of `data` (computed when None), so the same picture sent again, by any
        caller, reuses its embedding and its id run. `name` is what errors call the image (None: by its
        size). Raises ImageError for bytes that are not a usable image, NoVisionError for a text model.
        """
        if self.vision is None:
            raise NoVisionError("This model has no vision tower, so it cannot take images. Send text only.")
        key = key or hashlib.sha256(data).hexdigest()
        embedding = self.images.get(key)
        if embedding is not None:
            return embedding
        # The digest names the ids, so the picture's pixels are not hashed again.
        image = decode_image(data, name=name, content_hash=key)
        with self._vision_lock, torch.no_grad():
            embedding = self.vision.get_image_embeddings(model=self.model, tokenizer=self.tokenizer, image=image)
        self.images.put(key, embedding)
        log.info("embedded image %s (%d tokens)", key[:12], embedding.num_tokens)
        return embedding

    def stand_ins(self, count: int, sources: Sequence[ImageSource] | None = None) -> list[MMEmbedding]:
        """`count` embeddings with no rows (meta device), to count a prompt's tokens without the vision tower.

        From `sources` (the pictures in prompt order; only their headers are read) each takes exactly the ids
        the model will give it (tiles, grids, wrapper tokens); otherwise the model's nominal tokens per image.
        """
        if sources is not None and len(sources) == count and self.vision is not None:
            return [self.vision.stand_in(source) for source in sources]
        per_image = int(getattr(self.model, "tokens_per_image", 1))
        return [MMEmbedding(torch.empty(per_image, 1, device="meta"), f"count-{i}") for i in range(count)]

    # --- prompts -------------------------------------------------------------------------------------------

    def template_inputs(self, request: ChatRequest) -> tuple[list[Mapping[str, Any]], dict[str, Any]]:
        """The messages and variables the chat template renders: the system prompt first, then the chat.
        The place where a context-overflow policy (which turns to keep) and tool definitions plug in."""
        messages = list(request.messages)
        if request.system_prompt:
            messages.insert(0, {"role": "system", "content": request.system_prompt})
        return messages, dict(request.template_options)

    def prompt(self, request: ChatRequest, reserve: int | None = None) -> ChatPrompt:
        """The prompt of `request` in the chat template, ending with the prompt for the assistant's reply, after
        its overflow policy kept what fits the context less `reserve` tokens for the answer (None: `answer_room`
        of its answer). Blocking: a template may render for up to its time limit.

        Raises ChatTemplateError when the template rejects the conversation, NoVisionError when it holds
        images and the model cannot see, ValueError when the images and the image parts disagree.
        """
        messages, options = self.template_inputs(request)
        images = list(request.images)
        if (images or count_images(messages)) and self.vision is None:
            raise NoVisionError("The conversation holds images but this model cannot see them. Send text only.")
        reserve = self.answer_room(request.answer) if reserve is None else reserve
        encoded: dict[tuple[int, ...], torch.Tensor] = {}  # each view the policy tries is rendered once

        def ids_of(kept: Sequence[Mapping[str, Any]]) -> torch.Tensor:
            key = tuple(map(id, kept))
            if key not in encoded:
                # All messages take all images, so encode_chat still refuses a count that disagrees with the parts.
                kept_images = images if len(kept) == len(messages) else _images_of(kept, messages, images)
                encoded[key] = encode_chat(
                    self.tokenizer, self.template, kept, kept_images, self.image_placeholder, **options
                )
            return encoded[key]

        budget = self.context_length - reserve
        view = keep_messages(
            messages, request.overflow, budget, lambda kept: int(ids_of(kept).shape[-1]), self._measure
        )
        offset = len(messages) - len(request.messages)  # the system prompt template_inputs put first
        dropped = range(view.dropped.start - offset, view.dropped.stop - offset) if view.dropped else range(0)
        kept_images = _images_of(view.messages, messages, images) if view.dropped else images
        return ChatPrompt(ids_of(view.messages), tuple(kept_images), dropped)

    def prompt_ids(self, request: ChatRequest) -> torch.Tensor:
        """Token ids [1, n] of `request` (`prompt(request).ids`); the errors are `prompt`'s."""
        return self.prompt(request).ids

    def answer_room(self, answer: AnswerOptions) -> int:
        """Tokens an overflow policy leaves free for the answer: what it asks for (at most half the context when
        it may be shortened), else a quarter of the context."""
        asked = answer.max_new_tokens
        if asked is None:
            return max(1, self.context_length // 4)
        return min(asked, max(1, self.context_length // 2)) if answer.shorten_to_fit else asked

    def _measure(self, message: Mapping[str, Any]) -> int:
        """A message's own weight in tokens: its text's (image parts weigh nothing; only block bounds use it)."""
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        return len(self.tokenizer.encode(str(content or "")).flatten())

    def fit(self, num_prompt: int, answer: AnswerOptions) -> int:
        """The new tokens the answer may have after a prompt of `num_prompt` tokens: what it asks for, or the
        room left when it asks for none (or more, and `shorten_to_fit`). Raises ContextOverflow when the
        prompt leaves no room, or less than asked for and not `shorten_to_fit`."""
        room = self.context_length - num_prompt
        asked = answer.max_new_tokens
        if room < 1 or (asked is not None and asked > room and not answer.shorten_to_fit):
            raise ContextOverflow(num_prompt, self.context_length, asked)
        return room if asked is None else min(asked, room)

    # --- jobs ----------------------------------------------------------------------------------------------

    def start_job(
        self,
        generator: DynamicGeneratorAsync,
        input_ids: torch.Tensor | Sequence[int],
        answer: AnswerOptions,
        *,
        max_new_tokens: int,
        images: Sequence[MMEmbedding] = (),
    ) -> DynamicJobAsync:
        """Queue the answer to prompt ids on `generator` (call from the event loop that will read it). `images`
        are the embeddings the ids were made with; the answer stops at the tokenizer's end-of-turn tokens,
        `answer.stop`, or after `max_new_tokens`. Raises ValueError for a job the generator refuses (a prompt
        and max_new_tokens past its max_seq_len, a stop string that is no text) and GeneratorClosedError
        for a generator that has closed."""
        unique = list({id(e): e for e in images}.values())  # an image sent twice is spliced once
        reasoning = self.reasoning if answer.split_reasoning else None
        filters = list(answer.filters)
        if answer.json_mode:
            if self._json_filter is None:
                self._json_filter = JSONFilter(JSON_MODE_SCHEMA)
            filters.append(self._json_filter)
        return DynamicJobAsync(
            generator,
            input_ids=input_ids,
            max_new_tokens=max_new_tokens,
            min_new_tokens=answer.min_new_tokens,
            gen_settings=answer.settings,
            seed=answer.seed,
            stop_conditions=[*self.stop_token_ids, *answer.stop],
            return_logits=answer.return_logits,
            filters=filters or None,
            # JSON mode: once the object is complete, end rather than let the model pad it out.
            filter_prefer_eos=answer.json_mode,
            identifier=answer.identifier,
            embeddings=unique or None,
            reasoning=reasoning,
            # Harmony's channels are special tokens: the job's text keeps them for the parser, which leaves
            # them out of the reasoning and answer it gives.
            decode_special_tokens=answer.decode_special_tokens
            or (reasoning is not None and reasoning.decodes_special_tokens),
            prompt_penalties=answer.prompt_penalties,
            priority=answer.priority,
        )


def _format_stops(fmt: ReasoningFormat | None, tokenizer: Any) -> set[int]:
    """Tokens that end a reply in the model's reasoning format beside the tokenizer's eos (harmony's <|return|>
    and <|call|>, which a GGUF of gpt-oss does not name as end tokens)."""
    ids = (tokenizer.piece_to_id(marker) for marker in (fmt.stop_markers if fmt is not None else ()))
    return {i for i in ids if i is not None}


def _images_of(kept: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]], images: Sequence) -> list:
    """The embeddings of the image parts of `kept` (some of `messages`, whose image parts are `images` in order)."""
    if not images:
        return []
    wanted = {id(m) for m in kept}
    out, at = [], 0
    for m in messages:
        n = count_images([m])
        if id(m) in wanted:
            out.extend(images[at : at + n])
        at += n
    return out
