"""Loading a model for the app: the loader thread's work, and what the window says when it fails.

`Loader.prepare` runs on a loader thread (app.service.workers, pool LOADER) and builds everything slow —
fetch or download, the memory check, weights, tokenizer, chat template, a cache sized to free memory — so
the GUI thread only swaps references (EngineService).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from app.service.catalog import DEMO_VISION_NAME, demo_vision_available
from app.service.loaded import Loaded
from app.service.memory_plan import (
    DEFAULT_CONTEXT_TOKENS,
    checked_context,
    kv_bytes_per_token,
    plan_cache_tokens,
    weight_layout,
)
from engine import Cache, Model, Tokenizer
from engine.chat_template import ChatTemplate
from engine.errors import ChatTemplateError, ModelLoadError
from engine.memory_fit import MemoryNeed, check_memory, kv_format_problem
from engine.model_info import ModelInfo, read_model_info
from engine.paths import user_data_dir
from engine.vision.handle import vision_of

log = logging.getLogger(__name__)

PROMPT_CACHE_BYTES = 2 * 1024**3  # the app's disk tier: room for many long chats of a small model

Progress = Callable[[float], None]
Resolve = Callable[[Progress], Path]  # runs on the loader thread: fetch or download, return what to load
FreeMemory = Callable[[], "int | None"]  # bytes free for a new model now; None when the platform does not say


class FetchFailed(Exception):
    """Wraps an error raised while fetching or downloading, so its message can say so."""


class LoadFailed(Exception):
    """Wraps an error raised while loading `path`, so the message can name the file."""

    def __init__(self, path: Path):
        super().__init__(str(path))
        self.path = path


@dataclasses.dataclass(frozen=True)
class Loader:
    """How this app loads models: onto `device` in `dtype`, a paged cache of at most `max_cache_tokens`
    tokens (or one chosen context) in pages of `page_size`, sized from `free_memory()`. `prompt_cache_dir`:
    finished pages also go to that folder (at most `prompt_cache_bytes`), so a reopened app continues a long
    chat without recomputing it."""

    device: torch.device
    dtype: torch.dtype | str | None
    page_size: int
    max_cache_tokens: int
    free_memory: FreeMemory
    prompt_cache_dir: Path | None = None
    prompt_cache_bytes: int = PROMPT_CACHE_BYTES

    def check_fit(self, info: ModelInfo, context_length: int | None = None, kv_format: str = "bf16") -> MemoryNeed:
        """What loading `info`'s model takes with one chat of `context_length` tokens (None:
        DEFAULT_CONTEXT_TOKENS; at most the model's own) in a cache of `kv_format`, in the dtype and weight
        layout used here. Raises NotEnoughMemoryError, naming what to change, when that is more than is free,
        and ModelLoadError when the model cannot take `kv_format`."""
        problem = kv_format_problem(info.head_dim, kv_format)
        if problem is not None:
            raise ModelLoadError(problem[0].upper() + problem[1:] + ".")
        itemsize, keeps_blocks = weight_layout(info, self.device, self.dtype)
        context = checked_context(info, context_length)
        return check_memory(info, context, self.free_memory(), itemsize, keeps_blocks, kv_format)

    def prepare(
        self,
        resolve: Resolve,
        name: str,
        report_fetch: Progress,
        report_weights: Progress,
        context_length: int | None,
        kv_format: str = "bf16",
    ) -> Loaded:
        """Loader thread: fetch (`resolve`), check memory, load, with a cache in `kv_format` (engine.cache's
        KV_FORMATS). Raises FetchFailed or LoadFailed, each with the error as its cause.

        A chosen `context_length` gets its whole cache even past `max_cache_tokens` (the memory check has
        passed); without one the cache is at most `max_cache_tokens`."""
        try:
            path = Path(resolve(report_fetch))
        except Exception as e:
            raise FetchFailed(str(e)) from e
        try:
            self._check_memory(path, context_length, kv_format)  # before any weight is read: no swap storm
            model = Model.load(path, device=self.device, dtype=self.dtype, progress=report_weights)
            tokenizer = model.tokenizer
            template = _chat_template(tokenizer, path)
            model_context = model.config.max_position_embeddings
            if context_length is not None:
                model_context = min(model_context, context_length)
            chat_tokens = min(model_context, context_length or min(DEFAULT_CONTEXT_TOKENS, self.max_cache_tokens))
            num_tokens = plan_cache_tokens(
                model_context,
                kv_bytes_per_token(model.config, model.dtype, kv_format),
                self.free_memory(),
                self.page_size,
                self.max_cache_tokens,
                min_tokens=chat_tokens,
            )
            cache = Cache(model, num_tokens, page_size=self.page_size, kv_format=kv_format)
        except Exception as e:
            raise LoadFailed(path) from e
        if self.prompt_cache_dir is not None:
            try:
                cache.use_disk(self.prompt_cache_dir, self.prompt_cache_bytes)
            except OSError as e:  # an unwritable folder costs only speed: the model works from memory
                log.warning(
                    "the prompt cache folder %s cannot be used (%s); prompts are cached in memory only",
                    self.prompt_cache_dir,
                    e,
                )
        context = min(model_context, num_tokens)
        return Loaded(path, name, model, tokenizer, template, cache, context, context_length, vision=vision_of(model))

    def _check_memory(self, path: Path, context_length: int | None, kv_format: str) -> None:
        """check_fit for the file at `path`. A file that cannot be described is left to the load, whose
        error names what is wrong with it."""
        try:
            info = read_model_info(path)
        except ModelLoadError:
            return
        self.check_fit(info, context_length, kv_format)


def prompt_cache_dir() -> Path:
    """The data folder's prompt cache (TANDEM_DATA_DIR moves it with the data folder)."""
    return user_data_dir() / "prompt-cache"


def _chat_template(tokenizer: Tokenizer, path: Path) -> ChatTemplate:
    try:
        return ChatTemplate.from_tokenizer(tokenizer)
    except ChatTemplateError as e:
        # A broken template should not make the model unusable: ChatML is what most small models know.
        log.warning("%s: %s Using ChatML instead.", path, e)
        return ChatTemplate(None, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)


def load_failure(error: BaseException, name: str, path: Path | None) -> str:
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


def starter_failure(error: Exception) -> str:
    """The window's message when the starter model cannot be fetched."""
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
