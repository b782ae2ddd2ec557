"""How close single-stream decode comes to the memory-bandwidth bound.

A decode step of one sequence must read every weight it multiplies by at least once: all dense weights, the
output head, and of each mixture-of-experts layer only the routed experts (top_k of num_experts). It reads one
row of an untied embedding table, which is nothing beside the rest. So

    bound (tok/s) = read bandwidth / active bytes per token

and our decode rate over it says how much of the machine's bandwidth a step uses. The bandwidth is measured
here, with the bench's torch threads, as the rate a sum streams a buffer far larger than the caches.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from engine.models.embedding import Embedding
from engine.models.moe import Experts, SparseMoE

# A buffer this size (MiB) is far past every CPU cache here, so the sum streams it from memory.
_STREAM_MIB = 512
_STREAM_RUNS = 3


def active_bytes(model: nn.Module) -> int:
    """Bytes of weights one decode step of one sequence reads (see the module docstring). A tensor two modules
    share (a tied head and its embedding table) counts once, as read by the head."""
    share: dict[Experts, float] = {}
    for module in model.modules():
        if isinstance(module, SparseMoE):
            for experts in (module.experts_gate_up, module.experts_down):
                share[experts] = module.top_k / module.num_experts
    read: dict[int, float] = {}  # tensor address -> bytes read per step
    for module in model.modules():
        tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        for tensor in tensors:
            if tensor is None or tensor.device.type == "meta":
                continue
            # by address, not storage: a memory-mapped file's tensors are views of one storage
            key, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
            part = 0.0 if isinstance(module, Embedding) else share.get(module, 1.0)
            read[key] = max(read.get(key, 0.0), size * part)
    return round(sum(read.values()))


def read_bandwidth_gbs() -> float:
    """GB/s at which this process's torch threads stream memory (best of a few sums over a large buffer)."""
    buffer = torch.ones(_STREAM_MIB * 2**20 // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(_STREAM_RUNS):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best / 1e9
