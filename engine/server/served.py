"""The served model: one model, one paged cache and one DynamicGeneratorAsync that every request's job joins.

`python -m engine serve` builds its own (ServedModel(model, ...), which owns its cache and generator); the
app builds one over the model, cache and generator its chats already use (ServedModel.shared), so the
server's jobs and the chats' jobs batch together and share cached prefixes.

The routes never touch tensors or the generator directly; they ask this object for prompt ids, image
embeddings and jobs. Prompts and images are prepared off the event loop (a chat template may take up to its
2 s render limit, a vision tower a forward pass), so one slow request never stalls the others' streams.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from engine.cache import Cache
from engine.chat_prompt import encode_chat
from engine.chat_template import ChatTemplate
from engine.errors import ChatTemplateError
from engine.generator.dynamic_async import DynamicGeneratorAsync, DynamicJobAsync, GeneratorClosedError
from engine.models.vision import vision_of
from engine.reasoning import reasoning_format_of
from engine.server.errors import APIError, bad_request
from engine.server.messages import ChatInput
from engine.server.params import Generation

log = logging.getLogger(__name__)

PAGE_SIZE = 256
MAX_CACHE_TOKENS = 32768  # beyond one context, the cache grows with max_concurrent up to this
# The generator keeps every generated token's float32 logits row for a job that returns logits (logprobs need
# them), so such a job's length is bounded by this much memory: about 2,700 tokens for a 49k vocabulary.
LOGPROBS_BYTES = 512 * 1024 * 1024


def cache_tokens(context: int, max_concurrent: int, page_size: int = PAGE_SIZE) -> int:
    """Tokens of KV cache: room for every concurrent job at full context, but at most MAX_CACHE_TOKENS
    unless one context needs more (jobs rarely all reach the full context, and shared prefixes share pages)."""
    tokens = max(context, min(context * max_concurrent, MAX_CACHE_TOKENS))
    return -(-tokens // page_size) * page_size


class ServedModel:
    """A loaded model behind the server: prompt building, image embedding, and jobs on one generator.

    `context` is the most tokens one request may hold (prompt + completion); `max_concurrent` the jobs
    generating at once (more wait in the generator's queue); `max_queue` the requests allowed to wait
    beyond those before the server answers 503.
    """

    def __init__(
        self,
        model: Any,
        model_id: str,
        context: int = 8192,
        max_concurrent: int = 8,
        max_queue: int = 64,
        page_size: int = PAGE_SIZE,
        *,
        tokenizer: Any = None,
        template: ChatTemplate | None = None,
        cache: Cache | None = None,
        vision: Any = None,
    ):
        """`tokenizer`, `template`, `cache` and `vision` default to the model's own and a new cache."""
        if context < 2 or max_concurrent < 1 or max_queue < 0:
            raise ValueError(
                f"context must be >= 2, max_concurrent >= 1 and max_queue >= 0; got {context}, {max_concurrent}, "
                f"{max_queue}"
            )
        self.model = model
        self.model_id = model_id
        self.tokenizer = tokenizer if tokenizer is not None else model.tokenizer
        self.template = template if template is not None else _template(self.tokenizer, model_id)
        # Chat replies put a reasoning model's thinking in reasoning_content (as vLLM and DeepSeek's API do).
        self.reasoning = reasoning_format_of(self.template, self.tokenizer)
        self.vision = vision if vision is not None else vision_of(model)
        self.context = min(context, model.config.max_position_embeddings)
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        self.cache = (
            cache
            if cache is not None
            else Cache(model, max_seq_len=cache_tokens(self.context, max_concurrent, page_size), page_size=page_size)
        )
        self.stop_token_ids = sorted(self.tokenizer.eos_token_ids)
        self.created = int(time.time())
        self.in_flight = 0  # requests holding a job, running or waiting (event loop only)
        self.generator: DynamicGeneratorAsync | None = None
        self._owns_generator = True  # False for a shared one: its owner starts and closes it
        self._vision_pool = ThreadPoolExecutor(1, thread_name_prefix="tandem-server-vision")

    @classmethod
    def shared(
        cls,
        *,
        model: Any,
        tokenizer: Any,
        template: ChatTemplate,
        cache: Cache,
        generator: DynamicGeneratorAsync,
        context: int,
        vision: Any,
        name: str,
        max_concurrent: int = 8,
        max_queue: int = 64,
    ) -> ServedModel:
        """Serve a model someone else loaded and runs (the app): requests' jobs join `generator`, which this
        object neither starts nor closes; `max_concurrent` and `max_queue` only bound the requests let in."""
        served = cls(
            model,
            name,
            context,
            max_concurrent,
            max_queue,
            tokenizer=tokenizer,
            template=template,
            cache=cache,
            vision=vision,
        )
        served.generator = generator
        served._owns_generator = False
        return served

    @classmethod
    def load(cls, path: Path, model_id: str | None = None, dtype: torch.dtype | None = None, device: str = "cpu", **kw):
        from engine.models import Model

        model = Model.load(path, device=device, dtype=dtype)
        name = model_id or (path.stem if path.suffix == ".gguf" else path.name)
        return cls(model, name, **kw)

    # --- lifetime (on the event loop) ----------------------------------------------------------------------

    def start(self) -> None:
        if not self._owns_generator:
            return
        self.generator = DynamicGeneratorAsync(
            self.model, self.cache, self.tokenizer, max_batch_size=self.max_concurrent
        )

    async def close(self) -> None:
        if self.generator is not None and self._owns_generator:
            await self.generator.close()
        self._vision_pool.shutdown(wait=False)

    def pages_in_use(self) -> int:
        """Cache pages some job holds now (pages that only keep a cached prefix are free)."""
        # A shared generator the app has retired keeps no generator (nor pages) behind it.
        inner = self.generator.generator if self.generator is not None else None
        table = inner.page_table if inner is not None else None
        return 0 if table is None else table.num_pages - table.num_free

    # --- prompts -------------------------------------------------------------------------------------------

    def check_model(self, name: str) -> None:
        if name != self.model_id:
            raise APIError(
                404,
                f"The model '{name}' does not exist here; this server serves '{self.model_id}' (GET /v1/models).",
                param="model",
                code="model_not_found",
            )

    async def chat_prompt(self, chat: ChatInput, options: dict[str, Any] | None = None) -> tuple[torch.Tensor, list]:
        """(prompt ids [1, n], image embeddings) of a conversation, through the model's chat template with
        `options` as template variables (chat_template_kwargs)."""
        images = await self._embed(chat.images)
        placeholder = getattr(self.vision, "image_placeholder", None)
        try:
            ids = await asyncio.to_thread(
                lambda: encode_chat(
                    self.tokenizer, self.template, chat.messages, images, placeholder, **(options or {})
                )
            )
        except ChatTemplateError as e:
            raise bad_request(str(e), "messages") from None
        except ValueError as e:
            raise bad_request(f"The messages cannot be put into this model's chat template: {e}", "messages") from None
        return ids, images

    async def completion_prompt(self, prompt: str | list[int]) -> torch.Tensor:
        """Prompt ids [1, n] of a raw prompt: special-token text is read as special tokens (as Hugging Face
        tokenizers do), and BOS is added where the model wants it and the text lacks it."""
        if isinstance(prompt, list):
            return torch.tensor([prompt], dtype=torch.long)
        bos = self.tokenizer.bos_token
        add_bos = bool(self.tokenizer.add_bos_token) and not (bos and prompt.startswith(bos))
        return await asyncio.to_thread(
            lambda: self.tokenizer.encode(prompt, add_bos=add_bos, encode_special_tokens=True)
        )

    async def _embed(self, images: list[bytes]) -> list:
        if not images:
            return []
        if self.vision is None:
            raise bad_request(
                f"The model '{self.model_id}' cannot see images; send text only, or serve a vision model.", "messages"
            )
        loop = asyncio.get_running_loop()
        embedded = []
        for i, data in enumerate(images):
            try:
                embedded.append(
                    await loop.run_in_executor(
                        self._vision_pool,
                        lambda d=data: self.vision.get_image_embeddings(tokenizer=self.tokenizer, image=d),
                    )
                )
            except ValueError as e:  # ImageError: not an image, truncated, too large
                raise bad_request(f"Image {i + 1} of the request cannot be used: {e}", "messages") from None
        return embedded

    # --- jobs ----------------------------------------------------------------------------------------------

    def start_job(
        self, ids: torch.Tensor, images: list, generation: Generation, prompt_param: str = "messages"
    ) -> DynamicJobAsync:
        """Enqueue the request's job; 400 when it cannot fit the context, 503 when the queue is full. A chat
        job (prompt_param "messages") of a reasoning model reports its reasoning apart from its answer."""
        num_prompt = int(ids.shape[-1])
        max_tokens = self._check_context(num_prompt, generation.max_tokens, prompt_param)
        if generation.logprobs:
            max_tokens = self._check_logprobs(max_tokens, asked=generation.max_tokens is not None)
        if self.in_flight >= self.max_concurrent + self.max_queue:
            raise APIError(
                503,
                f"The server is busy: {self.in_flight} requests are running or waiting (--max-concurrent "
                f"{self.max_concurrent}, --max-queue {self.max_queue}). Retry shortly.",
                code="server_overloaded",
                headers={"Retry-After": "1"},
            )
        if generation.min_tokens > max_tokens:
            raise bad_request(
                f"min_tokens ({generation.min_tokens}) is more than the {max_tokens} tokens this completion may have.",
                "min_tokens",
            )
        try:
            job = DynamicJobAsync(
                self.generator,
                ids,
                max_tokens,
                min_new_tokens=generation.min_tokens,
                gen_settings=generation.settings,
                seed=generation.seed,
                stop_conditions=[*self.stop_token_ids, *generation.stop],
                return_logits=generation.logprobs,
                filters=list(generation.filters),
                embeddings=images,
                reasoning=self.reasoning if prompt_param == "messages" else None,
                prompt_penalties=False,  # OpenAI's presence/frequency penalties count the completion only
            )
        except GeneratorClosedError:  # a shared generator whose owner swapped or unloaded the model just now
            raise APIError(
                503,
                f"The model '{self.model_id}' was unloaded or replaced while this request arrived. Retry shortly.",
                code="model_not_loaded",
                headers={"Retry-After": "1"},
            ) from None
        except ValueError as e:  # e.g. a logit_bias id outside the vocabulary, a stop string that is no text
            raise bad_request(str(e)) from None
        self.in_flight += 1
        return job

    def release(self) -> None:
        self.in_flight -= 1

    def _check_logprobs(self, max_tokens: int, asked: bool) -> int:
        vocab = self.model.config.vocab_size
        most = max(1, LOGPROBS_BYTES // (4 * vocab))
        if max_tokens <= most:
            return max_tokens
        if not asked:
            return most  # no max_tokens given: the completion may run until the logits budget is spent
        raise bad_request(
            f"With logprobs a completion keeps the model's {vocab} logits of every token, so max_tokens may be at "
            f"most {most} here (asked for {max_tokens}). Lower max_tokens, or ask without logprobs.",
            "max_tokens",
        )

    def _check_context(self, num_prompt: int, max_tokens: int | None, param: str) -> int:
        room = self.context - num_prompt
        if room < 1 or (max_tokens is not None and max_tokens > room):
            asked = f" and {max_tokens} for the completion ({num_prompt + max_tokens} in all)" if max_tokens else ""
            raise bad_request(
                f"This model's maximum context length is {self.context} tokens (--context). The prompt has "
                f"{num_prompt} tokens{asked}. Shorten the prompt or lower max_tokens.",
                param,
                code="context_length_exceeded",
            )
        return max_tokens if max_tokens is not None else room


def _template(tokenizer: Any, name: str) -> ChatTemplate:
    try:
        return ChatTemplate.from_tokenizer(tokenizer)
    except ChatTemplateError as e:
        # A broken template should not stop the server: ChatML is what most small models know.
        log.warning("%s: %s Using ChatML instead.", name, e)
        return ChatTemplate(None, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)
