"""Bindings of moe_decode.c: a mixture-of-experts MLP's experts over a decode step's few rows in two C calls
around the activation, for kernels/cpu/plan.py (engine/models/decode_plan.py records them).

The experts' projections run the block kernels of blocks.py (kquant_matmul.c, block32_matmul.c) on each routed
expert's slice of the packed blocks, called from C through their addresses: the same kernel and arguments
ops.linear_blocks gives the module's per-expert call, so a bound step gives the module's bits.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

import torch

from kernels.cpu import blocks as cpu_blocks
from kernels.cpu import build

_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


def _gate_up_kernel():
    # x, x stride, ids, rows, top_k, parts, parts count, bias, order, gathered, out, n, k, threads
    args = (_ptr, _i64, _ptr, _i64, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64)
    return build.function("moe_decode", "moe_gate_up", args, ctypes.c_int)


def _down_kernel():
    # act, ids, weights, order, rows, top_k, parts, parts count, bias, down, out, out stride, n, k, threads
    args = (_ptr, _ptr, _ptr, _ptr, _i64, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64)
    return build.function("moe_decode", "moe_down", args, ctypes.c_int)


def expert_parts(
    blocks: Sequence[torch.Tensor], type_names: Sequence[str], num_experts: int, k: int
) -> torch.Tensor | None:
    """The int64 [parts, 5] table moe_decode.c reads for one projection of all experts (each of `blocks` is
    [E * rows, row bytes], expert e's rows at [e * rows, (e + 1) * rows)): per part the block kernel's address,
    its type number, the blocks' address, an expert's weight rows and its bytes; None where the block kernels
    do not take a part (the module's ops then run another backend, which the plan cannot copy)."""
    table = []
    for part, type_name in zip(blocks, type_names):
        kind = cpu_blocks.TYPES.get(type_name)
        if kind is None or part.shape[0] % num_experts:
            return None
        one = part[: part.shape[0] // num_experts]  # expert 0's slice, as Experts.forward cuts it
        rows = one.shape[0] * kind.group
        x, out = torch.empty(1, k, dtype=torch.bfloat16), torch.empty(1, rows, dtype=torch.bfloat16)
        call = cpu_blocks.bind_linear(x, one, type_name, out, 1)
        if call is None:
            return None
        fn, args = call
        table.append([ctypes.cast(fn, _ptr).value, args[0], part.data_ptr(), rows, one.numel()])
    return torch.tensor(table, dtype=torch.int64)


def bind_gate_up(
    x: torch.Tensor,
    ids: torch.Tensor,
    parts: torch.Tensor,
    bias: torch.Tensor | None,
    order: torch.Tensor,
    gathered: torch.Tensor,
    out: torch.Tensor,
    threads,
) -> tuple[Callable[..., int], tuple] | None:
    """moe_gate_up over x [rows, k] bfloat16 (unit column stride) and ids [rows, top_k] int64: fills order
    [rows * top_k] int64, gathered [rows * top_k, k] and out [rows * top_k, n] (contiguous bfloat16). `parts`
    from expert_parts; bias None or bfloat16 [E, n]. The caller keeps every tensor alive while it calls."""
    fn = _gate_up_kernel()
    rows, top_k = ids.shape
    k, n = x.shape[1], out.shape[1]
    if fn is None or not _ok(ids, parts, bias, order, (gathered, out), n) or x.shape[0] != rows:
        return None
    if x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.stride(1) != 1:
        return None
    if gathered.shape != (rows * top_k, k) or out.shape[0] != rows * top_k:
        return None
    args = (x.data_ptr(), x.stride(0), ids.data_ptr(), rows, top_k, parts.data_ptr(), parts.shape[0])
    return fn, (*args, _address(bias), order.data_ptr(), gathered.data_ptr(), out.data_ptr(), n, k, threads)


def bind_down(
    act: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    order: torch.Tensor,
    parts: torch.Tensor,
    bias: torch.Tensor | None,
    down: torch.Tensor,
    out: torch.Tensor,
    threads,
) -> tuple[Callable[..., int], tuple] | None:
    """moe_down: out [rows, n] (unit column stride) = each row's sum of its pairs' weighted down projections of
    act [rows * top_k, k] (moe_gate_up's order); weights [rows, top_k] bfloat16, down [rows * top_k, n]
    scratch."""
    fn = _down_kernel()
    rows, top_k = ids.shape
    k, n = act.shape[1], out.shape[1]
    if fn is None or not _ok(ids, parts, bias, order, (act, down), n):
        return None
    if out.dtype != torch.bfloat16 or out.device.type != "cpu":
        return None
    if weights.shape != ids.shape or weights.dtype != torch.bfloat16 or not weights.is_contiguous():
        return None
    if act.shape[0] != rows * top_k or down.shape != (rows * top_k, n) or out.shape[0] != rows or out.stride(1) != 1:
        return None
    args = (act.data_ptr(), ids.data_ptr(), weights.data_ptr(), order.data_ptr(), rows, top_k, parts.data_ptr())
    args = (*args, parts.shape[0], _address(bias), down.data_ptr(), out.data_ptr(), out.stride(0), n, k, threads)
    return fn, args


def _ok(ids, parts, bias, order, buffers, n: int) -> bool:
    """The int64 tables and the contiguous bfloat16 buffers on the CPU, the bias (if any) [E, n]."""
    bf16 = (*buffers, *(() if bias is None else (bias,)))
    int64 = (ids, parts, order)
    return (
        all(t.device.type == "cpu" and t.is_contiguous() for t in (*bf16, *int64))
        and all(t.dtype == torch.bfloat16 for t in bf16)
        and all(t.dtype == torch.int64 for t in int64)
        and order.numel() == ids.numel()
        and (bias is None or (bias.dim() == 2 and bias.shape[1] == n))
        and int(parts[:, 3].sum()) == n
    )


def _address(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()
