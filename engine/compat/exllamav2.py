"""exllamav2's names over Tandem's engine, so code written for exllamav2's dynamic generator runs with only
its imports changed. exllamav2 builds objects before the weights exist, so model and cache are handles:

    config = ExLlamaV2Config(path)            reads config.json / GGUF metadata, no weights
    model = ExLlamaV2(config)                 holds the config; no engine Model yet
    cache = ExLlamaV2Cache(model, lazy=True)  sized from config.max_seq_len; no tensors yet
                                              (ExLlamaV2Cache_Q8/_Q6/_Q4: the same with 8/6/4-bit pages)
    model.load_autosplit(cache)               engine Model loaded, then every pending cache allocated

The generator classes give the engine generator the engine objects inside the handles; the engine never
imports this module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from engine.cache.cache import Cache
from engine.config.model import ModelConfig
from engine.errors import MissingFileError, ModelLoadError
from engine.generator.dynamic import DynamicGenerator
from engine.generator.dynamic_async import DynamicGeneratorAsync, DynamicJobAsync
from engine.generator.guidance import padding_id
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.models.base import Model
from engine.tokenizer.tokenizer import Tokenizer
from engine.vision.embedding import MMEmbedding

log = logging.getLogger(__name__)

PAGE_SIZE = 256  # exllamav2's dynamic-generator page size; also the engine Cache's default
Callback = Callable[[int, int], None]  # exllamav2's load callback(done, total)
Progress = bool | Callable[[float], None]  # True: log the load; a callable gets the fraction loaded


class ExLlamaV2Config:
    """A model's location and config, read without weights from a Hugging Face folder or a .gguf file.

    Set `max_seq_len` before creating a cache to size it. After `prepare()` (run by the constructor too):
    `architecture` / `arch.arch_string`, `eos_token_id`, `arch_config` (the engine ModelConfig) and its fields
    (`vocab_size`, `head_dim`, ...). Tandem's `device` / `dtype`: None picks CUDA if available / the default.
    """

    def __init__(self, model_dir: str | Path | None = None):
        self.model_dir = None if model_dir is None else str(model_dir)
        self.max_seq_len = self.max_input_len = 2048  # max_seq_len becomes the model's context in prepare()
        self.max_batch_size, self.max_attention_size = 1, 2048**2  # read by exllamav2 code, unused here
        self.device: str | torch.device | None = None
        self.dtype: torch.dtype | None = None
        self.arch_config: ModelConfig | None = None
        self._gguf = None  # the opened GGUF file, shared with the tokenizer: opening one takes seconds
        if self.model_dir is not None:
            self.prepare()

    def prepare(self) -> None:
        """Read the model's config; raises MissingFileError / ModelLoadError naming the path."""
        if self.model_dir is None:
            raise ValueError("config.model_dir is not set: use ExLlamaV2Config('/path/to/model')")
        path = Path(self.model_dir).expanduser()
        if not path.exists():
            raise MissingFileError(f"{path} does not exist. Set model_dir to a model folder or a .gguf file.")
        if path.is_dir():
            self._gguf = None
            config = ModelConfig.from_file(path / "config.json")
        elif path.suffix.lower() == ".gguf":
            from engine.config.gguf import read_gguf_config
            from engine.gguf.file import GGUFFile

            if self._gguf is None or self._gguf.path != path:  # examples call prepare() twice
                self._gguf = GGUFFile.open(path)
            config = read_gguf_config(self._gguf)
        else:
            raise ModelLoadError(f"{path} is a file but not a .gguf file. Pass a .gguf file or a folder.")
        self.arch_config = config
        self.architecture = config.architecture
        self.arch = SimpleNamespace(arch_string=config.architecture)
        self.eos_token_id = config.eos_token_ids[0] if config.eos_token_ids else None
        self.max_seq_len = config.max_position_embeddings

    def arch_compat_overrides(self) -> None:
        """exllamav2 adjusts settings per architecture here; the engine needs no overrides."""

    def __getattr__(self, name: str) -> Any:
        # Reached only for names not set above: the model's own config fields.
        config = self.__dict__.get("arch_config")
        if config is not None and not name.startswith("_") and hasattr(config, name):
            return getattr(config, name)
        hint = "; call prepare() first" if config is None else ""
        raise AttributeError(f"ExLlamaV2Config has no attribute {name!r}{hint}")


class ExLlamaV2:
    """A model handle: the config now, an engine Model (`engine_model`) after `load_autosplit()`/`load()`."""

    def __init__(self, config: ExLlamaV2Config, lazy_load: bool = False):
        if config.arch_config is None:
            config.prepare()
        self.config = config
        self._engine_model: Model | None = None
        self._pending_caches: list[ExLlamaV2Cache] = []  # created before loading, allocated by it

    @property
    def loaded(self) -> bool:
        return self._engine_model is not None

    @property
    def vision_model(self) -> ExLlamaV2VisionTower | None:
        """The vision tower of a loaded vision-language model (None for text models), as in the seed docs:
        `model.vision_model.get_image_embeddings(model=model, tokenizer=tokenizer, image=image)`."""
        if self._engine_model is None or getattr(self._engine_model, "vision", None) is None:
            return None
        return ExLlamaV2VisionTower(self.config, model=self)

    @property
    def engine_model(self) -> Model:
        if self._engine_model is None:
            raise RuntimeError(f"{self.config.model_dir} is not loaded: call load_autosplit(cache) first")
        return self._engine_model

    def load_autosplit(
        self,
        cache: ExLlamaV2Cache | None = None,
        reserve_vram: int | Sequence[int] | None = None,
        last_id_only: bool = False,
        callback: Callback | None = None,
        progress: Progress = False,
    ) -> None:
        """Load the weights whole onto `config.device`, then allocate this model's caches.

        `callback(done, 100)` and `progress` report loading; `reserve_vram` and `last_id_only` have no effect.
        """
        if cache is not None and cache.model is not self:
            raise ValueError("the cache was made for a different model; create it with ExLlamaV2Cache(model)")
        self.load(callback=callback, progress=progress)

    def load(
        self,
        gpu_split: Sequence[float] | None = None,
        callback: Callback | None = None,
        progress: Progress = False,
    ) -> None:
        """Load the weights whole onto `config.device` (see `load_autosplit`); one device only."""
        if gpu_split is not None and sum(1 for gb in gpu_split if gb) > 1:
            raise NotImplementedError(f"gpu_split={list(gpu_split)}: Tandem loads a model on one device")
        if self._engine_model is None:

            def report(fraction: float) -> None:
                if callback is not None:
                    callback(round(fraction * 100), 100)
                if callable(progress):
                    progress(fraction)

            path = self.config.model_dir
            if progress is True:
                log.info("loading %s", path)
            device = self.config.device or ("cuda" if torch.cuda.is_available() else "cpu")
            self._engine_model = Model.load(path, device=device, dtype=self.config.dtype, progress=report)
        pending, self._pending_caches = self._pending_caches, []
        for cache in pending:
            cache._allocate()


class ExLlamaV2Cache:
    """exllamav2's cache: a handle on an engine paged Cache (`engine_cache`).

    It holds `batch_size * max_seq_len` tokens shared by all jobs, rounded up to whole pages of 256; a
    `max_seq_len` of None or -1 means `model.config.max_seq_len`. The engine Cache is allocated when the
    model loads, or at once if it already has; `lazy` is accepted and changes nothing.
    """

    def __init__(
        self,
        model: ExLlamaV2,
        batch_size: int = 1,
        max_seq_len: int | None = -1,
        lazy: bool = False,
    ):
        if not isinstance(model, ExLlamaV2):
            raise TypeError(f"ExLlamaV2Cache takes an ExLlamaV2 model, not {type(model).__name__}")
        seq_len = model.config.max_seq_len if max_seq_len in (None, -1) else max_seq_len
        if not isinstance(seq_len, int) or seq_len < 1 or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"max_seq_len ({seq_len!r}) and batch_size ({batch_size!r}) must be ints >= 1")
        self.model, self.batch_size, self.lazy, self.page_size = model, batch_size, lazy, PAGE_SIZE
        self.max_seq_len = -(-batch_size * seq_len // PAGE_SIZE) * PAGE_SIZE
        self._engine_cache: Cache | None = None
        if model.loaded:
            self._allocate()
        else:
            model._pending_caches.append(self)

    kv_format = "bf16"  # the engine Cache's page format (the quantized subclasses below set theirs)

    def _allocate(self) -> None:
        model = self.model.engine_model
        self._engine_cache = Cache(model, self.max_seq_len, page_size=self.page_size, kv_format=self.kv_format)

    @property
    def engine_cache(self) -> Cache:
        if self._engine_cache is None:
            raise RuntimeError("the cache is not allocated yet: call model.load_autosplit(cache) first")
        return self._engine_cache


class ExLlamaV2Cache_Q8(ExLlamaV2Cache):  # noqa: N801 (exllamav2's name)
    """ExLlamaV2Cache with pages of 8-bit codes (about 0.53x the bytes; engine/cache/cache.py's `kv_format`)."""

    kv_format = "q8"


class ExLlamaV2Cache_Q6(ExLlamaV2Cache):  # noqa: N801
    """ExLlamaV2Cache with pages of 6-bit codes (about 0.41x the bytes)."""

    kv_format = "q6"


class ExLlamaV2Cache_Q4(ExLlamaV2Cache):  # noqa: N801
    """ExLlamaV2Cache with pages of 4-bit codes (about 0.28x the bytes)."""

    kv_format = "q4"


class ExLlamaV2Tokenizer:
    """exllamav2's tokenizer over the engine Tokenizer (`engine_tokenizer`) of `config.model_dir`: `encode` /
    `decode` as in exllamav2 (string lists, batches), other attributes the engine Tokenizer's (`eos_token_id`,
    `pad_token_id`, `chat_template`, ...). `lazy_init` and `force_json` have no effect."""

    def __init__(self, config: ExLlamaV2Config, lazy_init: bool = True, force_json: bool = False):
        if config.model_dir is None:
            raise ValueError("config.model_dir is not set; create ExLlamaV2Config('/path/to/model') first")
        self.config = config
        gguf = config._gguf
        self.engine_tokenizer = Tokenizer.from_gguf(gguf) if gguf else Tokenizer.load(config.model_dir)

    def __getattr__(self, name: str) -> Any:
        if name == "engine_tokenizer":  # not set: __init__ failed part way
            raise AttributeError(name)
        return getattr(self.engine_tokenizer, name)

    def encode(
        self,
        text: str | Sequence[str],
        add_bos: bool = False,
        add_eos: bool = False,
        encode_special_tokens: bool = False,
        return_offsets: bool = False,
        embeddings: Sequence[Any] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Ids [1, n] of a string, or [batch, n] of a list of strings, left-padded with the pad id (else eos).

        return_offsets=True also returns each row's padding length, negated (IntTensor [batch]).
        """
        texts = [text] if isinstance(text, str) else list(text)
        if not texts:
            raise ValueError("encode got an empty list of strings")
        tok = self.engine_tokenizer
        rows = [tok.encode(t, add_bos, add_eos, encode_special_tokens, embeddings)[0] for t in texts]
        width = max(len(r) for r in rows)
        pad = padding_id(tok)  # the id a CFG job strips from the left of each row
        ids = torch.full((len(rows), width), pad, dtype=torch.long)  # [batch, width]
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = row
        if not return_offsets:
            return ids
        return ids, torch.tensor([len(r) - width for r in rows], dtype=torch.int)

    def decode(
        self, ids: torch.Tensor | Sequence[int] | Sequence[torch.Tensor], decode_special_tokens: bool = False
    ) -> str | list[str]:
        """A 1-D tensor or a list of ints gives a str; a [batch, n] tensor or a list of tensors gives one str
        per row, as in exllamav2 (so `decode(ids)[0]` for [1, n]). Pad ids are dropped, as exllamav2 does."""
        if isinstance(ids, torch.Tensor) and ids.dim() > 1:
            return [self.decode(row, decode_special_tokens) for row in ids]
        if isinstance(ids, (list, tuple)) and ids and all(isinstance(i, torch.Tensor) for i in ids):
            return [self.decode(i, decode_special_tokens) for i in ids]
        seq = ids.tolist() if isinstance(ids, torch.Tensor) else [int(i) for i in ids]
        pad = self.engine_tokenizer.pad_token_id
        return self.engine_tokenizer.decode([i for i in seq if i != pad], decode_special_tokens)

    def single_id(self, token: str) -> int | None:
        """The id of a vocabulary entry such as "<|im_end|>", or None."""
        return self.engine_tokenizer.piece_to_id(token)

    def get_vocab_size(self) -> int:
        return self.engine_tokenizer.vocab_size


class ExLlamaV2VisionTower:
    """exllamav2's vision tower handle. In Tandem the tower is part of the loaded model, so `load()` only
    checks that one exists; `get_image_embeddings` runs the engine model's `vision`."""

    def __init__(self, config: ExLlamaV2Config, model: ExLlamaV2 | None = None):
        self.config = config
        self._model = model

    def load(self, progress: Progress = False, callback: Callback | None = None) -> None:
        """Nothing to load separately; raises ValueError when the model has no vision tower."""
        arch = self.config.arch_config.architecture if self.config.arch_config else "this model"
        if self._model is not None and self._model.loaded and self._model.vision_model is None:
            raise ValueError(f"{arch} is a text-only model: it has no vision tower to load")

    def get_image_embeddings(self, model: Any, tokenizer: Any, image: Any, text_alias: str | None = None):
        """The MMEmbedding of one image (a PIL image, a path or bytes) for `model`."""
        engine_model = _unwrap(model)
        vision = getattr(engine_model, "vision", None)
        if vision is None:
            raise ValueError(f"{engine_model.config.architecture} is a text-only model and cannot see images")
        return vision.get_image_embeddings(
            model=engine_model, tokenizer=_unwrap(tokenizer), image=image, text_alias=text_alias
        )


class ExLlamaV2Sampler:
    """exllamav2's sampler namespace: `ExLlamaV2Sampler.Settings(...)` is the engine's SamplerSettings."""

    Settings = SamplerSettings


def _unwrap(obj: Any) -> Any:
    """The engine object a compat handle holds; anything else passes through unchanged."""
    if isinstance(obj, ExLlamaV2):
        return obj.engine_model
    if isinstance(obj, ExLlamaV2Cache):
        return obj.engine_cache
    return obj.engine_tokenizer if isinstance(obj, ExLlamaV2Tokenizer) else obj


class _Unwrapped:
    """Mixed in before an engine generator class: its parameters are DynamicGenerator's, and the engine objects
    inside the compat handles go on to that class's __init__ (the next in the MRO)."""

    def __init__(
        self,
        model: ExLlamaV2 | Model,
        cache: ExLlamaV2Cache | Cache,
        tokenizer: ExLlamaV2Tokenizer | Tokenizer,
        max_batch_size: int | None = None,
        max_seq_len: int | None = None,
        max_chunk_size: int | None = None,
        max_q_size: int = 8,
        draft_model: ExLlamaV2 | Model | None = None,
        draft_cache: ExLlamaV2Cache | Cache | None = None,
        num_draft_tokens: int = 4,
        use_ngram_draft: bool = False,
        max_ngram: int = 4,
        max_sampling_threads: int = 16,
        min_sampling_threads: int = 3,
        paged: bool = True,
        filter_background_eval: bool = True,
        adapt_threads: bool = True,
    ):
        super().__init__(
            _unwrap(model),
            _unwrap(cache),
            _unwrap(tokenizer),
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            max_chunk_size=max_chunk_size,
            max_q_size=max_q_size,
            draft_model=_unwrap(draft_model),
            draft_cache=_unwrap(draft_cache),
            num_draft_tokens=num_draft_tokens,
            use_ngram_draft=use_ngram_draft,
            max_ngram=max_ngram,
            max_sampling_threads=max_sampling_threads,
            min_sampling_threads=min_sampling_threads,
            paged=paged,
            filter_background_eval=filter_background_eval,
            adapt_threads=adapt_threads,
        )


class ExLlamaV2DynamicGenerator(_Unwrapped, DynamicGenerator):
    """The engine DynamicGenerator, taking the compat handles."""


class ExLlamaV2DynamicGeneratorAsync(_Unwrapped, DynamicGeneratorAsync):
    """The engine DynamicGeneratorAsync, taking the compat handles."""


ExLlamaV2MMEmbedding = MMEmbedding
ExLlamaV2DynamicJob = DynamicJob
ExLlamaV2DynamicJobAsync = DynamicJobAsync
