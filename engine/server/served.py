"""The served model: one model, one paged cache and one DynamicGeneratorAsync that every request's job joins.

`python -m engine serve` builds its own (ServedModel(model, ...), which owns its cache and generator); the
app builds one over the model, cache and generator its chats already use (ServedModel.shared), so the
server's jobs and the chats' jobs batch together and share cached prefixes.

The routes never touch tensors or the generator directly; they ask this object for prompt ids, image
embeddings and jobs, which it gets from the model's chat front door (engine.chat.door, the one the app's chats
use) and words its refusals as API errors. Prompts and images are prepared off the event loop (a chat template
may take up to its 2 s render limit, a vision tower a forward pass), so one slow request never stalls the others'
streams.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from engine.cache import Cache
from engine.chat.door import ChatFrontDoor
from engine.chat.errors import ContextOverflow
from engine.chat.overflow import OverflowPolicy
from engine.chat.request import AnswerOptions, ChatRequest
from engine.chat_template import ChatTemplate
from engine.errors import ChatTemplateError
from engine.generator.dynamic_async import DynamicGeneratorAsync, DynamicJobAsync, GeneratorClosedError
from engine.server.errors import APIError, bad_request
from engine.server.messages import ChatInput
from engine.server.params import Generation
from engine.server.sizing import PAGE_SIZE, cache_size
from engine.tools.formats import tool_format_of
from engine.tools.schema import Tool, ToolChoice
from engine.tools.stream import ToolCallParser
from engine.tools.use import ToolUse
from engine.vision.handle import vision_of

log = logging.getLogger(__name__)

# The generator keeps every generated token's float32 logits row for a job that returns logits (logprobs need
# them), so such a job's length is bounded by this much memory: about 2,700 tokens for a 49k vocabulary.
LOGPROBS_BYTES = 512 * 1024 * 1024


class ServedModel:
    """A loaded model behind the server: prompt building, image embedding, and jobs on one generator.

    `context` is the most tokens one request may hold (prompt + completion). Jobs generate at once while
    the cache's free pages hold their prompt and completion (`cache_tokens` sizes it, engine/server/sizing.py);
    `max_concurrent`, when given, caps them too. `max_queue` is the requests allowed to wait beyond the
    most that can run before the server answers 503. `priority` is its jobs' place in the generator's
    admission order (DynamicJob.priority): a shared generator's owner puts its own jobs first. `overflow` is
    what a chat longer than the context gets (engine.chat.overflow): `stop` answers 400, the others drop turns.
    """

    def __init__(
        self,
        model: Any,
        model_id: str,
        context: int = 8192,
        max_concurrent: int | None = None,
        max_queue: int = 64,
        page_size: int = PAGE_SIZE,
        *,
        cache_tokens: int | None = None,
        priority: int = 0,
        tokenizer: Any = None,
        template: ChatTemplate | None = None,
        cache: Cache | None = None,
        vision: Any = None,
        chat: ChatFrontDoor | None = None,
        overflow: OverflowPolicy | str = OverflowPolicy.STOP,
        kv_format: str = "bf16",
    ):
        """`tokenizer`, `template`, `cache` and `vision` default to the model's own and a new cache; `chat`, the
        front door requests go through, to a new one over them (pass the owner's to share its image cache)."""
        if context < 2 or (max_concurrent is not None and max_concurrent < 1) or max_queue < 0:
            raise ValueError(
                f"context must be >= 2, max_concurrent None or >= 1 and max_queue >= 0; got {context}, "
                f"{max_concurrent}, {max_queue}"
            )
        if cache_tokens is not None and cache_tokens < 1:
            raise ValueError(f"cache_tokens must be None (the default budget) or >= 1; got {cache_tokens}")
        self.model = model
        self.model_id = model_id
        self.tokenizer = tokenizer if tokenizer is not None else model.tokenizer
        self.template = template if template is not None else _template(self.tokenizer, model_id)
        self.vision = vision if vision is not None else vision_of(model)
        context = min(context, model.config.max_position_embeddings)
        if chat is None:
            chat = ChatFrontDoor(model, self.tokenizer, self.template, context_length=context, vision=self.vision)
        elif chat.context_length != context:
            raise ValueError(
                f"the chat front door's context ({chat.context_length} tokens) differs from the served context "
                f"({context}); serve the context the door was built with"
            )
        self.chat = chat
        self.overflow = OverflowPolicy.parse(overflow)
        # Chat replies put a reasoning model's thinking in reasoning_content (as vLLM and DeepSeek's API do).
        self.reasoning = chat.reasoning
        # The model's tool-call syntax, read from its chat template (engine.tools.formats).
        self.tool_format = tool_format_of(self.template, self.tokenizer)
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        self.priority = priority
        self.cache = (
            cache
            if cache is not None
            else Cache(
                model,
                max_seq_len=cache_size(context, cache_tokens, page_size),
                page_size=page_size,
                kv_format=kv_format,
            )
        )
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
        max_concurrent: int | None = None,
        max_queue: int = 64,
        priority: int = 0,
        chat: ChatFrontDoor | None = None,
        overflow: OverflowPolicy | str = OverflowPolicy.STOP,
    ) -> ServedModel:
        """Serve a model someone else loaded and runs (the app): requests' jobs join `generator`, which this
        object neither starts nor closes; `max_concurrent` and `max_queue` only bound the requests let in, and
        `priority` below the owner's jobs' lets the owner's go first. `chat` is the owner's front door, whose
        image embeddings the requests then share."""
        served = cls(
            model,
            name,
            context,
            max_concurrent,
            max_queue,
            priority=priority,
            tokenizer=tokenizer,
            template=template,
            cache=cache,
            vision=vision,
            chat=chat,
            overflow=overflow,
        )
        served.generator = generator
        served._owns_generator = False
        return served

    @property
    def context(self) -> int:
        """The most tokens one request may hold (prompt + completion): the front door's context."""
        return self.chat.context_length

    @context.setter
    def context(self, tokens: int) -> None:
        self.chat.context_length = tokens

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
        # max_batch_size None: as many jobs as free pages hold (the generator's rule), capped by --max-concurrent
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

    async def chat_prompt(
        self, chat: ChatInput, options: dict[str, Any] | None = None, generation: Generation | None = None
    ) -> tuple[torch.Tensor, list]:
        """(prompt ids [1, n], image embeddings in them) of a conversation, through the model's chat template with
        `options` as template variables (chat_template_kwargs). Past the context, the overflow policy keeps the
        turns that leave room for `generation`'s max_tokens (a quarter of the context when it asks none)."""
        images = await self._embed(chat.images)
        request = ChatRequest(chat.messages, images=images, template_options=options or {}, overflow=self.overflow)
        asked = generation.max_tokens if generation is not None else None
        reserve = self.chat.answer_room(AnswerOptions(max_new_tokens=asked, shorten_to_fit=False))
        try:
            prompt = await asyncio.to_thread(self.chat.prompt, request, reserve)
        except ChatTemplateError as e:
            raise bad_request(str(e), "messages") from None
        except ValueError as e:
            raise bad_request(f"The messages cannot be put into this model's chat template: {e}", "messages") from None
        if prompt.dropped:
            log.info(
                "context overflow (%s): dropped messages %d to %d",
                self.overflow.value,
                prompt.dropped.start,
                prompt.dropped.stop - 1,
            )
        return prompt.ids, list(prompt.images)

    def tool_use(self, tools: tuple[Tool, ...], choice: ToolChoice, parallel: bool) -> ToolUse:
        """A request's tools in this model's call syntax."""
        return ToolUse(self.tool_format, tools, choice, parallel)

    def tool_job(
        self, use: ToolUse, ids: torch.Tensor, generation: Generation
    ) -> tuple[Generation, ToolCallParser | None]:
        """`generation` with the filter that holds the answer to the call syntax (replacing a response_format's,
        which then holds the text answers of tool_choice auto), and the parser that reads the answer's calls."""
        schema = next((f.schema for f in generation.filters if isinstance(getattr(f, "schema", None), dict)), None)
        try:
            job = use.prepare(self.tokenizer, ids, self.reasoning, schema)
        except ValueError as e:
            raise bad_request(f"The tools cannot be made into a grammar for this model: {e}", "tools") from None
        if job.parser is None:
            return generation, None
        replaced = dataclasses.replace(generation, filters=job.filters, decode_special_tokens=job.decode_special_tokens)
        return replaced, job.parser

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
        """The images' embeddings, each through the front door's cache (its vision tower on a miss)."""
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
                embedded.append(await loop.run_in_executor(self._vision_pool, self.chat.embed_image, data))
            except ValueError as e:  # ImageError: not an image, truncated, too large
                raise bad_request(f"Image {i + 1} of the request cannot be used: {e}", "messages") from None
        return embedded

    # --- jobs ----------------------------------------------------------------------------------------------

    def start_job(
        self, ids: torch.Tensor, images: list, generation: Generation, prompt_param: str = "messages"
    ) -> DynamicJobAsync:
        """Enqueue the request's job; 400 when it cannot fit the context, 503 when the queue is full. A chat
        job (prompt_param "messages") of a reasoning model reports its reasoning apart from its answer."""
        answer = AnswerOptions(
            settings=generation.settings,
            max_new_tokens=generation.max_tokens,
            shorten_to_fit=False,  # the client asked for max_tokens: refuse rather than give fewer
            min_new_tokens=generation.min_tokens,
            stop=generation.stop,
            seed=generation.seed,
            filters=generation.filters,
            return_logits=generation.logprobs,
            prompt_penalties=False,  # OpenAI's presence/frequency penalties count the completion only
            split_reasoning=prompt_param == "messages",
            priority=self.priority,
            decode_special_tokens=generation.decode_special_tokens,
        )
        max_tokens = self._fit(int(ids.shape[-1]), answer, prompt_param)
        if generation.logprobs:
            max_tokens = self._check_logprobs(max_tokens, asked=generation.max_tokens is not None)
        self._check_room()
        if generation.min_tokens > max_tokens:
            raise bad_request(
                f"min_tokens ({generation.min_tokens}) is more than the {max_tokens} tokens this completion may have.",
                "min_tokens",
            )
        try:
            job = self.chat.start_job(self.generator, ids, answer, max_new_tokens=max_tokens, images=images)
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

    def _check_room(self) -> None:
        """503 once as many requests hold a job as can run at once plus --max-queue: each running job holds at
        least one cache page, so without --max-concurrent the pages bound how many run."""
        running = self.max_concurrent if self.max_concurrent is not None else self.cache.num_pages
        if self.in_flight < running + self.max_queue:
            return
        cap = (
            f"--max-concurrent {self.max_concurrent}"
            if self.max_concurrent is not None
            else f"as many as the cache's {self.cache.num_pages} pages hold"
        )
        raise APIError(
            503,
            f"The server is busy: {self.in_flight} requests are running or waiting ({cap}, --max-queue "
            f"{self.max_queue}). Retry shortly.",
            code="server_overloaded",
            headers={"Retry-After": "1"},
        )

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

    def _fit(self, num_prompt: int, answer: AnswerOptions, param: str) -> int:
        """The completion's length (the front door's context check), or 400 naming the prompt's `param`."""
        try:
            return self.chat.fit(num_prompt, answer)
        except ContextOverflow as e:
            max_tokens = e.max_new_tokens
            asked = f" and {max_tokens} for the completion ({num_prompt + max_tokens} in all)" if max_tokens else ""
            raise bad_request(
                f"This model's maximum context length is {e.context_length} tokens (--context). The prompt has "
                f"{num_prompt} tokens{asked}. Shorten the prompt or lower max_tokens.",
                param,
                code="context_length_exceeded",
            ) from None


def _template(tokenizer: Any, name: str) -> ChatTemplate:
    try:
        return ChatTemplate.from_tokenizer(tokenizer)
    except ChatTemplateError as e:
        # A broken template should not stop the server: ChatML is what most small models know.
        log.warning("%s: %s Using ChatML instead.", name, e)
        return ChatTemplate(None, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)
