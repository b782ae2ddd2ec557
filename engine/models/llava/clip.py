"""CLIP vision encoder (ViT): patch embedding plus a class token, pre-norm, bidirectional encoder layers.

The encoder layers here are shared with SigLIP (siglip.py), which differs only in its embeddings and norms.
Parameter names follow the checkpoint's (`embeddings.patch_embedding`, `encoder.layers.N.self_attn`, ...)
except that q/k/v are fused into one `qkv_proj`, concatenated at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.linear import Linear
from engine.vision.layers import VisionMLP, config_value, load_checked


@dataclass(frozen=True)
class VisionConfig:
    """The shape of a ViT encoder, parsed from a `vision_config` dict (absent keys take the family defaults)."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    hidden_act: str
    layer_norm_eps: float
    num_channels: int = 3

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], defaults: VisionConfig) -> VisionConfig:
        fields = {}
        for name, default in vars(defaults).items():
            cast = type(default) if name != "layer_norm_eps" else float
            fields[name] = config_value(d, name, default, cast)
        fields["model_type"] = defaults.model_type
        return cls(**fields)

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


class VisionAttention(nn.Module):
    """Multi-head self-attention over all tokens of one image (no mask, no cache)."""

    def __init__(self, config: VisionConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.qkv_proj = Linear(config.hidden_size, 3 * config.hidden_size)
        self.out_proj = Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        num_images, num_tokens, hidden = x.shape
        qkv = self.qkv_proj(x).view(num_images, num_tokens, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [num_images, heads, num_tokens, head_dim]
        o = F.scaled_dot_product_attention(q, k, v, scale=self.head_dim**-0.5)
        return self.out_proj(o.transpose(1, 2).reshape(num_images, num_tokens, hidden))


class EncoderLayer(nn.Module):
    def __init__(self, config: VisionConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = VisionAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = VisionMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class Encoder(nn.Module):
    def __init__(self, config: VisionConfig, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(num_layers))


class PatchEmbeddings(nn.Module):
    """Non-overlapping patches projected to `hidden_size`, an optional class token first, plus learned positions."""

    def __init__(self, config: VisionConfig, class_token: bool, patch_bias: bool):
        super().__init__()
        self.image_size = config.image_size
        p = config.patch_size
        self.patch_embedding = nn.Conv2d(config.num_channels, config.hidden_size, p, stride=p, bias=patch_bias)
        self.class_embedding = nn.Parameter(torch.empty(config.hidden_size)) if class_token else None
        self.num_positions = config.num_patches + int(class_token)
        self.position_embedding = nn.Embedding(self.num_positions, config.hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        height, width = pixel_values.shape[-2:]
        if height != self.image_size or width != self.image_size:
            # Learned positions exist for one grid only; a different size would need interpolation.
            raise ValueError(
                f"pixel_values are {height}x{width} but this vision encoder takes {self.image_size}x{self.image_size} "
                "images; resize them with the model's image processor"
            )
        weight = self.patch_embedding.weight
        x = self.patch_embedding(pixel_values.to(weight.dtype)).flatten(2).transpose(1, 2)  # [N, patches, hidden]
        if self.class_embedding is not None:
            x = torch.cat((self.class_embedding.expand(x.shape[0], 1, -1), x), dim=1)
        return x + self.position_embedding.weight


class ClipVisionTower(nn.Module):
    """CLIP's vision transformer (transformers' CLIPVisionModel without pooling).

    `hidden_states(pixel_values)` returns what HF calls `hidden_states`: index 0 is the encoder input (after
    the pre-norm), index i the output of layer i. `num_layers` builds only the first layers, for callers
    that never read the last ones (LLaVA usually takes the second to last); `post_layernorm=False` leaves
    out the final norm, which only `forward` (the last hidden state) uses.
    """

    model_type: ClassVar[str] = "clip_vision_model"
    has_class_token: ClassVar[bool] = True
    has_patch_bias: ClassVar[bool] = False
    # transformers' CLIPVisionConfig defaults.
    DEFAULTS: ClassVar[VisionConfig] = VisionConfig(
        model_type="clip_vision_model",
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        image_size=224,
        patch_size=32,
        hidden_act="quick_gelu",
        layer_norm_eps=1e-5,
    )

    def __init__(self, config: VisionConfig, num_layers: int | None = None, post_layernorm: bool = True):
        super().__init__()
        self.config = config
        self.num_layers = config.num_hidden_layers if num_layers is None else num_layers
        if not 0 <= self.num_layers <= config.num_hidden_layers:
            raise ValueError(f"num_layers={num_layers} is outside 0..{config.num_hidden_layers}")
        self.embeddings = PatchEmbeddings(config, class_token=self.has_class_token, patch_bias=self.has_patch_bias)
        self.build_pre_norm(config)
        self.encoder = Encoder(config, self.num_layers)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if post_layernorm else None

    def build_pre_norm(self, config: VisionConfig) -> None:
        # The attribute name is the checkpoint's (sic).
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], **kwargs: Any) -> ClipVisionTower:
        """Build (on the current device, usually meta) from a Hugging Face `vision_config` dict."""
        return cls(VisionConfig.from_hf_dict(d, cls.DEFAULTS), **kwargs)

    @property
    def num_positions(self) -> int:
        """Tokens per image in every hidden state: the patches, plus the class token where there is one."""
        return self.embeddings.num_positions

    def embed(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.pre_layrnorm(self.embeddings(pixel_values))

    def hidden_states(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        """[num_layers + 1] tensors of [num_images, num_positions, hidden] for `pixel_values` [N, C, H, W]."""
        x = self.embed(pixel_values)
        states = [x]
        for layer in self.encoder.layers:
            x = layer(x)
            states.append(x)
        return states

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The last hidden state [num_images, num_positions, hidden] (CLIP does not normalize it)."""
        return self.hidden_states(pixel_values)[-1]

    def checkpoint_names(self, name: str) -> tuple[str, ...]:
        if ".qkv_proj." in name:
            return tuple(name.replace("qkv_proj", part) for part in ("q_proj", "k_proj", "v_proj"))
        return (name,)

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Fill the tower from its checkpoint tensors, named as in CLIPVisionModel (with or without the
        `vision_model.` prefix older checkpoints carry)."""
        prefix = "vision_model."
        own = {k.removeprefix(prefix): v for k, v in tensors.items()}
        load_checked(self, own, f"{self.model_type} vision encoder", self.checkpoint_names)
