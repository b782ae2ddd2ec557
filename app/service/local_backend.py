"""The local engine's side of the Backend protocol: images -> embeddings, chat -> prompt ids, ids -> a job.

`LocalBackend` is mixed into EngineService, which owns what it reads: the model being served (`_loaded`, a
Loaded), its generator (`_generator`) and the jobs started on it (`_jobs`, so a model swap can stop them).
Nothing here loads or swaps a model.

    start_answer(messages, system_prompt, images, settings)
        embed_images(images)          vision worker  (LRU per model, app.service.images)
        encode_chat(...)              prompt worker  (the chat template may run for seconds)
        room in the context?          ValueError "... fills the model's context ..."
        start_job(ids, ...)           -> DynamicJobAsync on the generator's engine thread
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from app.service.backend import ContextFull, ModelSwapped
from app.service.generation import GenerationSettings, sampler_settings
from app.service.images import ImageSource, embed_all
from app.service.loaded import Loaded, no_vision_message
from app.service.workers import PROMPT, VISION, in_worker
from engine import DynamicGeneratorAsync, DynamicJobAsync, SamplerSettings
from engine.chat_prompt import encode_chat
from engine.generator.filters import JSONFilter
from engine.reasoning import ReasoningFormat, reasoning_format_of
from engine.vision.embedding import MMEmbedding
from engine.vision.prompt import DEFAULT_PLACEHOLDER, count_images

# What "JSON mode" holds an answer to: one JSON object, any keys and values.
JSON_MODE_SCHEMA = {"type": "object"}


class LocalBackend:
    """Answers from the model loaded here (see the module docstring); EngineService is the class to use."""

    _loaded: Loaded | None
    _generator: DynamicGeneratorAsync | None
    _jobs: weakref.WeakSet[DynamicJobAsync]
    _json_filter: JSONFilter | None = None  # built on first use (llguidance compiles the grammar)

    # --- describing the model ------------------------------------------------------------------------------

    @property
    def name(self) -> str | None:
        """The model's display name (the Backend protocol's word for model_name)."""
        return self._loaded.name if self._loaded else None

    @property
    def reasoning_format(self) -> ReasoningFormat | None:
        """How the model marks its thinking (from its chat template and vocabulary), None when it does not."""
        return reasoning_format_of(self._loaded.template, self._loaded.tokenizer) if self._loaded else None

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
        vision = self._loaded.vision if self._loaded else None
        return getattr(vision, "image_placeholder", None) or DEFAULT_PLACEHOLDER

    @property
    def num_cached_images(self) -> int:
        """Image embeddings of the current model kept for reuse (0 with no model)."""
        return len(self._loaded.images) if self._loaded else 0

    # --- answers -------------------------------------------------------------------------------------------

    async def start_answer(
        self,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str,
        images: Sequence[ImageSource],
        settings: GenerationSettings,
        identifier: object = None,
    ) -> DynamicJobAsync:
        """The Backend protocol's answer: embed `images`, build the prompt (both off the GUI thread), check it
        leaves room to answer, and start the job, its length capped by what is left of the context."""
        loaded = self._require_model()
        embeddings = await self.embed_images(images) if images else None
        if self._loaded is not loaded:
            raise ModelSwapped(f"{loaded.name} was replaced while the images were being read")
        options = {"enable_thinking": settings.thinking} if settings.thinking is not None else {}
        input_ids = await in_worker(self.encode_chat, messages, system_prompt, embeddings, options, pool=PROMPT)
        if self._loaded is not loaded:
            raise ModelSwapped(f"{loaded.name} was replaced while the prompt was being built")
        num_prompt, context = int(input_ids.shape[-1]), loaded.context_length
        room = context - num_prompt
        if room < 1:
            raise ContextFull(
                f"This conversation ({num_prompt} tokens) fills the model's context of {context} tokens. "
                "Start a new chat (Ctrl+T) or edit an earlier message."
            )
        return self.start_job(
            input_ids,
            settings.sampler(),
            max_new_tokens=min(settings.max_new_tokens, room),
            seed=settings.seed,
            identifier=identifier,
            embeddings=embeddings,
            json_mode=settings.json_mode,
        )

    async def embed_images(self, images: Sequence[ImageSource]) -> list[MMEmbedding]:
        """Embeddings of `images` (file paths, or encoded bytes) for the current model, in order.

        The vision tower runs on the vision worker, never on the GUI thread. Embeddings are kept per model
        by the sha256 of the image bytes (an LRU of IMAGE_CACHE_SIZE), so a chat resent or regenerated
        reuses them; the same image twice gives the same MMEmbedding. Raises ImageError (a ValueError
        naming the file) for an image that cannot be read, ValueError when the model cannot see images,
        RuntimeError with no model.
        """
        loaded = self._require_model()
        if loaded.vision is None:
            raise ValueError(no_vision_message(loaded.name))
        if not images:
            return []
        return await in_worker(embed_all, loaded, list(images), pool=VISION)

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str = "",
        images: Sequence[MMEmbedding] | None = None,
        template_options: Mapping[str, Any] | None = None,
    ) -> torch.Tensor:
        """Token ids [1, n] of a conversation in the model's chat template, ending with the reply prompt.

        `messages` are {"role", "content"} dicts; a non-empty `system_prompt` goes first as a system
        message. A user message may hold images as content parts ({"type": "image"}, see
        engine.vision.prompt.user_message); `images` are their MMEmbeddings (from `embed_images`) in the
        order the parts appear, and each becomes its run of image token ids. Special-token text in the
        rendered template becomes special tokens. Raises ChatTemplateError when the template rejects the
        conversation, ValueError when images and image parts disagree or the model cannot see images,
        RuntimeError with no model.
        """
        loaded = self._require_model()
        if system_prompt:
            messages = [{"role": "system", "content": system_prompt}, *messages]
        images = list(images or ())
        if (images or count_images(messages)) and loaded.vision is None:
            raise ValueError(no_vision_message(loaded.name))
        options = template_options or {}
        return encode_chat(loaded.tokenizer, loaded.template, messages, images, self.image_placeholder, **options)

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
            loaded = self._require_model()
            vision = loaded.vision
            if image_sources is not None and len(image_sources) == wanted and vision is not None:
                images = [vision.stand_in(source) for source in image_sources]
            else:
                per_image = int(getattr(loaded.model, "tokens_per_image", 1))
                # Stand-ins with the right number of ids: only their length matters here (meta: no memory).
                images = [MMEmbedding(torch.empty(per_image, 1, device="meta"), f"count-{i}") for i in range(wanted)]
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
        were encoded with (`encode_chat(images=...)`). `json_mode` holds the answer to one JSON object (a
        JSONFilter over JSON_MODE_SCHEMA): it ends as soon as the object closes (eos_reason "end_filter"),
        and is valid JSON unless max_new_tokens cuts it first. Stops at the tokenizer's end-of-turn tokens or
        after `max_new_tokens`. Raises ValueError when prompt + max_new_tokens exceeds `context_length` or
        the embeddings do not match the ids.
        """
        gen_settings = settings if isinstance(settings, SamplerSettings) else sampler_settings(settings)
        loaded = self._require_model()
        unique = list({id(e): e for e in embeddings or ()}.values())  # an image sent twice is spliced once
        filters = {}
        if json_mode:
            if self._json_filter is None:
                self._json_filter = JSONFilter(JSON_MODE_SCHEMA)
            # prefer_eos: once the object is complete, end rather than let the model pad it out.
            filters = {"filters": [self._json_filter], "filter_prefer_eos": True}
        job = DynamicJobAsync(
            self._generator,
            input_ids,
            max_new_tokens,
            gen_settings=gen_settings,
            seed=seed,
            stop_conditions=sorted(loaded.tokenizer.eos_token_ids),
            identifier=identifier,
            embeddings=unique or None,
            # results then tell a reasoning model's thinking from its answer (engine.reasoning)
            reasoning=reasoning_format_of(loaded.template, loaded.tokenizer),
            **filters,
        )
        self._jobs.add(job)
        return job

    def _require_model(self) -> Loaded:
        if self._loaded is None:
            raise RuntimeError("No model is loaded yet. Wait for the model to finish loading, or load one.")
        return self._loaded
