"""Triton kernels for the ops in `kernels.ops`, and the dispatch candidates that choose them.

Each candidate below takes the op's arguments and returns None (so dispatch moves on to the torch twin)
unless every tensor is on a CUDA device, in a dtype and shape the kernel handles, and triton is installed.
Only then is the kernel module imported, so a CPU-only process never loads triton at all.

The kernel modules (`attention`, `attention_sinks`, `kv_write`, `kv_quant`, `norm`, `rope`, `activation`,
`gguf_matmul`) can also be called directly; the tests run them on CPU tensors under triton's interpreter, turned
on by `launch.use_interpreter()` before triton is first imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from functools import cache

import torch

from kernels.torch_ref.gguf_blocks import BLOCKS
from kernels.torch_ref.kv_quant import FORMATS, GROUP, row_bytes
from kernels.triton.launch import DTYPES

MAX_NORM_COLS = 16384  # the norm kernel keeps a row in registers
MAX_ROPE_HEAD_DIM = 512
MAX_QUANT_HEAD_DIM = 256  # the quantized attention kernels dequantize a whole head row of each key in registers


@cache
def is_available() -> bool:
    """Whether triton can be imported (checked once; a missing triton just means the twins run)."""
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


def _on_cuda(*tensors: torch.Tensor | None) -> bool:
    """All given tensors on one CUDA device, triton installed."""
    devices = {t.device for t in tensors if t is not None}
    return len(devices) == 1 and next(iter(devices)).type == "cuda" and is_available()


def attention_supports(head_dim: int, num_q_heads: int, num_kv_heads: int) -> bool:
    """Head shapes the attention kernels handle: 16..256 wide (tile minimum, registers), groups up to 64."""
    return (
        16 <= head_dim <= 256
        and num_kv_heads > 0
        and num_q_heads % num_kv_heads == 0
        and num_q_heads // num_kv_heads <= 64
    )


def _cache_ok(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    return (
        k_cache.dtype in DTYPES
        and v_cache.dtype == k_cache.dtype
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
        and k_cache.shape == v_cache.shape
    )


def write_kv(k_cache, v_cache, k, v, slot_mapping) -> bool | None:
    if not _on_cuda(k_cache, v_cache, k, v, slot_mapping) or not _cache_ok(k_cache, v_cache):
        return None
    if k.dtype not in DTYPES or v.dtype not in DTYPES or k.shape != v.shape or k.shape[1:] != k_cache.shape[2:]:
        return None
    if k.stride(-1) != 1 or v.stride(-1) != 1 or slot_mapping.dtype not in (torch.int32, torch.int64):
        return None
    from kernels.triton import kv_write

    return kv_write.write_kv(k_cache, v_cache, k, v, slot_mapping)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None = None,
    page_runs: Sequence[int] | None = None,
) -> torch.Tensor | None:
    if not _float_attention_ok(q, k_cache, v_cache, block_tables, seq_lens, query_lens):
        return None
    from kernels.triton import attention

    return attention.paged_attention(
        q, k_cache, v_cache, block_tables, seq_lens, query_lens, seq_lens_host, scale, sliding_window, page_runs
    )


def _float_attention_ok(q, k_cache, v_cache, block_tables, seq_lens, query_lens) -> bool:
    if not _on_cuda(q, k_cache, v_cache, block_tables, seq_lens) or not _cache_ok(k_cache, v_cache):
        return False
    if q.dtype not in DTYPES or q.dim() != 3 or q.stride(-1) != 1 or q.shape[2] != k_cache.shape[3]:
        return False
    if not attention_supports(q.shape[2], q.shape[1], k_cache.shape[2]) or not query_lens:
        return False
    return block_tables.dim() == 2 and block_tables.stride(1) == 1


def _quant_bits(k_cache: torch.Tensor, v_cache: torch.Tensor, head_dim: int) -> int | None:
    """The bits of a pair of quantized cache layers the kernels read (uint8 rows of one format for heads of
    `head_dim`, alike in shape and strides, unit last stride, 2-byte aligned for the float16 scales), else None."""
    if k_cache.dtype != torch.uint8 or v_cache.dtype != torch.uint8 or k_cache.dim() != 4:
        return None
    if k_cache.data_ptr() % 2 or v_cache.data_ptr() % 2:
        return None
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        return None
    if head_dim % GROUP or not GROUP <= head_dim <= MAX_QUANT_HEAD_DIM:
        return None
    return next((bits for bits in FORMATS.values() if row_bytes(head_dim, bits) == k_cache.shape[3]), None)


def write_kv_quant(k_cache, v_cache, k, v, slot_mapping) -> bool | None:
    if not _on_cuda(k_cache, v_cache, k, v, slot_mapping) or k.dim() != 3 or k.shape != v.shape:
        return None
    if k.dtype not in DTYPES or v.dtype not in DTYPES or k.stride(-1) != 1 or v.stride(-1) != 1:
        return None
    if _quant_bits(k_cache, v_cache, k.shape[2]) is None or k.shape[1] != k_cache.shape[2]:
        return None
    if slot_mapping.dtype not in (torch.int32, torch.int64) or slot_mapping.shape != k.shape[:1]:
        return None
    from kernels.triton import kv_quant

    return kv_quant.write_kv(k_cache, v_cache, k, v, slot_mapping)


def _quant_attention_ok(q, k_cache, v_cache, block_tables, seq_lens, query_lens) -> bool:
    if not _on_cuda(q, k_cache, v_cache, block_tables, seq_lens) or q.dtype not in DTYPES or q.dim() != 3:
        return False
    if q.stride(-1) != 1 or _quant_bits(k_cache, v_cache, q.shape[2]) is None or not query_lens:
        return False
    if not attention_supports(q.shape[2], q.shape[1], k_cache.shape[2]):
        return False
    return block_tables.dim() == 2 and block_tables.stride(1) == 1


def paged_attention_quant(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None = None,
    page_runs: Sequence[int] | None = None,
) -> torch.Tensor | None:
    if not _quant_attention_ok(q, k_cache, v_cache, block_tables, seq_lens, query_lens):
        return None
    from kernels.triton import kv_quant

    # page_runs is not needed: the kernels read pages in place.
    return kv_quant.paged_attention(
        q, k_cache, v_cache, block_tables, seq_lens, query_lens, seq_lens_host, scale, sliding_window
    )


def paged_attention_key_ends_quant(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None,
    key_ends: torch.Tensor,
) -> torch.Tensor | None:
    if not _quant_attention_ok(q, k_cache, v_cache, block_tables, seq_lens, query_lens):
        return None
    if key_ends.device != q.device or key_ends.dtype not in (torch.int32, torch.int64):
        return None
    if key_ends.shape != q.shape[:1] or not key_ends.is_contiguous():
        return None
    from kernels.triton import kv_quant

    return kv_quant.paged_attention(
        q, k_cache, v_cache, block_tables, seq_lens, query_lens, seq_lens_host, scale, sliding_window, key_ends
    )


def paged_attention_sinks(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sinks: torch.Tensor,
    sliding_window: int | None = None,
    page_runs: Sequence[int] | None = None,
) -> torch.Tensor | None:
    """Float and quantized (uint8) pages alike: one kernel pair takes both (kernels/triton/attention_sinks.py)."""
    if q.dim() != 3 or not _on_cuda(q, sinks) or sinks.shape != q.shape[1:2] or not sinks.is_floating_point():
        return None
    args = (q, k_cache, v_cache, block_tables, seq_lens, query_lens)
    if not (_quant_attention_ok(*args) if k_cache.dtype == torch.uint8 else _float_attention_ok(*args)):
        return None
    from kernels.triton import attention_sinks

    sinks = sinks.to(torch.float32).contiguous()
    return attention_sinks.paged_attention_sinks(
        q, k_cache, v_cache, block_tables, seq_lens, query_lens, seq_lens_host, scale, sinks, sliding_window
    )


def blocks_supported(
    type_name: str, device: torch.device | str, dtype: torch.dtype, num_cols: int, num_rows: int
) -> bool:
    """Whether a weight [num_rows, num_cols] of GGUF type `type_name` stays in the file's blocks on `device`:
    the Triton matmul reads every type, in the file's layout, for rows of whole blocks on a CUDA GPU."""
    return (
        torch.device(device).type == "cuda"
        and type_name in BLOCKS
        and dtype in DTYPES
        and num_rows > 0
        and num_cols > 0
        and num_cols % BLOCKS[type_name][0] == 0
        and is_available()
    )


def linear_blocks(x, blocks, type_name: str, bias=None):
    if not _on_cuda(x, blocks, bias) or x.dtype not in DTYPES or x.dim() < 1 or type_name not in BLOCKS:
        return None
    values, size = BLOCKS[type_name]
    num_cols = x.shape[-1]
    if num_cols == 0 or num_cols % values or blocks.dtype != torch.uint8 or blocks.dim() != 2:
        return None
    if blocks.shape[1] != num_cols // values * size or not blocks.is_contiguous() or x.numel() == 0:
        return None
    if bias is not None and (bias.shape != (blocks.shape[0],) or bias.dtype not in DTYPES):
        return None
    from kernels.triton import gguf_matmul

    return gguf_matmul.linear(x, blocks, type_name, bias)


def rms_norm(x, weight, eps: float, residual=None):
    if not _on_cuda(x, weight, residual) or x.dtype not in DTYPES or weight.dtype not in DTYPES:
        return None
    if weight.shape != x.shape[-1:] or not weight.is_contiguous() or x.shape[-1] > MAX_NORM_COLS:
        return None
    if residual is not None and (residual.dtype != x.dtype or residual.shape != x.shape):
        return None
    from kernels.triton import norm

    return norm.rms_norm(x, weight, eps, residual)


def apply_rope(x, cos, sin):
    if not _on_cuda(x, cos, sin) or x.dtype not in DTYPES or cos.dtype not in DTYPES or sin.dtype != cos.dtype:
        return None
    if x.dim() != 3 or cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] != x.shape[0]:
        return None
    rotary_dim = cos.shape[1]
    if rotary_dim % 2 or not 2 <= rotary_dim <= x.shape[2] or x.shape[2] > MAX_ROPE_HEAD_DIM:
        return None
    # The twin's result dtype follows type promotion; the kernel writes x's dtype, so both must agree.
    if torch.promote_types(x.dtype, cos.dtype) != x.dtype:
        return None
    from kernels.triton import rope

    return rope.apply_rope(x, cos, sin)


def silu_and_mul(x):
    if not _on_cuda(x) or x.dtype not in DTYPES or x.dim() == 0 or x.shape[-1] % 2:
        return None
    from kernels.triton import activation

    return activation.silu_and_mul(x)
