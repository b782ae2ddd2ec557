"""LLaVA from an mmproj of projector type 'mlp', the files of llama.cpp's legacy LLaVA scripts."""

from __future__ import annotations

import re
from typing import Any

from engine.loading.mmproj_families.base import MmprojError, Tensors, rename

#
# Most LLaVA projector files in the wild (llava-1.5, BakLLaVA, ShareGPT4V...) come from llama.cpp's
# tools/mtmd/legacy-models: llava_surgery_v2.py splits the checkpoint, convert_image_encoder_to_gguf.py writes the
# CLIP (or SigLIP) tower and the two-layer projector:
#
#     vision_model.embeddings.class_embedding   -> v.class_embd          (CLIP only; SigLIP has none)
#     vision_model.pre_layrnorm                 -> v.pre_ln              (CLIP only)
#     vision_model.encoder.layers.{i}.mlp.fc1   -> v.blk.{i}.ffn_down    (sic: fc1/fc2 are named down/up; llama.cpp
#     vision_model.encoder.layers.{i}.mlp.fc2   -> v.blk.{i}.ffn_up       swaps them back by shape, and so do we)
#     multi_modal_projector.linear_1 / linear_2 -> mm.0 / mm.2
#     vision_model.post_layernorm               -> (dropped)
#
# The tower is cut after the layer LLaVA reads (the second to last by default), so the file holds exactly the
# blocks to run: their output is the image feature, unless clip.vision.feature_layer names other hidden states.
# clip.vision.projection_dim there is the CLIP model's own projection width, not the text model's: the text
# width is the projector's output (mm.2's rows).

# gguf-py names of a ViT block under the legacy script, fc1/fc2 as the file has them the right way round.
_LLAVA_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "ln1": "layer_norm1",
    "ln2": "layer_norm2",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
}
_BLOCK_INDEX = re.compile(r"v\.blk\.(\d+)\.")


def translate_llava_mlp(meta: dict[str, Any], raw: Tensors, text_meta: dict[str, Any], source: str):
    from engine.models.llava.processor import ImageProcessor

    name = source.removesuffix(" metadata")
    if meta.get("clip.vision.image_grid_pinpoints") or "model.image_newline" in raw:
        raise MmprojError(
            f"{name} is a LLaVA 1.6 (LLaVA-NeXT) projector: it tiles pictures over image_grid_pinpoints, which "
            "Tandem's LLaVA does not do (it runs LLaVA 1.5's one picture per image). Use a LLaVA 1.5 model."
        )
    if "mm.2.weight" not in raw:
        raise MmprojError(
            f"{name} has a one-layer 'mlp' projector (no mm.2), which Tandem's LLaVA does not run: it runs "
            "LLaVA's linear -> GELU -> linear projector."
        )
    has_class_token = "v.class_embd" in raw
    hidden = meta["clip.vision.embedding_length"]
    raw = dict(raw)
    num_blocks = 1 + max((int(m[1]) for m in map(_BLOCK_INDEX.match, raw) if m), default=-1)
    for i in range(num_blocks):
        up, down = f"v.blk.{i}.ffn_up", f"v.blk.{i}.ffn_down"
        # llama.cpp's rule: ffn_down reading the tower's width is fc1 (the legacy script's names), so swap.
        if f"{down}.weight" in raw and raw[f"{down}.weight"].shape[1] == hidden:
            for kind in ("weight", "bias"):
                if f"{up}.{kind}" in raw and f"{down}.{kind}" in raw:
                    raw[f"{up}.{kind}"], raw[f"{down}.{kind}"] = raw.pop(f"{down}.{kind}"), raw.pop(f"{up}.{kind}")
    vision = {
        "model_type": "clip_vision_model" if has_class_token else "siglip_vision_model",
        "hidden_size": hidden,
        "intermediate_size": meta["clip.vision.feed_forward_length"],
        "num_hidden_layers": num_blocks,
        "num_attention_heads": meta["clip.vision.attention.head_count"],
        "image_size": meta["clip.vision.image_size"],
        "patch_size": meta["clip.vision.patch_size"],
        "layer_norm_eps": meta["clip.vision.attention.layer_norm_epsilon"],
        # The script writes use_gelu only for a tower whose hidden_act is "gelu"; any other is read by llama.cpp
        # as CLIP's quick GELU, and so here.
        "hidden_act": "gelu" if meta.get("clip.use_gelu") else "quick_gelu",
    }
    feature_layers = list(meta.get("clip.vision.feature_layer") or [num_blocks])
    extra = {
        "vision_config": vision,
        "vision_feature_layer": feature_layers if len(feature_layers) > 1 else feature_layers[0],
        # CLIP's class token is not an image row (llama.cpp skips it too); SigLIP has none to skip.
        "vision_feature_select_strategy": "default" if has_class_token else "full",
        "projector_hidden_act": "gelu",
        "multimodal_projector_bias": "mm.0.bias" in raw,
    }
    names = {
        "v.class_embd": "vision_tower.embeddings.class_embedding",
        "v.patch_embd.weight": "vision_tower.embeddings.patch_embedding.weight",
        "v.patch_embd.bias": "vision_tower.embeddings.patch_embedding.bias",
        "v.position_embd.weight": "vision_tower.embeddings.position_embedding.weight",
        "v.pre_ln.weight": "vision_tower.pre_layrnorm.weight",
        "v.pre_ln.bias": "vision_tower.pre_layrnorm.bias",
        "mm.0.weight": "multi_modal_projector.linear_1.weight",
        "mm.0.bias": "multi_modal_projector.linear_1.bias",
        "mm.2.weight": "multi_modal_projector.linear_2.weight",
        "mm.2.bias": "multi_modal_projector.linear_2.bias",
    }
    tensors = rename(raw, names, _LLAVA_BLOCK, "vision_tower.encoder.layers.", source)
    # The file keeps only the size and mean/std: the rest is the processor of llava-hf's folders (CLIP: shortest
    # edge resized, centre crop; SigLIP: a square resize). llama.cpp prepares pictures its own way, so one of
    # another size than the encoder's may reach the two towers differently.
    size = vision["image_size"]
    if has_class_token:
        spec = {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": size}}
        spec["crop_size"] = {"height": size, "width": size}
    else:
        spec = {"image_processor_type": "SiglipImageProcessor", "size": {"height": size, "width": size}}
    spec |= {"image_mean": meta["clip.vision.image_mean"], "image_std": meta["clip.vision.image_std"]}
    return extra, tensors, ImageProcessor.from_dict(spec, source=source)
