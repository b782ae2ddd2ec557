"""The local engine's side of the Backend protocol: a chat on the model loaded here becomes a job.

EngineService holds one LocalBackend and hands it each model it installs (`serve(loaded, generator)`): the
model's chat front door (engine.chat.door, `loaded.chat`) does the work, this class moves the blocking parts
off the GUI thread and words the door's refusals for the window. Nothing here loads or swaps a model.

    start_answer(messages, system_prompt, images, settings)
        embed_images(images)          vision worker  (the door's LRU per model)
        prompt(...)                   prompt worker  (the chat template may run for seconds; the overflow policy
                                                     drops old turns there, and the answer says where its view begins)
        door.fit(...)                 ContextFull "... fills the model's context ..."
        door.start_job(...)           -> DynamicJobAsync on the generator's engine thread
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from app.service.backend import ContextFull, ModelSwapped
from app.service.engine_answer import EngineAnswer
from app.service.generation import DEFAULT_OVERFLOW, GenerationSettings, sampler_settings
from app.service.images import ImageSource, embed_all
from app.service.loaded import Loaded, no_vision_message
from app.service.local_tools import LocalTools
from app.service.tool_request import ToolRequest
from app.service.workers import PROMPT, VISION, in_worker
from engine import DynamicGeneratorAsync, DynamicJobAsync, SamplerSettings
from engine.chat.door import ChatPrompt
from engine.chat.errors import ContextOverflow, NoVisionError
from engine.chat.overflow import OverflowPolicy
from engine.chat.request import AnswerOptions, ChatRequest
from engine.reasoning import ReasoningFormat
from engine.vision.embedding import MMEmbedding
from engine.vision.prompt import DEFAULT_PLACEHOLDER, count_images


class LocalBackend:
    """Answers from the model it was last given to serve (see the module docstring)."""

    def __init__(self) -> None:
        self._loaded: Loaded | None = None
        self._generator: DynamicGeneratorAsync | None = None
        self._jobs: weakref.WeakSet[DynamicJobAsync] = weakref.WeakSet()  # jobs started on `generator`

    # --- what it serves ------------------------------------------------------------------------------------

    @property
    def loaded(self) -> Loaded | None:
        """The model answering now (None before the first load and after close)."""
        return self._loaded

    @property
    def generator(self) -> DynamicGeneratorAsync | None:
        return self._generator

    def serve(
        self, loaded: Loaded | None, generator: DynamicGeneratorAsync | None
    ) -> tuple[DynamicGeneratorAsync | None, list[DynamicJobAsync]]:
        """Answer with `loaded` on `generator` from now on (None, None: with nothing). Returns the previous
        generator and the jobs started on it, for the caller to stop; new jobs already go to the new one."""
        previous = self._generator, list(self._jobs)
        self._loaded, self._generator, self._jobs = loaded, generator, weakref.WeakSet()
        return previous

    # --- describing the model ------------------------------------------------------------------------------

    @property
    def name(self) -> str | None:
        """The model's display name (the Backend protocol's word for model_name)."""
        return self._loaded.name if self._loaded else None

    @property
    def is_loaded(self) -> bool:
        return self._loaded is not None

    @property
    def reasoning_format(self) -> ReasoningFormat | None:
        """How the model marks its thinking (from its chat template and vocabulary), None when it does not."""
        return self._loaded.chat.reasoning if self._loaded else None

    @property
    def context_length(self) -> int:
        """Tokens one chat may hold: the model's context, capped by the cache; 0 with no model."""
        return self._loaded.context_length if self._loaded else 0

    @property
    def can_see_images(self) -> bool:
        """Whether the loaded model takes images (it has a vision tower, e.g. a LLaVA model)."""
        return self._loaded is not None and self._loaded.vision is not None

    @property
    def images_off_reason(self) -> str | None:
        """Why the loaded GGUF's projector (mmproj) did not pair (engine's `model.vision_error`), or None."""
        return None if self._loaded is None else self._loaded.model.vision_error

    @property
    def image_placeholder(self) -> str:
        """The text the chat template writes for an image ("<image>" for LLaVA)."""
        return self._loaded.chat.image_placeholder if self._loaded else DEFAULT_PLACEHOLDER

    @property
    def num_cached_images(self) -> int:
        """Image embeddings of the current model kept for reuse (0 with no model)."""
        return len(self._loaded.chat.images) if self._loaded else 0

    # --- answers -------------------------------------------------------------------------------------------

    async def start_answer(
        self,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str,
        images: Sequence[ImageSource],
        settings: GenerationSettings,
        identifier: object = None,
        tools: ToolRequest | None = None,
    ) -> EngineAnswer:
        """The Backend protocol's answer: embed `images`, build the prompt (both off the GUI thread), check it
        leaves room to answer, and start the job, its length capped by what is left of the context; the job's
        results are read as AnswerChunks. Past the context the chat's overflow policy drops old turns; the
        answer's `first_seen` says which message the model's view resumes at (None: it sees them all).
        With `tools` the answer may call them (app.service.local_tools): its last chunk carries the calls."""
        loaded = self._require_model()
        calling = LocalTools.of(loaded, tools) if tools is not None and tools.tools else None
        embeddings = await self.embed_images(images) if images else None
        if self._loaded is not loaded:
            raise ModelSwapped(f"{loaded.name} was replaced while the images were being read")
        options = settings.template_options()
        if calling is not None:  # the system prompt goes first among the messages, as the tool templates read it
            messages, system_prompt = calling.messages(messages, system_prompt), ""
            options = {**options, **calling.template_options()}
        answer = AnswerOptions(
            settings=settings.sampler(),
            max_new_tokens=settings.max_new_tokens,
            seed=settings.seed,
            json_mode=settings.json_mode,
            identifier=identifier,
        )
        overflow = OverflowPolicy.parse(settings.overflow or DEFAULT_OVERFLOW)
        prompt = await in_worker(
            self.prompt, messages, system_prompt, embeddings, options, overflow, answer, pool=PROMPT
        )
        if self._loaded is not loaded:
            raise ModelSwapped(f"{loaded.name} was replaced while the prompt was being built")
        try:
            max_new_tokens = loaded.chat.fit(int(prompt.ids.shape[-1]), answer)
        except ContextOverflow as e:
            raise ContextFull(
                f"This conversation ({e.num_prompt} tokens) fills the model's context of {e.context_length} "
                "tokens. Start a new chat (Ctrl+T) or edit an earlier message."
            ) from None
        parser = None
        if calling is not None:
            tool_job = await in_worker(calling.prepare, prompt.ids, pool=PROMPT)
            answer = dataclasses.replace(
                answer, filters=tool_job.filters, decode_special_tokens=tool_job.decode_special_tokens
            )
            parser = tool_job.parser
        job = self._start(loaded, prompt.ids, answer, max_new_tokens, prompt.images)
        # a job shorter than the settings ask ends at the context's end, not at its own limit
        capped = max_new_tokens < answer.max_new_tokens
        return EngineAnswer(job, first_seen=prompt.first_seen, context_capped=capped, parser=parser)

    async def embed_images(self, images: Sequence[ImageSource]) -> list[MMEmbedding]:
        """Embeddings of `images` (file paths, or encoded bytes) for the current model, in order.

        The vision tower runs on the vision worker, never on the GUI thread. Embeddings are kept per model
        by the sha256 of the image bytes (the front door's LRU), so a chat resent or regenerated reuses
        them; the same image twice gives the same MMEmbedding. Raises ImageError (a ValueError naming the
        file) for an image that cannot be read, ValueError when the model cannot see images, RuntimeError
        with no model.
        """
        loaded = self._require_model()
        if loaded.vision is None:
            raise ValueError(no_vision_message(loaded.name))
        if not images:
            return []
        return await in_worker(embed_all, loaded.chat, list(images), pool=VISION)

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str = "",
        images: Sequence[MMEmbedding] | None = None,
        template_options: Mapping[str, Any] | None = None,
    ) -> torch.Tensor:
        """Token ids [1, n] of a conversation in the model's chat template, ending with the reply prompt.

        `messages` are {"role", "content"} dicts; a non-empty `system_prompt` goes first as a system
        message; a last message from the assistant is an unfinished answer, and the ids end with its text instead
        of the reply prompt, so the model writes on. A user message may hold images as content parts ({"type": "image"}, see
        engine.vision.prompt.user_message); `images` are their MMEmbeddings (from `embed_images`) in the
        order the parts appear, and each becomes its run of image token ids. Special-token text in the
        rendered template becomes special tokens. Raises ChatTemplateError when the template rejects the
        conversation, ValueError when images and image parts disagree or the model cannot see images,
        RuntimeError with no model.
        """
        return self.prompt(messages, system_prompt, images, template_options).ids

    def prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str = "",
        images: Sequence[MMEmbedding] | None = None,
        template_options: Mapping[str, Any] | None = None,
        overflow: OverflowPolicy = OverflowPolicy.STOP,
        answer: AnswerOptions | None = None,
    ) -> ChatPrompt:
        """`encode_chat`'s ids with the embeddings in them, after `overflow` kept the turns that leave the room
        `answer` asks for (an unfinished last answer's text counts against that room: it stays whole)."""
        loaded = self._require_model()
        answer = answer or AnswerOptions()
        written = None
        if messages and messages[-1].get("role") == "assistant":  # an answer to write on (the chat's Continue)
            # The model's own text: its reasoning tags become the special tokens it wrote them as.
            written = loaded.tokenizer.encode(str(messages[-1]["content"]), encode_special_tokens=True)
            messages = messages[:-1]
        request = ChatRequest(messages, system_prompt, images or (), template_options or {}, answer, overflow)
        reserve = loaded.chat.answer_room(answer) + (0 if written is None else int(written.shape[-1]))
        try:
            prompt = loaded.chat.prompt(request, reserve)
        except NoVisionError:
            raise ValueError(no_vision_message(loaded.name)) from None
        if written is None:
            return prompt
        ids = torch.cat([prompt.ids, written.to(prompt.ids.dtype)], dim=-1)
        return ChatPrompt(ids, prompt.images, prompt.dropped)

    def count_tokens(
        self,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str = "",
        images: Sequence[MMEmbedding] | None = None,
        image_sources: Sequence[ImageSource] | None = None,
    ) -> int:
        """Prompt length in tokens of `encode_chat(messages, system_prompt, images)`, for the context meter.

        With `images` None the image parts are counted without embedding them, so the meter never waits for
        the vision tower: from `image_sources` (the pictures in prompt order; only their headers are read)
        each counts exactly what the model will give it (tiles, dynamic grids, row breaks and wrapper
        tokens included), else as the model's nominal tokens per image.
        """
        wanted = count_images(messages)
        if images is None and wanted:
            images = self._require_model().chat.stand_ins(wanted, image_sources)
        return int(self.encode_chat(messages, system_prompt, images).shape[-1])

    def start_job(
        self,
        input_ids: torch.Tensor | Sequence[int],
        settings: Mapping[str, Any] | SamplerSettings,
        *,
        max_new_tokens: int,
        seed: int | None,
        identifier: object = None,
        embeddings: Sequence[MMEmbedding] | None = None,
        json_mode: bool = False,
    ) -> DynamicJobAsync:
        """Queue a generation of prompt ids on the current model; iterate it with `async for` and stop it with
        `await job.cancel()`. The engine-level call under `start_answer`, for callers that hold ids.

        Call from the event loop. `settings` is the engine's SamplerSettings or a settings dict (see
        generation.sampler_settings; unknown keys raise ValueError). `embeddings` are the images the ids
        were encoded with (`encode_chat(images=...)`). `json_mode` holds the answer to one JSON object: it
        ends as soon as the object closes (eos_reason "end_filter"), and is valid JSON unless
        max_new_tokens cuts it first. Stops at the tokenizer's end-of-turn tokens or after
        `max_new_tokens`. Raises ValueError when prompt + max_new_tokens exceeds `context_length` or the
        embeddings do not match the ids.
        """
        gen_settings = settings if isinstance(settings, SamplerSettings) else sampler_settings(settings)
        answer = AnswerOptions(settings=gen_settings, seed=seed, json_mode=json_mode, identifier=identifier)
        return self._start(self._require_model(), input_ids, answer, max_new_tokens, embeddings or ())

    def _start(
        self,
        loaded: Loaded,
        input_ids: torch.Tensor | Sequence[int],
        answer: AnswerOptions,
        max_new_tokens: int,
        embeddings: Sequence[MMEmbedding],
    ) -> DynamicJobAsync:
        job = loaded.chat.start_job(
            self._generator, input_ids, answer, max_new_tokens=max_new_tokens, images=embeddings
        )
        self._jobs.add(job)
        return job

    def _require_model(self) -> Loaded:
        if self._loaded is None:
            raise RuntimeError("No model is loaded yet. Wait for the model to finish loading, or load one.")
        return self._loaded
