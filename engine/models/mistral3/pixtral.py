"""Pixtral vision encoder: images of any size, patches placed by a 2D rotary embedding instead of learned positions.

    images [3, H_i, W_i] -> conv patches (no bias) -> one token sequence for all images -> RMSNorm (ln_pre)
        -> layers: x + attn(RMSNorm(x)); x + gated MLP(RMSNorm(x))

Each image keeps its own grid of H_i/patch x W_i/patch tokens, row by row. The rotary angles of patch (row r,
column c) rotate the first half of each rotary pair band by r and the second by c:

    inverse frequencies f_0 .. f_{d/2-1} (d = head_dim)
    angles = [r*f_0, r*f_2, r*f_4, ...,  c*f_1, c*f_3, ...]        (d/2 angles, then repeated for rotate-half)

Several images go through one sequence with block-diagonal attention (a patch sees only its own image), which
equals encoding them one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ModelLoadError
from engine.models.layers import RMSNorm
from engine.models.linear import Linear
from engine.vision.layers import activation, config_value, load_checked
from kernels import ops

# transformers' PixtralRMSNorm in the encoder is always built with this epsilon, whatever the config says.
_NORM_EPS = 1e-5
# Our fused parameters and the checkpoint tensors they concatenate (on the output dimension).
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@dataclass(frozen=True)
class PixtralVisionConfig:
    """The shape of a Pixtral encoder, parsed from a `vision_config` dict (absent keys: transformers' defaults).

    `image_size` is the largest image side the model was trained for (the processor's limit); the encoder
    itself takes any size.
    """

    hidden_size: int = 1024
    intermediate_size: int = 4096
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_channels: int = 3
    image_size: int = 1024
    patch_size: int = 16
    hidden_act: str = "gelu"
    rope_theta: float = 10000.0

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> PixtralVisionConfig:
        """Parse a Hugging Face `vision_config` dict; keys it leaves out take the class defaults."""
        base = cls()
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise ModelLoadError(f"config.json vision_config rope_parameters must be an object, got {rope!r}")
        rope_type = rope.get("rope_type", rope.get("type", "axial"))
        if rope_type != "axial":
            raise ModelLoadError(
                f"config.json vision_config rope_type is {rope_type!r}; the Pixtral encoder only has 'axial' "
                "(2D) rotary positions. Use the model's original config.json."
            )
        fields = {
            name: config_value(d, name, getattr(base, name), type(getattr(base, name)))
            for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
            + ("num_channels", "image_size", "patch_size", "hidden_act")
        }
        theta = rope.get("rope_theta", d.get("rope_theta"))
        fields["rope_theta"] = config_value({"rope_theta": theta}, "rope_theta", base.rope_theta, float)
        config = cls(**fields)
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "patch_size", "num_channels"):
            if getattr(config, name) < 1:
                raise ModelLoadError(f"config.json vision_config {name} is {getattr(config, name)}; it must be >= 1.")
        if config.hidden_size % config.num_attention_heads or (config.hidden_size // config.num_attention_heads) % 2:
            raise ModelLoadError(
                f"config.json vision_config hidden_size {config.hidden_size} does not split into "
                f"{config.num_attention_heads} heads of an even size, which rotary positions need."
            )
        return config

    @property
    def head_dim(self) -> int:
        # transformers derives it (a vision_config "head_dim" key is overwritten the same way).
        return self.hidden_size // self.num_attention_heads


def axial_inverse_frequencies(config: PixtralVisionConfig) -> torch.Tensor:
    """[head_dim / 2] float32: the row frequencies (even indices) then the column frequencies (odd indices)."""
    dim = config.head_dim
    # float32 like transformers, so the angles agree to the last bit; CPU because models are built on "meta".
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim))
    return torch.cat((inv[0::2], inv[1::2]))


class PixtralAttention(nn.Module):
    """Bidirectional multi-head attention with 2D rotary positions; `mask` keeps images apart."""

    def __init__(self, config: PixtralVisionConfig):
        super().__init__()
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.qkv_proj = Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.o_proj = Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        num_tokens, hidden = x.shape
        q, k, v = self.qkv_proj(x).view(num_tokens, 3, self.num_heads, self.head_dim).unbind(1)  # [T, heads, D]
        q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=self.head_dim**-0.5
        )  # [heads, T, D]
        return self.o_proj(o.transpose(0, 1).reshape(num_tokens, hidden))


class PixtralMLP(nn.Module):
    """down(act(gate(x)) * up(x)), gate and up fused into one projection."""

    def __init__(self, config: PixtralVisionConfig):
        super().__init__()
        self.act = activation(config.hidden_act, "vision_config.hidden_act")
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)


class PixtralLayer(nn.Module):
    def __init__(self, config: PixtralVisionConfig):
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden_size, _NORM_EPS)
        self.attention = PixtralAttention(config)
        self.ffn_norm = RMSNorm(config.hidden_size, _NORM_EPS)
        self.feed_forward = PixtralMLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x)[0], cos, sin, mask)
        return x + self.feed_forward(self.ffn_norm(x)[0])


class PixtralTransformer(nn.Module):
    def __init__(self, config: PixtralVisionConfig, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(PixtralLayer(config) for _ in range(num_layers))


class PixtralVisionTower(nn.Module):
    """transformers' PixtralVisionModel. `hidden_states(images)` follows HF's `hidden_states`: index 0 is the
    encoder input (after `ln_pre`), index i the output of layer i, each [total_patches, hidden] over all images
    in order, every image's patches row by row. `num_layers` builds only the first layers, for callers that
    never read the last ones.
    """

    model_type: ClassVar[str] = "pixtral"

    def __init__(self, config: PixtralVisionConfig, num_layers: int | None = None):
        super().__init__()
        self.config = config
        self.num_layers = config.num_hidden_layers if num_layers is None else num_layers
        if not 0 <= self.num_layers <= config.num_hidden_layers:
            raise ValueError(f"num_layers={num_layers} is outside 0..{config.num_hidden_layers}")
        p = config.patch_size
        self.patch_conv = nn.Conv2d(config.num_channels, config.hidden_size, p, stride=p, bias=False)
        self.ln_pre = RMSNorm(config.hidden_size, _NORM_EPS)
        self.transformer = PixtralTransformer(config, self.num_layers)
        # Not a parameter or buffer: the checkpoint has no such tensor, and it must stay float32.
        self.inv_freq = axial_inverse_frequencies(config)

    @property
    def patch_size(self) -> int:
        return self.config.patch_size

    def grid(self, image: torch.Tensor) -> tuple[int, int]:
        """(rows, cols) of patches of one image [C, H, W]; a partial patch at the edge is dropped."""
        return image.shape[-2] // self.patch_size, image.shape[-1] // self.patch_size

    def embed(self, images: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """Patch embeddings [total_patches, hidden] after ln_pre, and each image's (rows, cols)."""
        if len(images) == 0:
            raise ValueError("the Pixtral encoder needs at least one image")
        weight = self.patch_conv.weight
        patches, grids = [], []
        for image in images:
            if image.dim() != 3 or image.shape[0] != self.config.num_channels:
                raise ValueError(
                    f"each image must be [{self.config.num_channels}, height, width], got {list(image.shape)}"
                )
            rows, cols = self.grid(image)
            if rows < 1 or cols < 1:
                raise ValueError(
                    f"an image of {image.shape[-2]}x{image.shape[-1]} pixels is smaller than one {self.patch_size}px "
                    "patch; prepare images with the model's image processor"
                )
            x = self.patch_conv(image[None].to(device=weight.device, dtype=weight.dtype))  # [1, hidden, rows, cols]
            patches.append(x[0].flatten(1).T)  # [rows * cols, hidden], row by row
            grids.append((rows, cols))
        return self.ln_pre(torch.cat(patches))[0], grids

    def rotary(self, grids: Sequence[tuple[int, int]], device: torch.device, dtype: torch.dtype):
        """Per-patch (cos, sin), each [total_patches, head_dim], for images with these (rows, cols) grids."""
        coords = [
            torch.cartesian_prod(torch.arange(rows, device=device), torch.arange(cols, device=device))
            for rows, cols in grids
        ]
        pos = torch.cat(coords).float()  # [total_patches, 2] (row, col)
        inv = self.inv_freq.to(device)
        half = (inv.shape[0] + 1) // 2  # the row frequencies come first
        angles = torch.cat((pos[:, :1] * inv[:half], pos[:, 1:] * inv[half:]), dim=-1)  # [total, head_dim / 2]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def hidden_states(self, images: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """[num_layers + 1] tensors of [total_patches, hidden] for `images` (each [C, H, W], sizes may differ)."""
        x, grids = self.embed(images)
        cos, sin = self.rotary(grids, x.device, x.dtype)
        mask = None
        if len(grids) > 1:
            owner = torch.repeat_interleave(
                torch.arange(len(grids), device=x.device),
                torch.tensor([r * c for r, c in grids], device=x.device),
            )
            mask = owner[:, None] == owner[None, :]  # [total, total] True within one image
        states = [x]
        for layer in self.transformer.layers:
            x = layer(x, cos, sin, mask)
            states.append(x)
        return states

    def forward(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        """The last hidden state [total_patches, hidden]."""
        return self.hidden_states(images)[-1]

    def checkpoint_names(self, name: str) -> tuple[str, ...]:
        for fused, parts in _FUSED.items():
            if f".{fused}." in name:
                return tuple(name.replace(fused, part) for part in parts)
        return (name,)

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Fill the tower from its checkpoint tensors, named as in PixtralVisionModel."""
        load_checked(self, tensors, "Pixtral vision encoder", self.checkpoint_names)
