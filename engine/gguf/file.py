"""Open a GGUF file once: its metadata as plain Python values and its tensors as views of the mapped file.

The header is parsed here rather than by `gguf.GGUFReader`, which builds a numpy view for every element of
every array: for a large vocabulary and its merges that is most of a model's load time (and of the model
manager's first look at a file). Arrays of numbers come out of one
`numpy.frombuffer`, strings from one pass over the bytes; the result is the same values (tests compare
with GGUFReader on the starter and on files written by `gguf`'s own writer). Tensor data is never read
here: each tensor's `data` is a view of the memory map, shaped as GGUFReader shapes it (rows of blocks for
quantized types), and the `gguf` package still supplies the type tables and the dequantizers.

Layout (little-endian, or big-endian when the version reads swapped): "GGUF", version u32, tensor count
u64, key count u64; keys (string, value type u32, value); tensor infos (name, n_dims u32, dims u64 x n_dims
innermost first, type u32, offset u64); data from the next multiple of `general.alignment` (32 by default).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import CorruptFileError, MissingFileError

# value type -> (struct code, numpy dtype) for the fixed-size scalars
_SCALARS = {
    0: ("B", np.uint8),
    1: ("b", np.int8),
    2: ("H", np.uint16),
    3: ("h", np.int16),
    4: ("I", np.uint32),
    5: ("i", np.int32),
    6: ("f", np.float32),
    7: ("?", np.bool_),
    10: ("Q", np.uint64),
    11: ("q", np.int64),
    12: ("d", np.float64),
}
_STRING, _ARRAY = 8, 9
_MAX_COUNT = 1 << 31  # a count beyond this is damage, not a model (and would allocate without end)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file, as GGUFReader's ReaderTensor names its fields."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: np.ndarray  # dims, innermost first
    n_elements: int
    n_bytes: int
    data_offset: int  # from the start of the file
    data: np.ndarray  # a view of the mapped file


class _Reader:
    def __init__(self, buffer: memoryview, order: str):
        self.buffer, self.order, self.pos = buffer, order, 0

    def scalar(self, code: str) -> Any:
        size = struct.calcsize(code)
        (value,) = struct.unpack_from(self.order + code, self.buffer, self.pos)
        self.pos += size
        return value

    def count(self) -> int:
        n = self.scalar("Q")
        if n > _MAX_COUNT:
            raise ValueError(f"a count of {n} at byte {self.pos - 8}")
        return n

    def string(self) -> str:
        n = self.count()
        end = self.pos + n
        if end > len(self.buffer):
            raise ValueError(f"a string of {n} bytes runs past the end of the file")
        text = bytes(self.buffer[self.pos : end]).decode("utf-8")  # a key or a value: damage if not UTF-8
        self.pos = end
        return text

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind][0])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, n = self.scalar("I"), self.count()
            if item in _SCALARS:
                dtype = np.dtype(_SCALARS[item][1]).newbyteorder(self.order)
                end = self.pos + n * dtype.itemsize
                if end > len(self.buffer):
                    raise ValueError(f"an array of {n} values runs past the end of the file")
                values = np.frombuffer(self.buffer, dtype=dtype, count=n, offset=self.pos).tolist()
                self.pos = end
                return values
            if item == _STRING:
                return self._strings(n)
            return [self.value(item) for _ in range(n)]
        raise ValueError(f"unknown value type {kind} at byte {self.pos - 4}")

    def _strings(self, n: int) -> list[str]:
        # a vocabulary: tens of thousands of short strings, so the loop stays small; a token that is not
        # UTF-8 is kept with replacement characters, as the tokenizer has always read them
        buffer, unpack, order, pos = self.buffer, struct.unpack_from, self.order + "Q", self.pos
        out = []
        for _ in range(n):
            (size,) = unpack(order, buffer, pos)
            pos += 8
            out.append(bytes(buffer[pos : pos + size]).decode("utf-8", errors="replace"))
            pos += size
        if pos > len(buffer):
            raise ValueError("a string array runs past the end of the file")
        self.pos = pos
        return out


class GGUFFile:
    """A memory-mapped GGUF file: `metadata` (key -> str/int/float/bool/list) and `tensors`.

    Use `GGUFFile.open(path)`: loading a model reads the same file for its config, weights, tokenizer and
    chat template, and the model manager describes it too.
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
        self.path = Path(path)
        if not self.path.is_file():
            raise MissingFileError(f"{self.path} does not exist. Check the path to the .gguf file.")
        try:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
            self.byte_order, self.metadata, self.tensors = _parse(self._map, memoryview(self._map))
        except UnicodeDecodeError as e:
            raise CorruptFileError(
                f"{self.path} has unreadable metadata ({type(e).__name__}: {e}). It may be damaged; download it again."
            ) from None
        except (ValueError, struct.error, OSError) as e:
            raise CorruptFileError(
                f"{self.path} is not a readable GGUF file ({type(e).__name__}: {e}). "
                "It may be truncated or not a GGUF file at all; download it again."
            ) from None

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise CorruptFileError(f"{self.path} has no general.architecture entry; it is not a model GGUF.")
        return arch

    @cached_property
    def tensor_map(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}


def _parse(mapped: np.ndarray, buffer: memoryview) -> tuple[str, dict[str, Any], list[TensorInfo]]:
    """(byte order "I" little or "S" swapped as GGUFReader says it, metadata, tensors)."""
    import gguf

    if bytes(buffer[:4]) != b"GGUF":
        raise ValueError("the file does not start with the GGUF magic bytes")
    (version,) = struct.unpack_from("<I", buffer, 4)
    order, byte_order = ("<", "I") if version & 0xFFFF else (">", "S")  # a swapped version has its low bytes 0
    reader = _Reader(buffer, order)
    reader.pos = 4
    version = reader.scalar("I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (this reader knows 2 and 3)")
    num_tensors, num_keys = reader.count(), reader.count()
    metadata: dict[str, Any] = {}
    for _ in range(num_keys):
        key = reader.string()
        metadata[key] = reader.value(reader.scalar("I"))
    infos = []
    for _ in range(num_tensors):
        name = reader.string()
        dims = [reader.scalar("Q") for _ in range(reader.scalar("I"))]
        infos.append((name, dims, reader.scalar("I"), reader.scalar("Q")))
    alignment = int(metadata.get("general.alignment", 32)) or 32
    start = -(-reader.pos // alignment) * alignment
    tensors = []
    for name, dims, kind, offset in infos:
        qtype = gguf.GGMLQuantizationType(kind)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        n_elements = int(np.prod(dims, dtype=np.int64)) if dims else 1
        n_bytes = n_elements * size // block
        begin = start + offset
        if begin + n_bytes > mapped.shape[0]:
            raise ValueError(f"tensor {name} runs past the end of the file (truncated?)")
        rows = list(reversed(dims))
        if block == 1:  # float types: their own dtype, in the tensor's shape
            dtype = {0: np.float32, 1: np.float16}.get(kind)
            raw = mapped[begin : begin + n_bytes]
            data = raw.view(np.dtype(dtype).newbyteorder(order)).reshape(rows) if dtype else raw.reshape(*rows[:-1], -1)
        else:  # quantized: rows of block bytes
            data = mapped[begin : begin + n_bytes].reshape(*rows[:-1], rows[-1] // block * size)
        tensors.append(TensorInfo(name, qtype, np.array(dims, dtype=np.uint64), n_elements, n_bytes, begin, data))
    return byte_order, metadata, tensors


@lru_cache(maxsize=2)
def _open_cached(path: Path, mtime_ns: int, size: int) -> GGUFFile:
    # Keyed by modification time and size, so a file replaced on disk is read again.
    return GGUFFile(path)
