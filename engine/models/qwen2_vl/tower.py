"""The Qwen2-VL and Qwen2.5-VL vision transformer: patches of any grid, 2-D rotary positions, a patch merger.

    patches [num_patches, C*T*p*p] (processor.py layout)
      -> linear patch embedding (the checkpoint's Conv3d, whose stride equals its kernel)
      -> blocks: pre-norm attention with 2-D RoPE (a patch's row turns the first half of each head's rotary
         pairs, its column the second half), then an MLP
      -> merger: norm, each merge_size x merge_size block of patches (consecutive rows) concatenated, 2-layer MLP
      -> [num_patches / merge_size**2, out_hidden_size]: one text-model token per block

Attention never crosses images (nor frames). Qwen2.5-VL attends within windows of
window_size x window_size pixels except in its `fullatt_block_indexes` layers. The reference reorders
patches window by window and back; here patches keep their order and each attention call gathers the rows
of its windows, which sees the same keys in the same order. Segments of equal length share one SDPA call.

The two versions differ only in parts: Qwen2-VL uses LayerNorm and a fc1/act/fc2 MLP; Qwen2.5-VL RMSNorm,
a gated MLP with biases, and windows. Parameter names are the checkpoint's (`blocks.N.attn.qkv`, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ModelLoadError
from engine.models.linear import Linear
from engine.vision.layers import VisionMLP, activation, config_value
from kernels import ops

Grid = tuple[int, int, int]  # patches along time, height, width


@dataclass(frozen=True)
class Qwen2VisionConfig:
    """The vision transformer's shape, from a `vision_config` dict (absent keys take transformers' defaults)."""

    is_v2_5: bool
    depth: int
    hidden_size: int  # width of the blocks
    out_hidden_size: int  # width of the merger's output: the text model's hidden size
    num_heads: int
    intermediate_size: int
    hidden_act: str
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    window_size: int | None  # pixels per window side (Qwen2.5-VL); None: every layer attends to the image
    fullatt_block_indexes: tuple[int, ...]
    rope_theta: float

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], is_v2_5: bool) -> Qwen2VisionConfig:
        """Parse a Qwen2VLVisionConfig (is_v2_5=False) or Qwen2_5_VLVisionConfig dict.

        Qwen2-VL names the block width `embed_dim` and the output width `hidden_size`; Qwen2.5-VL names them
        `hidden_size` and `out_hidden_size`.
        """
        rope = d.get("rope_parameters") or {}
        common = dict(
            is_v2_5=is_v2_5,
            depth=config_value(d, "depth", 32, int),
            num_heads=config_value(d, "num_heads", 16, int),
            in_channels=config_value(d, "in_channels", 3, int),
            patch_size=config_value(d, "patch_size", 14, int),
            temporal_patch_size=config_value(d, "temporal_patch_size", 2, int),
            spatial_merge_size=config_value(d, "spatial_merge_size", 2, int),
            rope_theta=config_value(rope if isinstance(rope, dict) else {}, "rope_theta", 10000.0, float),
        )
        if is_v2_5:
            config = cls(
                **common,
                hidden_size=config_value(d, "hidden_size", 3584, int),
                out_hidden_size=config_value(d, "out_hidden_size", 3584, int),
                intermediate_size=config_value(d, "intermediate_size", 3420, int),
                hidden_act=config_value(d, "hidden_act", "silu", str),
                window_size=config_value(d, "window_size", 112, int),
                fullatt_block_indexes=tuple(config_value(d, "fullatt_block_indexes", (7, 15, 23, 31), list)),
            )
        else:
            width = config_value(d, "embed_dim", 1280, int)
            config = cls(
                **common,
                hidden_size=width,
                out_hidden_size=config_value(d, "hidden_size", 3584, int),
                intermediate_size=int(width * config_value(d, "mlp_ratio", 4, float)),
                hidden_act=config_value(d, "hidden_act", "quick_gelu", str),
                window_size=None,
                fullatt_block_indexes=(),
            )
        config.check()
        return config

    def check(self) -> None:
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 4:
            raise ModelLoadError(
                f"vision_config: a width of {self.hidden_size} over {self.num_heads} heads does not give a head "
                "size divisible by 4, which the 2-D rotary embedding needs; config.json is not a Qwen2-VL one"
            )
        if self.window_size is not None and self.window_size < self.patch_size * self.spatial_merge_size:
            raise ModelLoadError(
                f"vision_config window_size={self.window_size} is smaller than one merged block of "
                f"{self.patch_size * self.spatial_merge_size} pixels; config.json is inconsistent"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


class _RMSNorm(nn.Module):
    """RMSNorm computed in float32, scaled in the input dtype (Qwen2.5-VL's vision norm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def _norm(config: Qwen2VisionConfig, dim: int) -> nn.Module:
    return _RMSNorm(dim, 1e-6) if config.is_v2_5 else nn.LayerNorm(dim, eps=1e-6)


class PatchEmbed(nn.Module):
    def __init__(self, config: Qwen2VisionConfig):
        super().__init__()
        kernel = (config.temporal_patch_size, config.patch_size, config.patch_size)
        # Kept as the checkpoint's Conv3d for its weight's name and shape; a stride equal to the kernel over
        # exactly one patch is a matrix product with the flattened kernel.
        self.proj = nn.Conv3d(config.in_channels, config.hidden_size, kernel, stride=kernel, bias=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        weight = self.proj.weight
        return F.linear(patches.to(weight.dtype), weight.flatten(1))


class VisionAttention(nn.Module):
    def __init__(self, config: Qwen2VisionConfig):
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.qkv = Linear(config.hidden_size, 3 * config.hidden_size)
        self.proj = Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: list[torch.Tensor]):
        q, k, v = self.qkv(x).view(-1, 3, self.num_heads, self.head_dim).unbind(1)  # each [N, heads, head_dim]
        # Rotations in float32, as the reference does them whatever the weights' dtype.
        q = ops.apply_rope(q.float(), cos, sin).to(x.dtype)
        k = ops.apply_rope(k.float(), cos, sin).to(x.dtype)
        out = torch.empty_like(q)
        for rows in segments:  # [num_segments, length] patch rows, one attention per segment
            qs, ks, vs = (t[rows].transpose(1, 2) for t in (q, k, v))  # [num_segments, heads, length, head_dim]
            o = F.scaled_dot_product_attention(qs, ks, vs, scale=self.head_dim**-0.5)
            out[rows.flatten()] = o.transpose(1, 2).flatten(0, 1)
        return self.proj(out.flatten(1))


class GatedVisionMLP(nn.Module):
    def __init__(self, config: Qwen2VisionConfig):
        super().__init__()
        self.act = activation(config.hidden_act, "vision_config.hidden_act")
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nn.Module):
    def __init__(self, config: Qwen2VisionConfig):
        super().__init__()
        self.norm1 = _norm(config, config.hidden_size)
        self.norm2 = _norm(config, config.hidden_size)
        self.attn = VisionAttention(config)
        self.mlp = GatedVisionMLP(config) if config.is_v2_5 else VisionMLP(config)

    def forward(self, x, cos, sin, segments):
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    def __init__(self, config: Qwen2VisionConfig):
        super().__init__()
        merged = config.hidden_size * config.spatial_merge_size**2
        self.ln_q = _norm(config, config.hidden_size)
        self.mlp = nn.Sequential(Linear(merged, merged), nn.GELU(), Linear(merged, config.out_hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_q(x)
        return self.mlp(x.view(-1, self.mlp[0].in_features))


class Qwen2VisionTransformer(nn.Module):
    """`forward(patches, grids)`: the rows of one or more images' patches -> one row per merged block."""

    def __init__(self, config: Qwen2VisionConfig):
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.depth))
        self.merger = PatchMerger(config)

    def forward(self, patches: torch.Tensor, grids: Sequence[Grid]) -> torch.Tensor:
        """[sum of t*h*w / merge_size**2, out_hidden_size] for `patches` [sum of t*h*w, patch_dim], the images'
        patches one after another in the processor's order, and their (t, h, w) patch grids."""
        self._check(patches, grids)
        device = patches.device
        cos, sin = self._rotary(grids, device)
        full = _group_by_length(_frame_segments(grids), device)
        windowed = _group_by_length(self._window_segments(grids), device) if self.config.window_size else full
        x = self.patch_embed(patches)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, full if i in self.config.fullatt_block_indexes else windowed)
        return self.merger(x)

    def _check(self, patches: torch.Tensor, grids: Sequence[Grid]) -> None:
        m = self.config.spatial_merge_size
        bad = [g for g in grids if len(g) != 3 or min(g) < 1 or g[1] % m or g[2] % m]
        if bad:
            raise ValueError(f"image grids {bad} are not (t, h, w) patch counts with h and w multiples of {m}")
        expected = (sum(t * h * w for t, h, w in grids), self.config.patch_dim)
        if patches.dim() != 2 or tuple(patches.shape) != expected:
            raise ValueError(
                f"patches have shape {list(patches.shape)} but grids {list(grids)} need {list(expected)}; "
                "prepare them with the model's Qwen2VLImageProcessor"
            )

    def _rotary(self, grids: Sequence[Grid], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Per patch (cos, sin) [num_patches, head_dim] of its (row, column) in its image."""
        quarter = self.config.head_dim // 4
        exponents = torch.arange(0, 2 * quarter, 2, dtype=torch.float32, device=device) / (2 * quarter)
        inv_freq = 1.0 / (self.config.rope_theta**exponents)  # [head_dim / 4]
        rows, cols = _patch_coordinates(grids, self.config.spatial_merge_size)
        angles = torch.cat(
            [torch.outer(rows.to(device).float(), inv_freq), torch.outer(cols.to(device).float(), inv_freq)], dim=-1
        )  # [num_patches, head_dim / 2]
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()

    def _window_segments(self, grids: Sequence[Grid]) -> list[torch.Tensor]:
        """Patch rows of each window of each frame: merged blocks grouped by window (windows row by row,
        blocks row by row inside), each block's merge_size**2 patches together."""
        m = self.config.spatial_merge_size
        side = self.config.window_size // (m * self.config.patch_size)  # merged blocks per window side
        unit = m * m
        segments, offset = [], 0
        for t, h, w in grids:
            bh, bw = h // m, w // m
            block = torch.arange(bh * bw)
            windows_w = -(-bw // side)
            window = (block // bw) // side * windows_w + (block % bw) // side
            order = torch.argsort(window, stable=True)
            counts = torch.bincount(window).tolist()
            for _ in range(t):
                rows = (offset + order[:, None] * unit + torch.arange(unit)).flatten()
                segments.extend(rows.split([c * unit for c in counts if c]))
                offset += h * w
        return segments


def _patch_coordinates(grids: Sequence[Grid], merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) of every patch in the processor's order: merged blocks row by row, each block's patches
    row by row; frames repeat the coordinates."""
    rows, cols = [], []
    for t, h, w in grids:
        j = torch.arange(h * w)
        block, inside = j // (merge * merge), j % (merge * merge)
        blocks_w = w // merge
        row = (block // blocks_w) * merge + inside // merge
        col = (block % blocks_w) * merge + inside % merge
        rows.append(row.repeat(t))
        cols.append(col.repeat(t))
    return torch.cat(rows), torch.cat(cols)


def _frame_segments(grids: Sequence[Grid]) -> list[torch.Tensor]:
    """Patch rows of every frame of every image (each attends only to itself)."""
    segments, offset = [], 0
    for t, h, w in grids:
        for _ in range(t):
            segments.append(torch.arange(offset, offset + h * w))
            offset += h * w
    return segments


def _group_by_length(segments: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Segments of equal length stacked into one [num_segments, length] index tensor each."""
    by_length: dict[int, list[torch.Tensor]] = {}
    for s in segments:
        by_length.setdefault(len(s), []).append(s)
    return [torch.stack(group).to(device) for group in by_length.values()]
