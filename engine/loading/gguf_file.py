"""Open a GGUF file once and expose its metadata as plain Python values."""

from __future__ import annotations

from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from engine.errors import CorruptFileError, MissingFileError


class GGUFFile:
    """A memory-mapped GGUF file: `metadata` (key -> str/int/float/bool/list) and `tensors`.

    Use `GGUFFile.open(path)`: parsing the header of a model with a large vocabulary takes seconds, and
    loading a model reads the same file for its config, weights, tokenizer and chat template.
    """

    @classmethod
    def open(cls, path: str | Path) -> GGUFFile:
        path = Path(path)
        try:
            stat = path.stat()
        except OSError:
            return cls(path)  # raises the clear MissingFileError
        return _open_cached(path.resolve(), stat.st_mtime_ns, stat.st_size)

    def __init__(self, path: str | Path):
        import gguf  # heavy import kept out of module import time

        self.path = Path(path)
        if not self.path.is_file():
            raise MissingFileError(f"{self.path} does not exist. Check the path to the .gguf file.")
        try:
            self.reader = gguf.GGUFReader(self.path, "r")
        except Exception as e:  # the reader raises ValueError/IndexError/struct errors on bad bytes
            raise CorruptFileError(
                f"{self.path} is not a readable GGUF file ({type(e).__name__}: {e}). "
                "It may be truncated or not a GGUF file at all; download it again."
            ) from None

    @cached_property
    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, fld in self.reader.fields.items():
            if key.startswith("GGUF."):
                continue
            out[key] = fld.contents()
        return out

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise CorruptFileError(f"{self.path} has no general.architecture entry; it is not a model GGUF.")
        return arch

    @property
    def tensors(self) -> list:
        return self.reader.tensors


@lru_cache(maxsize=2)
def _open_cached(path: Path, mtime_ns: int, size: int) -> GGUFFile:
    # Keyed by modification time and size, so a file replaced on disk is read again.
    return GGUFFile(path)
