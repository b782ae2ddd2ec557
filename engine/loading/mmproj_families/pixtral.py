"""Pixtral from an mmproj of projector type 'pixtral': LLaVA with a Pixtral tower (Pixtral-12B's layout), and
Mistral 3 (the same with a patch merger)."""

from __future__ import annotations

from typing import Any

import torch

from engine.loading.mmproj_families.base import Tensors, rename, vision_config

_PIXTRAL_BLOCK = {
    "attn_q": "attention.q_proj",
    "attn_k": "attention.k_proj",
    "attn_v": "attention.v_proj",
    "attn_out": "attention.o_proj",
    "ln1": "attention_norm",
    "ln2": "ffn_norm",
    "ffn_gate": "feed_forward.gate_proj",
    "ffn_up": "feed_forward.up_proj",
    "ffn_down": "feed_forward.down_proj",
}


def unpermute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo the converter's LlamaModel.permute of a q/k projection (rows of each head regrouped from
    rotate-half pairs into interleaved pairs, for ggml's rope): [out, ...] back in Hugging Face row order."""
    half = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def translate_pixtral(meta: dict[str, Any], raw: Tensors, text_meta: dict[str, Any], source: str):
    from engine.models.mistral3.processor import PixtralImageProcessor

    vision = vision_config(meta, "pixtral")
    vision["hidden_act"] = "silu" if meta.get("clip.use_silu") else "gelu"
    if "clip.vision.rope.freq_base" in meta:
        vision["rope_theta"] = meta["clip.vision.rope.freq_base"]
    merge = meta.get("clip.vision.spatial_merge_size", 1)
    # llama.cpp feeds the projector the last layer and keeps every patch: Pixtral-12B's and Mistral 3's own
    # settings. Mistral 3 (a patch merger) has RMSNorm -> merger -> linear -> gelu -> linear.
    extra = {
        "vision_config": vision,
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "full",
        "projector_hidden_act": "gelu",
        "multimodal_projector_bias": "mm.1.bias" in raw,
    }
    if merge > 1:
        extra["spatial_merge_size"] = merge
    raw = dict(raw)
    raw.pop("v.token_embd.img_break", None)  # a copy of the text model's [IMG_BREAK] row, which Tandem reads there
    for name in [n for n in raw if n.endswith(("attn_q.weight", "attn_k.weight", "attn_q.bias", "attn_k.bias"))]:
        raw[name] = unpermute_qk(raw[name], vision["num_attention_heads"])
    names = {
        "v.patch_embd.weight": "vision_tower.patch_conv.weight",
        "v.pre_ln.weight": "vision_tower.ln_pre.weight",
        "mm.1.weight": "multi_modal_projector.linear_1.weight",
        "mm.1.bias": "multi_modal_projector.linear_1.bias",
        "mm.2.weight": "multi_modal_projector.linear_2.weight",
        "mm.2.bias": "multi_modal_projector.linear_2.bias",
        "mm.input_norm.weight": "multi_modal_projector.norm.weight",
        "mm.patch_merger.weight": "multi_modal_projector.patch_merger.merging_layer.weight",
    }
    tensors = rename(raw, names, _PIXTRAL_BLOCK, "vision_tower.transformer.layers.", source)
    processor = PixtralImageProcessor.from_dict(
        {
            "size": {"longest_edge": vision["image_size"]},
            "image_mean": meta["clip.vision.image_mean"],
            "image_std": meta["clip.vision.image_std"],
        },
        source=source,
        patch_size=vision["patch_size"] * merge,  # pixels per image token side, as the folder path passes it
    )
    return extra, tensors, processor
