"""One GGUF tensor into the weight the model takes: dequantized to float (through the `gguf` package), 4-bit
(`QuantizedWeight`), two 4-bit planes (`SplitWeight`), or left in its blocks (`BlockWeight`)."""

from __future__ import annotations

import warnings
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.errors import ModelLoadError
from engine.memory import release_freed_memory, release_mapped_pages
from engine.models.linear import BlockWeight, QuantizedWeight, SplitWeight
from kernels import ops


@cache
def can_dequantize(qtype: Any) -> bool:
    import gguf

    if qtype in (
        gguf.GGMLQuantizationType.F32,
        gguf.GGMLQuantizationType.F16,
        gguf.GGMLQuantizationType.BF16,
    ):
        return True
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    try:  # one all-zero block: the gguf package raises NotImplementedError for types it cannot decode
        gguf.quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def check_types(path: Path, tensors: list[Any], gguf: Any) -> None:
    bad = [t for t in tensors if not can_dequantize(t.tensor_type)]
    if bad:
        kinds = sorted({t.tensor_type.name for t in bad})
        raise ModelLoadError(
            f"{path}: tensor {bad[0].name} is stored as {', '.join(kinds)}, which the gguf package "
            f"(version {getattr(gguf, '__version__', 'installed')}) cannot dequantize. Use a GGUF quantized "
            "as F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, IQ4_NL, IQ4_XS or MXFP4, or update the gguf "
            "package."
        )


def dequantize(t: Any, gguf: Any) -> torch.Tensor:
    """One GGUF tensor as a float torch tensor in Hugging Face shape, copied out of the read-only mmap."""
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    qtype = t.tensor_type
    if qtype == gguf.GGMLQuantizationType.F32:
        return torch.from_numpy(np.array(t.data, dtype=np.float32)).reshape(shape)
    if qtype == gguf.GGMLQuantizationType.F16:
        return torch.from_numpy(np.array(t.data, dtype=np.float16)).reshape(shape)
    if qtype == gguf.GGMLQuantizationType.BF16:
        # the reader hands bfloat16 over as raw bytes; reinterpret them instead of widening in numpy
        raw = np.array(t.data, dtype=np.uint8).view(np.int16)
        return torch.from_numpy(raw).view(torch.bfloat16).reshape(shape)
    return torch.from_numpy(gguf.quants.dequantize(t.data, qtype)).reshape(shape)


def rows_and_cols(t: Any) -> tuple[int, int]:
    """A tensor's (rows, columns) as a matrix: GGUF dims run innermost first, and the outer ones of a 3-D tensor
    (a mixture-of-experts projection, [experts, rows, cols] in Hugging Face order) stack as rows, expert by
    expert, as the file lays them out."""
    dims = [int(d) for d in t.shape.tolist()]
    return int(np.prod(dims[1:], dtype=np.int64)), dims[0]


INT4_TYPES = ("Q4_0", "Q4_1")


def int4_weight(t: Any, dtype: torch.dtype) -> QuantizedWeight:
    """A Q4_0 / Q4_1 tensor's blocks as 4-bit values with a scale and zero per block of 32 columns.

    ggml's blocks: Q4_0 = f16 d, 16 bytes; value d * (q - 8). Q4_1 = f16 d, f16 m, 16 bytes; value d * q + m.
    Byte j of a block holds element j in its low nibble and element j + 16 in its high nibble. Both are
    (q - 8) * scale + zero with scale = d and zero = 0 (Q4_0) or m + 8 d (Q4_1).
    """
    num_rows, num_cols = rows_and_cols(t)
    has_min = t.tensor_type.name == "Q4_1"
    header = 4 if has_min else 2
    blocks = torch.from_numpy(np.array(t.data, dtype=np.uint8)).reshape(num_rows, num_cols // 32, header + 16)
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()  # [N, K / 32]
    qs = blocks[..., header:]
    values = torch.cat((qs & 15, qs >> 4), dim=-1).reshape(num_rows, num_cols)  # [N, K] uint8
    if has_min:
        zeros = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float() + 8.0 * d
    else:
        zeros = torch.zeros_like(d)
    return QuantizedWeight(values, d, zeros, group_size=32, dtype=dtype)


INT8_TYPES = ("Q8_0",)


def block_weight(t: Any, dtype: torch.dtype) -> BlockWeight:
    """A block-quantized tensor as its rows of blocks: a view of the memory-mapped file, not a copy, so its
    pages are the file's own (read in as the kernels first touch them, never duplicated)."""
    num_rows, num_cols = rows_and_cols(t)
    with warnings.catch_warnings():  # the map is read-only, and so is every use of the blocks
        warnings.simplefilter("ignore", UserWarning)
        blocks = torch.from_numpy(t.data.view(np.uint8)).reshape(num_rows, -1)
    expected = ops.block_row_bytes(t.tensor_type.name, num_cols)
    if blocks.shape[1] != expected:
        raise ValueError(f"{blocks.shape[1]} bytes per row, not {expected}")
    return BlockWeight([(blocks, t.tensor_type.name)], num_cols, dtype)


def packed(weight: BlockWeight, t: Any) -> BlockWeight:
    """`weight` in the layout its kernel reads. Where that is a copy (a repacked type), the file's pages it was
    read from leave the process's resident memory at once, so the load's peak stays near its end state."""
    packed = weight.packed()
    if packed.parts[0][0].data_ptr() != weight.parts[0][0].data_ptr():
        release_mapped_pages(t.data.ctypes.data, int(t.n_bytes))
        release_freed_memory()  # the repacking's temporaries (engine/memory.py)
    return packed


def int8_weight(t: Any, dtype: torch.dtype) -> SplitWeight:
    """A Q8_0 tensor as two 4-bit planes (`SplitWeight`): ggml's block is f16 d and 32 int8 q, value d * q."""
    num_rows, num_cols = rows_and_cols(t)
    blocks = torch.from_numpy(np.array(t.data, dtype=np.uint8)).reshape(num_rows, num_cols // 32, 2 + 32)
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()  # [N, K / 32]
    q = blocks[..., 2:].contiguous().view(torch.int8).reshape(num_rows, num_cols)
    return SplitWeight.from_int8(q, d, group_size=32, dtype=dtype)
