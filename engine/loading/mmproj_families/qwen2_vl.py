"""Qwen2-VL and Qwen2.5-VL from an mmproj of projector type 'qwen2vl_merger' / 'qwen2.5vl_merger'."""

from __future__ import annotations

from typing import Any

import torch

from engine.loading.mmproj_families.base import MmprojError, Tensors, rename

_QWEN2_VL_BLOCK = {
    "attn_out": "attn.proj",
    "ln1": "norm1",
    "ln2": "norm2",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
}


# Qwen2.5-VL's blocks: RMSNorm (weights only) and a gated MLP with biases.
_QWEN2_5_VL_BLOCK = {
    **_QWEN2_VL_BLOCK,
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def translate_qwen2_5_vl(meta: dict[str, Any], raw: Tensors, text_meta: dict[str, Any], source: str):
    return translate_qwen2_vl(meta, raw, text_meta, source, is_v2_5=True)


def translate_qwen2_vl(
    meta: dict[str, Any], raw: Tensors, text_meta: dict[str, Any], source: str, is_v2_5: bool = False
):
    from engine.models.qwen2_vl.processor import Qwen2VLImageProcessor

    raw = dict(raw)
    embed_dim = meta["clip.vision.embedding_length"]
    # The converter splits the Conv3D patch embedding into its two frames and qkv into q, k, v: join them back.
    frames = [raw.pop("v.patch_embd.weight"), raw.pop("v.patch_embd.weight.1")]  # each [embed, 3, p, p]
    joined = {"visual.patch_embed.proj.weight": torch.stack(frames, dim=2)}  # [embed, 3, 2, p, p]
    for i in range(meta["clip.vision.block_count"]):
        for kind in ("weight", "bias"):
            parts = [raw.pop(f"v.blk.{i}.attn_{x}.{kind}") for x in "qkv"]
            joined[f"visual.blocks.{i}.attn.qkv.{kind}"] = torch.cat(parts)
    # Not in the metadata: the MLP width (feed_forward_length holds the text width) and the merge size, read
    # from the tensor shapes (the merger's first layer takes merge**2 patches).
    mlp_width = raw["v.blk.0.ffn_up.weight"].shape[0]
    merge = round((raw["mm.0.weight"].shape[1] // embed_dim) ** 0.5)
    depth = meta["clip.vision.block_count"]
    vision = {
        "depth": depth,
        "num_heads": meta["clip.vision.attention.head_count"],
        "patch_size": meta["clip.vision.patch_size"],
        "spatial_merge_size": merge,
        "temporal_patch_size": len(frames),
    }
    if is_v2_5:
        # Every n_wa_pattern-th layer attends to the whole image, the others within windows; the window side
        # is not in the file: transformers' (and every released Qwen2.5-VL's) 112 pixels.
        every = meta["clip.vision.n_wa_pattern"]
        vision |= {
            "hidden_size": embed_dim,
            "intermediate_size": mlp_width,
            "out_hidden_size": meta["clip.vision.projection_dim"],
            "hidden_act": "silu" if meta.get("clip.use_silu") else "gelu",
            "fullatt_block_indexes": list(range(every - 1, depth, every)),
            "window_size": 112,
        }
    else:  # Qwen2-VL names the tower width embed_dim and its output hidden_size
        vision |= {
            "embed_dim": embed_dim,
            "hidden_size": meta["clip.vision.projection_dim"],
            "mlp_ratio": mlp_width / embed_dim,
        }
    sections = text_meta.get("qwen2vl.rope.dimension_sections")
    if not isinstance(sections, list):
        raise MmprojError(
            f"{source.removesuffix(' metadata')} is a Qwen2-VL projector, but the text GGUF is not Qwen2-VL's "
            "language model (it has no qwen2vl.rope.dimension_sections): the two files are not one model."
        )
    vocab = text_meta.get("tokenizer.ggml.tokens") or []
    extra = {
        "vision_config": vision,
        "rope_scaling": {"type": "mrope", "mrope_section": [s for s in sections if s][:3]},
        **{
            f"vision_{edge}_token_id": vocab.index(f"<|vision_{edge}|>")
            for edge in ("start", "end")
            if f"<|vision_{edge}|>" in vocab
        },
    }
    names = {
        "v.post_ln.weight": "visual.merger.ln_q.weight",
        "v.post_ln.bias": "visual.merger.ln_q.bias",
        "mm.0.weight": "visual.merger.mlp.0.weight",
        "mm.0.bias": "visual.merger.mlp.0.bias",
        "mm.2.weight": "visual.merger.mlp.2.weight",
        "mm.2.bias": "visual.merger.mlp.2.bias",
    }
    block = _QWEN2_5_VL_BLOCK if is_v2_5 else _QWEN2_VL_BLOCK
    tensors = {**joined, **rename(raw, names, block, "visual.blocks.", source)}
    # Pixel limits are not in the file: transformers' defaults (llama.cpp picks its own).
    processor = Qwen2VLImageProcessor.from_dict(
        {
            "patch_size": vision["patch_size"],
            "merge_size": merge,
            "temporal_patch_size": len(frames),
            "image_mean": meta["clip.vision.image_mean"],
            "image_std": meta["clip.vision.image_std"],
        },
        source=source,
    )
    return extra, tensors, processor
