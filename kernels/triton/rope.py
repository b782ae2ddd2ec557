"""Rotary position embedding in Triton (twin: `kernels.torch_ref.rope.apply_rope`), "rotate half" layout.

cos/sin come per token, [num_tokens, rotary_dim], so every variant the models build is the same kernel:
default and llama3-scaled frequencies, partial rotary (rotary_dim < head_dim: the tail of each head passes
through unchanged) and M-RoPE (whose sections only change which position each frequency of the table uses).
For each token and head, with h = rotary_dim / 2:

    out[:h]  = x[:h] * cos[:h] - x[h:2h] * sin[:h]
    out[h:2h] = x[h:2h] * cos[h:] + x[:h] * sin[h:]
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton import launch

HEADS_PER_PROGRAM = 4  # a program reads its token's cos/sin once for this many heads


@triton.jit
def _rope_kernel(
    x_ptr, cos_ptr, sin_ptr, out_ptr, stride_xt, stride_xh, stride_ct, stride_st, num_heads,
    HEAD_DIM: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = heads < num_heads
    j = tl.arange(0, BLOCK_HALF)
    j_mask = j < HALF
    cos1 = tl.load(cos_ptr + token * stride_ct + j, mask=j_mask, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_ptr + token * stride_ct + HALF + j, mask=j_mask, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_ptr + token * stride_st + j, mask=j_mask, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_ptr + token * stride_st + HALF + j, mask=j_mask, other=0.0).to(tl.float32)

    x_row = x_ptr + token * stride_xt + heads[:, None] * stride_xh
    out_row = out_ptr + (token * num_heads + heads[:, None]) * HEAD_DIM
    mask = h_mask[:, None] & j_mask[None, :]
    x1 = tl.load(x_row + j[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + HALF + j[None, :], mask=mask, other=0.0).to(tl.float32)
    out_ty = out_ptr.dtype.element_ty
    tl.store(out_row + j[None, :], (x1 * cos1[None, :] - x2 * sin1[None, :]).to(out_ty), mask=mask)
    tl.store(out_row + HALF + j[None, :], (x2 * cos2[None, :] + x1 * sin2[None, :]).to(out_ty), mask=mask)
    if BLOCK_PASS > 0:
        p = 2 * HALF + tl.arange(0, BLOCK_PASS)
        p_mask = h_mask[:, None] & (p < HEAD_DIM)[None, :]
        tl.store(out_row + p[None, :], tl.load(x_row + p[None, :], mask=p_mask), mask=p_mask)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [num_tokens, num_heads, head_dim] by per-token cos/sin [num_tokens, rotary_dim] -> new tensor."""
    num_tokens, num_heads, head_dim = x.shape
    rotary_dim = cos.shape[-1]
    out = launch.empty((num_tokens, num_heads, head_dim), x.dtype, x.device)
    if num_tokens == 0:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    half = rotary_dim // 2
    pass_dim = head_dim - rotary_dim
    block_h = min(HEADS_PER_PROGRAM, triton.next_power_of_2(num_heads))
    _rope_kernel[(num_tokens, triton.cdiv(num_heads, block_h))](
        x, cos, sin, out, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0), num_heads,
        HEAD_DIM=head_dim, HALF=half, BLOCK_H=block_h, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_PASS=triton.next_power_of_2(pass_dim) if pass_dim else 0,
    )  # fmt: skip
    return out
