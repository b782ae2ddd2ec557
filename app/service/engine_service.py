"""EngineService: the app's one bridge to the engine — the loaded model, its cache, and one async generator.

    GUI thread (qasync event loop)                  loader thread               engine thread
    load_model(path) -> task  --- start --------->  fetch the starter (opt.)
        loading_progress  <--- call_soon_threadsafe  Model.load, tokenizer,
                                                     cache
        swap: new generator in, old jobs cancelled, old generator closed ---->  (old thread ends)
    start_answer(...) / start_job(...) -> DynamicJobAsync  ----------------->  iterate() (forward passes)
    async for result in job  <---------------------- call_soon_threadsafe ---  results
    (answers, prompts and images: its LocalBackend, app.service.local_backend; loader work: app.service.loading)
    set_speculation(s) -> task  -------------> draft + its cache (thread), then the same swap, same model

A load is refused before any weight is read when the model, one chat at the chosen context and a working
overhead (engine.memory_fit) need more memory than is free: memory_refused and load_failed say so, and the
previous model keeps serving.

Every signal is emitted on the GUI thread: worker threads hand their news to the event loop with
call_soon_threadsafe, so no receiver ever runs on a worker thread and no forward pass runs on the GUI.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from PySide6.QtCore import QObject, Signal

from app.service.backend import AnswerJob, ImageSource
from app.service.catalog import model_display_name
from app.service.generation import GenerationSettings
from app.service.loaded import Loaded, Serving
from app.service.loading import (
    FetchFailed,
    FreeMemory,
    Loader,
    LoadFailed,
    Progress,
    Resolve,
    load_failure,
    starter_failure,
)
from app.service.local_backend import LocalBackend
from app.service.memory_plan import DEFAULT_CONTEXT_TOKENS, MAX_CACHE_TOKENS, PAGE_SIZE, free_memory_bytes
from app.service.speculation import Speculation, generator_arguments
from app.service.tool_request import ToolRequest
from app.service.workers import LOADER, in_worker
from engine import DynamicGeneratorAsync, DynamicJobAsync, MMEmbedding, Model, SamplerSettings, Tokenizer
from engine.loading.starter import fetch_starter, starter_path
from engine.memory_fit import MemoryNeed, NotEnoughMemoryError
from engine.model_info import ModelInfo
from engine.reasoning import ReasoningFormat

log = logging.getLogger(__name__)

# Top of the weights phase of the progress bar; the rest covers tokenizer and cache, 1.0 means ready.
_WEIGHTS_END = 0.9


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class EngineService(QObject):
    """Owns the loaded model, its Cache and one DynamicGeneratorAsync; the local Backend, by handing each model
    it installs to its LocalBackend (`local_backend`) and answering through it.

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
        prompt_cache_dir: Path | None = None,
    ):
        """`free_memory()` gives the bytes free for a new model (default: the device's, free_memory_bytes);
        loads are checked against it and the cache is sized from it."""
        super().__init__(parent)
        self._speculation = speculation or Speculation()
        self._installed_speculation: Speculation | None = None  # what the serving generator was made with
        self._device = torch.device(device) if device is not None else default_device()
        free_memory = free_memory or (lambda: free_memory_bytes(self._device))
        self._loader = Loader(self._device, dtype, page_size, max_cache_tokens, free_memory, prompt_cache_dir)
        self.local_backend = LocalBackend()  # the model and generator serving now, and the jobs started on them
        self._load_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()  # strong references: the loop keeps only weak ones
        self._latest_task: asyncio.Task | None = None
        self._swap: asyncio.Future | None = None  # the latest model swap (it outlives a cancelled load)
        self._requests = 0  # numbers load requests; only the newest waiting one runs
        self._progress_request = -1
        self._last_progress = -1.0
        self._closed = False

    # --- state -------------------------------------------------------------------------------------------

    @property
    def model(self) -> Model | None:
        loaded = self.local_backend.loaded
        return loaded.model if loaded else None

    @property
    def tokenizer(self) -> Tokenizer | None:
        loaded = self.local_backend.loaded
        return loaded.tokenizer if loaded else None

    @property
    def model_name(self) -> str | None:
        return self.local_backend.name

    @property
    def model_path(self) -> Path | None:
        """The folder or .gguf file the current model came from (for remembering it in the store)."""
        loaded = self.local_backend.loaded
        return loaded.path if loaded else None

    @property
    def context_request(self) -> int | None:
        """The context the current model was loaded for (None: the default, or no model)."""
        loaded = self.local_backend.loaded
        return loaded.context_request if loaded else None

    @property
    def kv_format(self) -> str | None:
        """The current model's KV cache format ("bf16", "q8", "q6", "q4"; None: no model)."""
        loaded = self.local_backend.loaded
        return loaded.cache.kv_format if loaded else None

    def serving(self) -> Serving | None:
        """What the local server shares now; None with no model. A model swap makes a new one."""
        loaded, generator = self.local_backend.loaded, self.local_backend.generator
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
            loaded.chat,
        )

    @property
    def speculation(self) -> Speculation:
        """How the generator drafts tokens (set_speculation changes it)."""
        return self._speculation

    def speculation_status(self) -> str:
        """What the serving generator does (with no model, the setting), e.g. "n-gram speculation"."""
        serving = self._installed_speculation if self.is_loaded else None
        return (serving or self._speculation).describe(self.model)

    @property
    def is_loading(self) -> bool:
        return any(not t.done() for t in self._tasks)

    # --- the Backend protocol, and the engine-level calls under it: its LocalBackend's ---------------------

    @property
    def name(self) -> str | None:
        return self.local_backend.name

    @property
    def is_loaded(self) -> bool:
        return self.local_backend.is_loaded

    @property
    def context_length(self) -> int:
        return self.local_backend.context_length

    @property
    def can_see_images(self) -> bool:
        return self.local_backend.can_see_images

    @property
    def images_off_reason(self) -> str | None:
        return self.local_backend.images_off_reason

    @property
    def reasoning_format(self) -> ReasoningFormat | None:
        return self.local_backend.reasoning_format

    @property
    def image_placeholder(self) -> str:
        return self.local_backend.image_placeholder

    @property
    def num_cached_images(self) -> int:
        return self.local_backend.num_cached_images

    async def start_answer(
        self,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str,
        images: Sequence[ImageSource],
        settings: GenerationSettings,
        identifier: object = None,
        tools: ToolRequest | None = None,
    ) -> AnswerJob:
        return await self.local_backend.start_answer(messages, system_prompt, images, settings, identifier, tools)

    async def embed_images(self, images: Sequence[ImageSource]) -> list[MMEmbedding]:
        return await self.local_backend.embed_images(images)

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str = "",
        images: Sequence[MMEmbedding] | None = None,
        template_options: Mapping[str, Any] | None = None,
    ) -> torch.Tensor:
        return self.local_backend.encode_chat(messages, system_prompt, images, template_options)

    def count_tokens(
        self,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str = "",
        images: Sequence[MMEmbedding] | None = None,
        image_sources: Sequence[ImageSource] | None = None,
    ) -> int:
        return self.local_backend.count_tokens(messages, system_prompt, images, image_sources)

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
        return self.local_backend.start_job(
            input_ids,
            settings,
            max_new_tokens=max_new_tokens,
            seed=seed,
            identifier=identifier,
            embeddings=embeddings,
            json_mode=json_mode,
        )

    # --- memory ------------------------------------------------------------------------------------------

    def free_memory(self) -> int | None:
        """Bytes free for a new model now (None when the platform does not say)."""
        return self._loader.free_memory()

    def check_fit(self, info: ModelInfo, context_length: int | None = None, kv_format: str = "bf16") -> MemoryNeed:
        """What loading `info`'s model here takes with one chat of `context_length` tokens (None:
        DEFAULT_CONTEXT_TOKENS; at most the model's own) in a cache of `kv_format`, in the dtype and weight
        layout this service loads it with. Raises NotEnoughMemoryError, naming what to change, when that is
        more than is free."""
        return self._loader.check_fit(info, context_length, kv_format)

    # --- loading -----------------------------------------------------------------------------------------

    def load_model(
        self, path: str | Path, name: str | None = None, context_length: int | None = None, kv_format: str = "bf16"
    ) -> asyncio.Task[bool]:
        """Start loading a Hugging Face folder or a .gguf file; returns the task (True when it got loaded).

        `context_length` caps the tokens one chat may hold (default: the model's own, as far as the cache
        allows); the load is refused, before any weight is read, when the model and one chat that long
        (DEFAULT_CONTEXT_TOKENS when None) need more memory than is free. `kv_format`: the KV cache's format
        ("bf16", "q8", "q6", "q4"; engine.cache.Cache).
        """
        path = Path(path).expanduser()
        name = name or model_display_name(path)
        return self._start(lambda report: path, name, 0.0, context_length=context_length, kv_format=kv_format)

    def fetch_and_load_starter(self, context_length: int | None = None, kv_format: str = "bf16") -> asyncio.Task[bool]:
        """Load the starter model, fetching it first (first half of the progress bar) when it is absent."""
        target = starter_path()
        return self._start(
            lambda report: fetch_starter(progress=report),
            model_display_name(target),
            fetch_share=0.0 if target.is_file() else 0.5,
            explain_fetch=starter_failure,
            context_length=context_length,
            kv_format=kv_format,
        )

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
        kv_format: str = "bf16",
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
        coro = self._load(self._requests, resolve, name, fetch_share, explain_fetch or str, context_length, kv_format)
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
        kv_format: str,
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
                loaded = await in_worker(
                    self._loader.prepare,
                    resolve,
                    name,
                    report_fetch,
                    report_weights,
                    context_length,
                    kv_format,
                    pool=LOADER,
                )
                if self._closed:
                    return False
                self._swap = asyncio.ensure_future(self._install(loaded))
                await asyncio.shield(self._swap)  # close() arriving now must not cut the swap in half
            except FetchFailed as e:
                self.load_failed.emit(explain_fetch(e.__cause__ or e))
                return False
            except LoadFailed as e:
                if isinstance(e.__cause__, NotEnoughMemoryError):
                    self.memory_refused.emit(str(e.path), e.__cause__.fitting_context)
                self.load_failed.emit(load_failure(e.__cause__ or e, name, e.path))
                return False
            except Exception as e:
                self.load_failed.emit(load_failure(e, name, None))
                return False
            self._on_progress(request, 1.0)
            log.info("%s ready: context %d tokens", name, loaded.context_length)
            self.model_loaded.emit(name)
            return True

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
            loaded = self.local_backend.loaded
            if loaded is None or self._closed or speculation != self._speculation:
                return False  # nothing to rebuild, or a newer setting came meanwhile (its own task installs it)
            if speculation == self._installed_speculation:
                return True  # a model load since the change already used it
            try:
                kwargs = await in_worker(generator_arguments, speculation, loaded.model, loaded.cache, pool=LOADER)
            except Exception:  # e.g. no memory for the draft's cache: keep serving as before
                log.exception("%s: could not set up %s", loaded.name, speculation.describe(loaded.model))
                if speculation == self._speculation:
                    self._speculation = self._installed_speculation or Speculation()
                return False
            if self._closed or self.local_backend.loaded is not loaded or speculation != self._speculation:
                return False
            self._swap = asyncio.ensure_future(self._install(loaded, speculation, kwargs))
            await asyncio.shield(self._swap)
            log.info("%s: %s", loaded.name, self.speculation_status())
            return True

    async def _install(
        self, loaded: Loaded, speculation: Speculation | None = None, kwargs: dict[str, Any] | None = None
    ) -> None:
        """Serve from `loaded` (with `speculation`, the current setting by default, and its generator
        arguments `kwargs` when already built); stop and close the previous generator."""
        speculation = speculation or self._speculation
        if kwargs is None:
            try:
                kwargs = await in_worker(generator_arguments, speculation, loaded.model, loaded.cache, pool=LOADER)
            except Exception:  # the model itself is fine: serve it without speculation rather than not at all
                log.exception("%s: could not set up %s; decoding plainly", loaded.name, speculation.describe())
                speculation, kwargs = Speculation(), {}
        generator = DynamicGeneratorAsync(
            loaded.model, loaded.cache, loaded.tokenizer, max_seq_len=loaded.context_length, **kwargs
        )
        self._installed_speculation = speculation
        # New jobs go to the new generator from here on, even while the old one is being stopped.
        old_generator, old_jobs = self.local_backend.serve(loaded, generator)
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
        generator, jobs = self.local_backend.serve(None, None)
        if generator is not None:
            await self._retire(generator, jobs)


__all__ = ["DEFAULT_CONTEXT_TOKENS", "EngineService", "Serving", "default_device"]
