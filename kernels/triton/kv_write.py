"""Writing new keys and values into their cache pages, in Triton (twin: `kernels.torch_ref.attention.write_kv`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_BLOCK = 1024  # elements of one token's K (or V) row per program; wider rows take several programs


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, stride_kt, stride_kh, stride_vt, stride_vh,
    row_size, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # index into the token's [num_kv_heads * head_dim]
    mask = offs < row_size
    head = offs // HEAD_DIM
    dim = offs % HEAD_DIM
    # Each slot of the cache is one contiguous [num_kv_heads, head_dim] row.
    dst = tl.load(slots_ptr + token) * row_size + offs
    k = tl.load(k_ptr + token * stride_kt + head * stride_kh + dim, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + head * stride_vh + dim, mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> bool:
    """Store k, v [num_tokens, num_kv_heads, head_dim] at flat slots (page_id * page_size + offset).

    The caches must be contiguous; k and v need a unit stride on their last axis only (views of a fused
    q/k/v projection are fine).
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return True
    row_size = num_kv_heads * head_dim
    block = min(MAX_BLOCK, triton.next_power_of_2(row_size))
    _write_kv_kernel[(num_tokens, triton.cdiv(row_size, block))](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        row_size, HEAD_DIM=head_dim, BLOCK=block,
    )  # fmt: skip
    return True
