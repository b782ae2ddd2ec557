"""Token embeddings whose table can stay in a GGUF file's blocks: a lookup expands only the rows it reads.

A Q4_K_M file's table is Q6_K: 0.82 bytes a value instead of two in bfloat16 (Llama-3.2-1B's 128256 x 2048
table: 215 MB against 525 MB), and a tied output head reads the same blocks through the K-quant kernel.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.linear import BlockWeight
from kernels import ops


class Embedding(nn.Embedding):
    """`nn.Embedding` (same parameter name and forward) that can swap its table for rows of GGUF blocks."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        # An uninitialized table: the loader fills it. nn.Embedding's own random init would, on the meta device
        # models are built on, go through torch._refs and import torch._dynamo (and triton where installed):
        # a large share of resident memory and load time, for nothing.
        super().__init__(num_embeddings, embedding_dim, _weight=torch.empty(num_embeddings, embedding_dim))
        self.register_buffer("blocks", None)  # uint8 after `load_blocks`: [num_embeddings, row bytes], or x16 tiles
        self.block_type = ""
        self.block_dtype = torch.float32

    def load_blocks(self, weight: BlockWeight) -> None:
        """Keep a one-type table in its blocks where a kernel can also read it as a head; else expand it."""
        if len(weight.parts) != 1 or not weight.is_packable():
            self.weight = nn.Parameter(weight.dequantize(), requires_grad=False)
            return
        del self.weight
        self.blocks, self.block_type = weight.parts[0]
        self.block_dtype = weight.dtype

    @property
    def table(self) -> torch.Tensor | BlockWeight:
        """What a tied output head reads: the float matrix, or the blocks as a `BlockWeight`."""
        if self.blocks is None:
            return self.weight
        return BlockWeight([(self.blocks, self.block_type)], self.embedding_dim, self.block_dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.blocks is None:
            return super().forward(input_ids)
        rows, type_name = ops.block_rows(self.blocks, self.block_type, input_ids.reshape(-1))  # [num_ids, row bytes]
        values = ops.dequantize_blocks(rows, type_name, self.embedding_dim, self.block_dtype)
        return values.reshape(*input_ids.shape, self.embedding_dim)
