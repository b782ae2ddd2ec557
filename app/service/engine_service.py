"""EngineService: the app's one bridge to the engine — the loaded model, its cache, and one async generator.

    GUI thread (qasync event loop)                  loader thread               engine thread
    load_model(path) -> task  --- start --------->  fetch / download (opt.)
        loading_progress  <--- call_soon_threadsafe  Model.load, tokenizer,
                                                     cache
        swap: new generator in, old jobs cancelled, old generator closed ---->  (old thread ends)
    start_job(...) -> DynamicJobAsync  ------------------------------------->  iterate() (forward passes)
    async for result in job  <---------------------- call_soon_threadsafe ---  results
    await embed_images(paths) ----------------> vision worker: decode + vision tower (LRU per model)
    set_speculation(s) -> task  -------------> draft + its cache (thread), then the same swap, same model

A load is refused before any weight is read when the model, one chat at the chosen context and a working
overhead (engine.memory_fit) need more memory than is free: memory_refused and load_failed say so, and the
previous model keeps serving.

Every signal is emitted on the GUI thread: worker threads hand their news to the event loop with
call_soon_threadsafe, so no receiver ever runs on a worker thread and no forward pass runs on the GUI.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import torch
from PySide6.QtCore import QObject, Signal

from app.service.catalog import DEMO_VISION_NAME, demo_vision_available, download_from_hub, model_display_name
from app.service.images import IMAGE_CACHE_SIZE, EmbeddingCache, ImageSource, embed_all
from app.service.memory_plan import (
    DEFAULT_CONTEXT_TOKENS,
    MAX_CACHE_TOKENS,
    PAGE_SIZE,
    checked_context,
    free_memory_bytes,
    kv_bytes_per_token,
    plan_cache_tokens,
    weight_layout,
)
from app.service.speculation import Speculation, generator_arguments
from engine import Cache, DynamicGeneratorAsync, DynamicJobAsync, Model, SamplerSettings, Tokenizer
from engine.chat_prompt import encode_chat
from engine.chat_template import ChatTemplate
from engine.errors import ChatTemplateError, ModelLoadError
from engine.generator.filters import JSONFilter
from engine.loading.starter import fetch_starter, starter_path
from engine.memory_fit import MemoryNeed, NotEnoughMemoryError, check_memory
from engine.model_info import ModelInfo, read_model_info
from engine.models.vision import vision_of
from engine.vision.embedding import MMEmbedding
from engine.vision.prompt import DEFAULT_PLACEHOLDER, count_images

log = logging.getLogger(__name__)

T = TypeVar("T")
Progress = Callable[[float], None]
Resolve = Callable[[Progress], Path]  # runs on the loader thread: fetch or download, return what to load
FreeMemory = Callable[[], "int | None"]  # bytes free for a new model now; None when the platform does not say

# Top of the weights phase of the progress bar; the rest covers tokenizer and cache, 1.0 means ready.
_WEIGHTS_END = 0.9

# Settings-dict keys that are not SamplerSettings fields; start_job takes them as arguments instead.
JOB_KEYS = frozenset({"seed", "max_new_tokens", "json_mode"})
# What "JSON mode" holds an answer to: one JSON object, any keys and values.
JSON_MODE_SCHEMA = {"type": "object"}
SAMPLER_KEYS = frozenset(f.name for f in dataclasses.fields(SamplerSettings))


# ------------------------------------------------------------------------------------------- pure helpers


def sampler_settings(settings: Mapping[str, Any]) -> SamplerSettings:
    """SamplerSettings from a JSON-style settings dict (the store's and the sampler panel's form).

    Keys are SamplerSettings field names, plus "seed" and "max_new_tokens", which are ignored here
    (start_job takes them as arguments). JSON forms are accepted: `token_bias` with string token ids,
    lists for `disallowed_tokens` and `dry_sequence_breakers`. Raises ValueError naming an unknown key
    or a bad value.
    """
    unknown = sorted(set(settings) - SAMPLER_KEYS - JOB_KEYS)
    if unknown:
        raise ValueError(
            f"unknown sampler setting(s) {', '.join(map(repr, unknown))}; "
            f"known settings are {', '.join(sorted(SAMPLER_KEYS | JOB_KEYS))}"
        )
    values = {k: v for k, v in settings.items() if k in SAMPLER_KEYS}
    bias = values.get("token_bias")
    if isinstance(bias, Mapping):
        try:  # JSON object keys are strings
            values["token_bias"] = {int(k): v for k, v in bias.items()}
        except (TypeError, ValueError):
            raise ValueError(f"token_bias keys must be token ids, got {sorted(map(str, bias))[:5]}") from None
    try:
        return SamplerSettings(**values)
    except TypeError as e:  # a value of the wrong type is still a bad value for the caller
        raise ValueError(str(e)) from None


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ------------------------------------------------------------------------------------------------ service


@dataclasses.dataclass
class _Loaded:
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


class _FetchFailed(Exception):
    """Wraps an error raised while fetching or downloading, so its message can say so."""


class _LoadFailed(Exception):
    """Wraps an error raised while loading `path`, so the message can name the file."""

    def __init__(self, path: Path):
        super().__init__(str(path))
        self.path = path


class EngineService(QObject):
    """Owns the loaded model, its Cache and one DynamicGeneratorAsync; the GUI's only way to the engine.

    Needs an asyncio event loop on the GUI thread (qasync). `load_model` returns at once; the load runs
    on a loader thread and reports through the signals. Loads run one after another; a request that is
    replaced by a newer one before it starts is skipped. Until a new model is ready the previous one
    keeps serving, and stays when the load fails.
    """

    loading_started = Signal(str)  # display name of the model being loaded
    loading_progress = Signal(float)  # 0..1, increasing; 1.0 just before model_loaded
    model_loaded = Signal(str)
    load_failed = Signal(str)  # a message for the window; the previous model is still loaded
    # Just before load_failed when the model would not fit: its path and the longest context that fits
    # (0 when none does), so a window can offer that context.
    memory_refused = Signal(str, int)
    jobs_stopped = Signal()  # every job of the previous model has ended (model switch or close)

    def __init__(
        self,
        parent: QObject | None = None,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        page_size: int = PAGE_SIZE,
        max_cache_tokens: int = MAX_CACHE_TOKENS,
        speculation: Speculation | None = None,
        free_memory: FreeMemory | None = None,
    ):
        """`free_memory()` gives the bytes free for a new model (default: the device's, free_memory_bytes);
        loads are checked against it and the cache is sized from it."""
        super().__init__(parent)
        self._speculation = speculation or Speculation()
        self._installed_speculation: Speculation | None = None  # what the serving generator was made with
        self._json_filter: JSONFilter | None = None  # built on first use (llguidance compiles the grammar)
        self._device = torch.device(device) if device is not None else default_device()
        self._dtype = dtype
        self._page_size = page_size
        self._max_cache_tokens = max_cache_tokens
        self._free_memory = free_memory or (lambda: free_memory_bytes(self._device))
        self._loaded: _Loaded | None = None
        self._generator: DynamicGeneratorAsync | None = None
        self._jobs: weakref.WeakSet[DynamicJobAsync] = weakref.WeakSet()  # jobs of the current generator
        self._load_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()  # strong references: the loop keeps only weak ones
        self._latest_task: asyncio.Task | None = None
        self._swap: asyncio.Future | None = None  # the latest model swap (it outlives a cancelled load)
        self._requests = 0  # numbers load requests; only the newest waiting one runs
        self._progress_request = -1
        self._last_progress = -1.0
        self._closed = False
        # One worker for the vision tower: images are embedded one after another, never on the GUI thread.
        self._vision_worker: ThreadPoolExecutor | None = None

    # --- state -------------------------------------------------------------------------------------------

    @property
    def model(self) -> Model | None:
        return self._loaded.model if self._loaded else None

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self._loaded.tokenizer if self._loaded else None

    @property
    def model_name(self) -> str | None:
        return self._loaded.name if self._loaded else None

    @property
    def model_path(self) -> Path | None:
        """The folder or .gguf file the current model came from (for remembering it in the store)."""
        return self._loaded.path if self._loaded else None

    @property
    def context_length(self) -> int:
        """Tokens one chat may hold: the model's context, capped by the cache; 0 with no model."""
        return self._loaded.context_length if self._loaded else 0

    @property
    def context_request(self) -> int | None:
        """The context the current model was loaded for (None: the default, or no model)."""
        return self._loaded.context_request if self._loaded else None

    @property
    def can_see_images(self) -> bool:
        """Whether the loaded model takes images (it has a vision tower, e.g. a LLaVA model)."""
        return self._loaded is not None and self._loaded.vision is not None

    @property
    def image_placeholder(self) -> str:
        """The text the chat template writes for an image ("<image>" for LLaVA)."""
        vision = self._loaded.vision if self._loaded else None
        return getattr(vision, "image_placeholder", None) or DEFAULT_PLACEHOLDER

    @property
    def num_cached_images(self) -> int:
        """Image embeddings of the current model kept for reuse (0 with no model)."""
        return len(self._loaded.images) if self._loaded else 0

    @property
    def is_loaded(self) -> bool:
        return self._loaded is not None

    def serving(self) -> Serving | None:
        """What the local server shares now; None with no model. A model swap makes a new one."""
        loaded, generator = self._loaded, self._generator
        if loaded is None or generator is None:
            return None
        return Serving(
            loaded.name,
            loaded.model,
            loaded.tokenizer,
            loaded.template,
            loaded.cache,
            generator,
            loaded.context_length,
            loaded.vision,
        )

    @property
    def speculation(self) -> Speculation:
        """How the generator drafts tokens (set_speculation changes it)."""
        return self._speculation

    def speculation_status(self) -> str:
        """What the serving generator does (with no model, the setting), e.g. "n-gram speculation"."""
        serving = self._installed_speculation if self._loaded is not None else None
        return (serving or self._speculation).describe(self.model)

    @property
    def is_loading(self) -> bool:
        return any(not t.done() for t in self._tasks)

    # --- memory ------------------------------------------------------------------------------------------

    def free_memory(self) -> int | None:
        """Bytes free for a new model now (None when the platform does not say)."""
        return self._free_memory()

    def check_fit(self, info: ModelInfo, context_length: int | None = None) -> MemoryNeed:
        """What loading `info`'s model here takes with one chat of `context_length` tokens (None:
        DEFAULT_CONTEXT_TOKENS; at most the model's own), in the dtype and weight layout this service loads
        it with. Raises NotEnoughMemoryError, naming what to change, when that is more than is free."""
        layout = weight_layout(info, self._device, self._dtype)
        return check_memory(info, checked_context(info, context_length), self.free_memory(), *layout)

    def _check_memory(self, path: Path, context_length: int | None) -> None:
        """Loader thread: check_fit for the file at `path`. A file that cannot be described is left to the
        load, whose error names what is wrong with it."""
        try:
            info = read_model_info(path)
        except ModelLoadError:
            return
        self.check_fit(info, context_length)

    # --- loading -----------------------------------------------------------------------------------------

    def load_model(
        self, path: str | Path, name: str | None = None, context_length: int | None = None
    ) -> asyncio.Task[bool]:
        """Start loading a Hugging Face folder or a .gguf file; returns the task (True when it got loaded).

        `context_length` caps the tokens one chat may hold (default: the model's own, as far as the cache
        allows); the load is refused, before any weight is read, when the model and one chat that long
        (DEFAULT_CONTEXT_TOKENS when None) need more memory than is free.
        """
        path = Path(path).expanduser()
        return self._start(lambda report: path, name or model_display_name(path), 0.0, context_length=context_length)

    def fetch_and_load_starter(self, context_length: int | None = None) -> asyncio.Task[bool]:
        """Load the starter model, fetching it first (first half of the progress bar) when it is absent."""
        target = starter_path()
        return self._start(
            lambda report: fetch_starter(progress=report),
            model_display_name(target),
            fetch_share=0.0 if target.is_file() else 0.5,
            explain_fetch=_starter_failure,
            context_length=context_length,
        )

    def download_and_load(
        self, repo_id: str, dest_dir: str | Path | None = None, filename: str | None = None
    ) -> asyncio.Task[bool]:
        """Download a model from the Hugging Face Hub (catalog.download_from_hub), then load it.

        `dest_dir` defaults to the models folder; `filename` picks one .gguf of a repo holding several.
        Offline, load_failed says so within seconds.
        """
        from engine.paths import models_dir

        def resolve(report: Progress) -> Path:
            return download_from_hub(repo_id, dest_dir or models_dir(), report, filename=filename)

        name = Path(filename).stem if filename else repo_id.rsplit("/", 1)[-1]
        return self._start(resolve, name, fetch_share=0.5, explain_fetch=lambda e: f"Could not download {repo_id}: {e}")

    async def wait_loaded(self) -> bool:
        """Wait until no load is pending; True when the most recently requested load succeeded."""
        while self._latest_task is not None:
            task = self._latest_task
            try:
                ok = await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise  # the waiter itself was cancelled
                ok = False  # close() cancelled the load
            if task is self._latest_task:
                return ok
        return self.is_loaded

    def _start(
        self,
        resolve: Resolve,
        name: str,
        fetch_share: float,
        explain_fetch: Callable[[Exception], str] | None = None,
        context_length: int | None = None,
    ) -> asyncio.Task[bool]:
        if self._closed:
            raise RuntimeError("this EngineService is closed; create a new one to load models")
        if context_length is not None and context_length < 1:
            raise ValueError(f"context_length must be a positive number of tokens, got {context_length}")
        self._requests += 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called before the qasync loop runs: the task starts when it does
            loop = asyncio.get_event_loop()
        coro = self._load(self._requests, resolve, name, fetch_share, explain_fetch or str, context_length)
        task = loop.create_task(coro, name=f"load {name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._latest_task = task
        return task

    async def _load(
        self,
        request: int,
        resolve: Resolve,
        name: str,
        fetch_share: float,
        explain_fetch: Callable[[Exception], str],
        context_length: int | None,
    ) -> bool:
        async with self._load_lock:  # one load at a time: at most two models (old + new) in memory
            if request != self._requests or self._closed:
                log.info("skipping the load of %s: a newer load was requested or the service closed", name)
                return False
            self._progress_request, self._last_progress = request, -1.0
            self.loading_started.emit(name)
            report_fetch = self._progress_reporter(request, 0.0, fetch_share)
            report_weights = self._progress_reporter(request, fetch_share, _WEIGHTS_END)
            try:
                loaded = await _in_thread(self._prepare, resolve, name, report_fetch, report_weights, context_length)
                if self._closed:
                    return False
                self._swap = asyncio.ensure_future(self._install(loaded))
                await asyncio.shield(self._swap)  # close() arriving now must not cut the swap in half
            except _FetchFailed as e:
                self.load_failed.emit(explain_fetch(e.__cause__ or e))
                return False
            except _LoadFailed as e:
                if isinstance(e.__cause__, NotEnoughMemoryError):
                    self.memory_refused.emit(str(e.path), e.__cause__.fitting_context)
                self.load_failed.emit(_load_failure(e.__cause__ or e, name, e.path))
                return False
            except Exception as e:
                self.load_failed.emit(_load_failure(e, name, None))
                return False
            self._on_progress(request, 1.0)
            log.info("%s ready: context %d tokens", name, loaded.context_length)
            self.model_loaded.emit(name)
            return True

    def _prepare(
        self,
        resolve: Resolve,
        name: str,
        report_fetch: Progress,
        report_weights: Progress,
        context_length: int | None,
    ) -> _Loaded:
        """Loader thread: everything slow, so the GUI only swaps references."""
        try:
            path = Path(resolve(report_fetch))
        except Exception as e:
            raise _FetchFailed(str(e)) from e
        try:
            self._check_memory(path, context_length)  # before any weight is read: no swap storm
            model = Model.load(path, device=self._device, dtype=self._dtype, progress=report_weights)
            tokenizer = model.tokenizer
            template = _chat_template(tokenizer, path)
            model_context = model.config.max_position_embeddings
            if context_length is not None:
                model_context = min(model_context, context_length)
            num_tokens = plan_cache_tokens(
                model_context,
                kv_bytes_per_token(model.config, model.dtype),
                self.free_memory(),
                self._page_size,
                self._max_cache_tokens,
                min_tokens=min(model_context, context_length or DEFAULT_CONTEXT_TOKENS),
            )
            cache = Cache(model, num_tokens, page_size=self._page_size)
        except Exception as e:
            raise _LoadFailed(path) from e
        context = min(model_context, num_tokens)
        return _Loaded(path, name, model, tokenizer, template, cache, context, context_length, vision=vision_of(model))

    def _progress_reporter(self, request: int, low: float, high: float) -> Progress:
        """A progress callback for a worker thread, mapping its 0..1 onto [low, high] of the bar."""
        loop = asyncio.get_running_loop()

        def report(fraction: float) -> None:
            value = low + (high - low) * min(max(float(fraction), 0.0), 1.0)
            try:
                loop.call_soon_threadsafe(self._on_progress, request, value)
            except RuntimeError:
                pass  # the loop is closed: the app is shutting down

        return report

    def _on_progress(self, request: int, value: float) -> None:
        if request == self._progress_request and value > self._last_progress:
            self._last_progress = value
            self.loading_progress.emit(value)

    def set_speculation(self, speculation: Speculation) -> asyncio.Task[bool]:
        """Use `speculation` from now on; returns a task, True once a generator with it serves.

        With a model loaded, a new generator is made over the same model and cache (a draft model and its
        cache are built on a worker thread first). Answers still running are stopped, as on a model switch,
        since both generators would write into the one cache; what they wrote stays with their chats.
        """
        if self._closed:
            raise RuntimeError("this EngineService is closed; create a new one to change its speculation")
        if not isinstance(speculation, Speculation):
            raise TypeError(f"set_speculation takes a Speculation, not {type(speculation).__name__}")
        self._speculation = speculation
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called before the qasync loop runs: the task starts when it does
            loop = asyncio.get_event_loop()
        task = loop.create_task(self._respeculate(speculation))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _respeculate(self, speculation: Speculation) -> bool:
        async with self._load_lock:  # never while a model is being swapped in
            loaded = self._loaded
            if loaded is None or self._closed or speculation != self._speculation:
                return False  # nothing to rebuild, or a newer setting came meanwhile (its own task installs it)
            if speculation == self._installed_speculation:
                return True  # a model load since the change already used it
            try:
                kwargs = await _in_thread(generator_arguments, speculation, loaded.model, loaded.cache)
            except Exception:  # e.g. no memory for the draft's cache: keep serving as before
                log.exception("%s: could not set up %s", loaded.name, speculation.describe(loaded.model))
                if speculation == self._speculation:
                    self._speculation = self._installed_speculation or Speculation()
                return False
            if self._closed or self._loaded is not loaded or speculation != self._speculation:
                return False
            self._swap = asyncio.ensure_future(self._install(loaded, speculation, kwargs))
            await asyncio.shield(self._swap)
            log.info("%s: %s", loaded.name, self.speculation_status())
            return True

    async def _install(
        self, loaded: _Loaded, speculation: Speculation | None = None, kwargs: dict[str, Any] | None = None
    ) -> None:
        """Serve from `loaded` (with `speculation`, the current setting by default, and its generator
        arguments `kwargs` when already built); stop and close the previous generator."""
        speculation = speculation or self._speculation
        if kwargs is None:
            try:
                kwargs = await _in_thread(generator_arguments, speculation, loaded.model, loaded.cache)
            except Exception:  # the model itself is fine: serve it without speculation rather than not at all
                log.exception("%s: could not set up %s; decoding plainly", loaded.name, speculation.describe())
                speculation, kwargs = Speculation(), {}
        generator = DynamicGeneratorAsync(
            loaded.model, loaded.cache, loaded.tokenizer, max_seq_len=loaded.context_length, **kwargs
        )
        self._installed_speculation = speculation
        old_generator, old_jobs = self._generator, list(self._jobs)
        # New jobs go to the new generator from here on, even while the old one is being stopped.
        self._loaded, self._generator, self._jobs = loaded, generator, weakref.WeakSet()
        if old_generator is not None:
            await self._retire(old_generator, old_jobs)

    async def _retire(self, generator: DynamicGeneratorAsync, jobs: Sequence[DynamicJobAsync]) -> None:
        # Cancel first (it marks job.cancelled and frees the pages), then close to end the engine thread.
        await asyncio.gather(*(job.cancel() for job in jobs if job.generator is generator), return_exceptions=True)
        await generator.close()
        # The UI may keep finished jobs, and each points at its generator: drop the old model and cache
        # from it so their memory is freed now rather than when the last tab lets go.
        generator.generator = None
        if self._device.type == "cuda":
            torch.cuda.empty_cache()
        self.jobs_stopped.emit()

    # --- prompts and jobs --------------------------------------------------------------------------------

    async def embed_images(self, images: Sequence[ImageSource]) -> list[MMEmbedding]:
        """Embeddings of `images` (file paths, or encoded bytes) for the current model, in order.

        The vision tower runs on a worker thread, never on the GUI thread. Embeddings are kept per model
        by the sha256 of the image bytes (an LRU of IMAGE_CACHE_SIZE), so a chat resent or regenerated
        reuses them; the same image twice gives the same MMEmbedding. Raises ImageError (a ValueError
        naming the file) for an image that cannot be read, ValueError when the model cannot see images,
        RuntimeError with no model.
        """
        loaded = self._require_model()
        if loaded.vision is None:
            raise ValueError(_no_vision_message(loaded.name))
        if not images:
            return []
        if self._vision_worker is None:
            self._vision_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tandem-vision")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._vision_worker, embed_all, loaded, list(images))

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str = "",
        images: Sequence[MMEmbedding] | None = None,
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
            raise ValueError(_no_vision_message(loaded.name))
        return encode_chat(loaded.tokenizer, loaded.template, messages, images, self.image_placeholder)

    def count_tokens(
        self,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str = "",
        images: Sequence[MMEmbedding] | None = None,
        image_sources: Sequence[str | Path | bytes] | None = None,
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
            vision = getattr(loaded, "vision", None)
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
        settings: Mapping[str, Any],
        *,
        max_new_tokens: int,
        seed: int | None,
        identifier: object = None,
        embeddings: Sequence[MMEmbedding] | None = None,
        json_mode: bool = False,
    ) -> DynamicJobAsync:
        """Queue a generation on the current model; iterate it with `async for` and stop it with `await job.cancel()`.

        Call from the event loop. `settings` is a settings dict (see `sampler_settings`; unknown keys
        raise ValueError). `embeddings` are the images the ids were encoded with (`encode_chat(images=...)`).
        `json_mode` holds the answer to one JSON object (a JSONFilter over JSON_MODE_SCHEMA): it ends as
        soon as the object closes (eos_reason "end_filter"), and is valid JSON unless max_new_tokens cuts
        it first. Stops at the tokenizer's end-of-turn tokens or after `max_new_tokens`. Raises ValueError
        when prompt + max_new_tokens exceeds `context_length` or the embeddings do not match the ids.
        """
        gen_settings = sampler_settings(settings)
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
            **filters,
        )
        self._jobs.add(job)
        return job

    def _require_model(self) -> _Loaded:
        if self._loaded is None:
            raise RuntimeError("No model is loaded yet. Wait for the model to finish loading, or load one.")
        return self._loaded

    async def close(self) -> None:
        """Stop every job, close the generator and let the model go; pending loads are cancelled."""
        if self._closed:
            return
        self._closed = True
        self._progress_request = -1  # progress already on its way from a loader thread goes nowhere
        pending = [task for task in self._tasks if not task.done()]
        for task in pending:  # a load thread still running finishes into nothing
            task.cancel()
        await asyncio.gather(*pending, *([self._swap] if self._swap else []), return_exceptions=True)
        generator, jobs = self._generator, list(self._jobs)
        self._loaded, self._generator, self._jobs = None, None, weakref.WeakSet()
        if self._vision_worker is not None:
            self._vision_worker.shutdown(wait=False, cancel_futures=True)
            self._vision_worker = None
        if generator is not None:
            await self._retire(generator, jobs)


# ---------------------------------------------------------------------------------------------- internals


def _in_thread(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """Run `fn(*args)` on a new daemon thread; the future resolves on the calling event loop.

    A daemon thread rather than an executor: quitting the app mid-load must not wait for the load.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    def work() -> None:
        try:
            outcome, value = future.set_result, fn(*args)
        except Exception as e:
            outcome, value = future.set_exception, e
        except BaseException as e:  # never leave the future pending
            outcome, value = future.set_exception, RuntimeError(f"loading stopped: {e!r}")
        try:
            loop.call_soon_threadsafe(settle, outcome, value)
        except RuntimeError:
            pass  # the loop is closed

    threading.Thread(target=work, name="tandem-loader", daemon=True).start()
    return future


def _no_vision_message(name: str) -> str:
    return (
        f"The loaded model ({name}) cannot see images. Remove the images to send the text alone, or load a "
        f"vision model such as the bundled {DEMO_VISION_NAME.lower()} (Model menu)."
    )


def _chat_template(tokenizer: Tokenizer, path: Path) -> ChatTemplate:
    try:
        return ChatTemplate.from_tokenizer(tokenizer)
    except ChatTemplateError as e:
        # A broken template should not make the model unusable: ChatML is what most small models know.
        log.warning("%s: %s Using ChatML instead.", path, e)
        return ChatTemplate(None, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)


def _load_failure(error: BaseException, name: str, path: Path | None) -> str:
    """The window's message for a failed load; it always names the file when one is known."""
    where = f" ({path})" if path is not None and str(path) not in str(error) else ""
    if isinstance(error, ModelLoadError):
        return f"Could not load {name}{where}: {error}"
    if isinstance(error, torch.OutOfMemoryError | MemoryError):
        return (
            f"Could not load {name}{where}: not enough memory ({error}). "
            "Close other programs or choose a smaller (more quantized) model."
        )
    log.error("loading %s failed", name, exc_info=error)
    return f"Could not load {name}{where}: {type(error).__name__}: {error}"


def _starter_failure(error: Exception) -> str:
    return (
        f"Could not download the starter model: {error}\n\n"
        "Tandem needs one model to chat. Try again once online, or add a model you already have "
        "(a Hugging Face folder or a .gguf file) in the model manager."
        + (
            f" The {DEMO_VISION_NAME.lower()} bundled with Tandem needs no download: load it from the "
            "model manager (Model menu) to describe images offline."
            if demo_vision_available()
            else ""
        )
    )


__all__ = [
    "DEFAULT_CONTEXT_TOKENS",
    "EngineService",
    "default_device",
    "free_memory_bytes",
    "kv_bytes_per_token",
    "plan_cache_tokens",
    "sampler_settings",
]
