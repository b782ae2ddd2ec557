"""Per projector type: how an mmproj's `clip.*` metadata and `v.*` / `mm.*` tensors read as the Hugging Face
config and checkpoint of the family Tandem already runs (see engine/loading/mmproj.py).

Tensor names are llama.cpp's (gguf-py's MODEL_TENSOR.V_* names); a ViT block's are shared by every
SigLIP-style tower:

    v.blk.{i}.attn_q / attn_k / attn_v / attn_out  -> encoder.layers.{i}.self_attn.q_proj / ... / out_proj
    v.blk.{i}.ln1 / ln2 / ffn_up / ffn_down        -> encoder.layers.{i}.layer_norm1 / layer_norm2 / mlp.fc1 / fc2
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.errors import CorruptFileError, ModelLoadError

Tensors = dict[str, torch.Tensor]
# (mmproj metadata, mmproj tensors by GGUF name, text file metadata, source for messages)
#   -> (config.json keys besides text_config, checkpoint tensors, image processor)
Translate = Callable[[dict[str, Any], Tensors, dict[str, Any], str], tuple[dict[str, Any], Tensors, Any]]


class MmprojError(ModelLoadError):
    """An mmproj file Tandem cannot pair with its text model (unsupported projector, a mismatch): the text
    model stays usable without images, and this message says why."""


@dataclass(frozen=True)
class Family:
    architecture: str  # the model class the translated checkpoint loads as
    image_token: str  # the vocabulary token the family's prompts hold where an image goes
    translate: Translate
    # The class when the projector merges patches (clip.vision.spatial_merge_size > 1), where that is another
    # model: Pixtral-12B (LLaVA) and Mistral 3 share the 'pixtral' type.
    merged_architecture: str | None = None
    # Where clip.vision.projection_dim is not the text width (LLaVA's legacy files hold CLIP's own projection
    # width there): the tensor whose length is, the projector's last bias.
    width_tensor: str | None = None

    def architecture_of(self, meta: dict[str, Any]) -> str:
        merges = meta.get("clip.vision.spatial_merge_size", 1) > 1
        return self.merged_architecture if merges and self.merged_architecture else self.architecture

    def projection_width(self, meta: dict[str, Any], tensors: dict[str, Any]) -> int | None:
        """The embedding width the projector writes, from the metadata or the shape of `tensors[width_tensor]`
        (a GGUF TensorInfo, innermost dimension first), without reading any tensor's data."""
        if self.width_tensor is None:
            return meta.get("clip.vision.projection_dim")
        info = tensors.get(self.width_tensor)
        return None if info is None else int(info.shape[0])


_BLOCK = re.compile(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)")
_SIGLIP_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "ln1": "layer_norm1",
    "ln2": "layer_norm2",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
}


def rename(raw: Tensors, names: dict[str, str], block: dict[str, str], block_prefix: str, source: str) -> Tensors:
    """`raw` under checkpoint names: whole names from `names`, block tensors `block_prefix{i}.` + `block`'s
    name. A tensor neither knows is refused by name (a newer converter's layout Tandem would misread)."""
    out: Tensors = {}
    for name, value in raw.items():
        match = _BLOCK.fullmatch(name)
        if name in names:
            out[names[name]] = value
        elif match and match[2] in block:
            out[f"{block_prefix}{match[1]}.{block[match[2]]}.{match[3]}"] = value
        else:
            raise CorruptFileError(
                f"{source.removesuffix(' metadata')} holds tensor {name!r}, which this projector type does not "
                "have in the files Tandem reads; it may come from a newer converter. Convert the model again with "
                "llama.cpp's convert_hf_to_gguf.py --mmproj."
            )
    return out


def _vision_config(meta: dict[str, Any], model_type: str) -> dict[str, Any]:
    """The tower's vision_config, from the keys every mmproj has."""
    return {
        "model_type": model_type,
        "hidden_size": meta["clip.vision.embedding_length"],
        "intermediate_size": meta["clip.vision.feed_forward_length"],
        "num_hidden_layers": meta["clip.vision.block_count"],
        "num_attention_heads": meta["clip.vision.attention.head_count"],
        "image_size": meta["clip.vision.image_size"],
        "patch_size": meta["clip.vision.patch_size"],
        "layer_norm_eps": meta["clip.vision.attention.layer_norm_epsilon"],
    }


# --- Idefics3 / SmolVLM ---------------------------------------------------------------------------------------


def _idefics3(meta: dict[str, Any], raw: Tensors, text_meta: dict[str, Any], source: str):
    from engine.models.idefics3.processor import Idefics3ImageProcessor

    vision = _vision_config(meta, "idefics3_vision")
    extra = {"vision_config": vision, "scale_factor": meta["clip.vision.projector.scale_factor"]}
    names = {
        "v.patch_embd.weight": "model.vision_model.embeddings.patch_embedding.weight",
        "v.patch_embd.bias": "model.vision_model.embeddings.patch_embedding.bias",
        "v.position_embd.weight": "model.vision_model.embeddings.position_embedding.weight",
        "v.post_ln.weight": "model.vision_model.post_layernorm.weight",
        "v.post_ln.bias": "model.vision_model.post_layernorm.bias",
        "mm.model.fc.weight": "model.connector.modality_projection.proj.weight",
    }
    tensors = rename(raw, names, _SIGLIP_BLOCK, "model.vision_model.encoder.layers.", source)
    # Pictures are resized to the converter's preproc_image_size (the folder's size.longest_edge) and cut into
    # tiles of the encoder's own size (llama.cpp cuts there too); the other options are transformers' defaults.
    longest_edge = meta.get("clip.vision.preproc_image_size", vision["image_size"])
    processor = Idefics3ImageProcessor.from_dict(
        {
            "size": {"longest_edge": longest_edge},
            "max_image_size": {"longest_edge": vision["image_size"]},
            "image_mean": meta["clip.vision.image_mean"],
            "image_std": meta["clip.vision.image_std"],
        },
        source=source,
    )
    return extra, tensors, processor


# --- Pixtral: LLaVA with a Pixtral tower (Pixtral-12B's layout), and Mistral 3 (the same with a patch merger) ---

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


def _pixtral(meta: dict[str, Any], raw: Tensors, text_meta: dict[str, Any], source: str):
    from engine.models.mistral3.processor import PixtralImageProcessor

    vision = _vision_config(meta, "pixtral")
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


# --- Qwen2-VL ------------------------------------------------------------------------------------------------

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


def _qwen2_5_vl(meta: dict[str, Any], raw: Tensors, text_meta: dict[str, Any], source: str):
    return _qwen2_vl(meta, raw, text_meta, source, is_v2_5=True)


def _qwen2_vl(meta: dict[str, Any], raw: Tensors, text_meta: dict[str, Any], source: str, is_v2_5: bool = False):
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


# --- Gemma 3 ---------------------------------------------------------------------------------------------------


def _gemma3(meta: dict[str, Any], raw: Tensors, text_meta: dict[str, Any], source: str):
    from engine.config_gguf import gemma3_text_keys
    from engine.models.llava.processor import ImageProcessor

    name = source.removesuffix(" metadata")
    if text_meta.get("general.architecture") != "gemma3":
        raise MmprojError(
            f"{name} is a Gemma 3 projector, but the text GGUF is a {text_meta.get('general.architecture')!r} "
            "model, not Gemma 3's language model: the two files are not one model."
        )
    vocab = text_meta.get("tokenizer.ggml.tokens") or []
    markers = {}
    for key, token in (("boi_token_index", "<start_of_image>"), ("eoi_token_index", "<end_of_image>")):
        if token not in vocab:  # each image's run starts and ends with these tokens' embeddings
            raise MmprojError(f"{name} is a Gemma 3 projector, but the text GGUF's vocabulary has no {token}.")
        markers[key] = vocab.index(token)
    vision = _vision_config(meta, "siglip_vision_model")
    vision["hidden_act"] = "gelu_pytorch_tanh"  # Gemma 3's SigLIP; ggml's GELU is the tanh approximation
    # The projector average-pools the patch grid by scale_factor a side (written only when it is not 4).
    patches_per_side = vision["image_size"] // vision["patch_size"]
    tokens_per_side = patches_per_side // meta.get("clip.vision.projector.scale_factor", 4)
    extra = {
        "vision_config": vision,
        "mm_tokens_per_image": tokens_per_side**2,
        **markers,
        "text_config": gemma3_text_keys(text_meta),
    }
    raw = dict(raw)
    # The converter adds 1 to the projector's norm (ggml scales by the weight, Gemma's RMSNorm by 1 + weight);
    # the tower's LayerNorms are SigLIP's own and are written as they are.
    raw["mm.soft_emb_norm.weight"] = raw["mm.soft_emb_norm.weight"] - 1.0
    names = {
        "v.patch_embd.weight": "vision_tower.embeddings.patch_embedding.weight",
        "v.patch_embd.bias": "vision_tower.embeddings.patch_embedding.bias",
        "v.position_embd.weight": "vision_tower.embeddings.position_embedding.weight",
        "v.post_ln.weight": "vision_tower.post_layernorm.weight",
        "v.post_ln.bias": "vision_tower.post_layernorm.bias",
        "mm.input_projection.weight": "multi_modal_projector.mm_input_projection_weight",
        "mm.soft_emb_norm.weight": "multi_modal_projector.mm_soft_emb_norm.weight",
    }
    tensors = rename(raw, names, _SIGLIP_BLOCK, "vision_tower.encoder.layers.", source)
    # Pictures are resized to the encoder's square (Gemma3ImageProcessor's steps; no pan-and-scan crops).
    processor = ImageProcessor.from_dict(
        {
            "image_processor_type": "Gemma3ImageProcessor",
            "size": {"height": vision["image_size"], "width": vision["image_size"]},
            "image_mean": meta["clip.vision.image_mean"],
            "image_std": meta["clip.vision.image_std"],
        },
        source=source,
    )
    return extra, tensors, processor


# --- LLaVA with a CLIP or SigLIP tower: projector type "mlp", from llama.cpp's legacy scripts ----------------------
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


def _llava_mlp(meta: dict[str, Any], raw: Tensors, text_meta: dict[str, Any], source: str):
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


FAMILIES: dict[str, Family] = {
    "gemma3": Family("Gemma3ForConditionalGeneration", "<image_soft_token>", _gemma3),
    "idefics3": Family("Idefics3ForConditionalGeneration", "<image>", _idefics3),
    "mlp": Family("LlavaForConditionalGeneration", "<image>", _llava_mlp, width_tensor="mm.2.bias"),
    "pixtral": Family("LlavaForConditionalGeneration", "[IMG]", _pixtral, "Mistral3ForConditionalGeneration"),
    "qwen2vl_merger": Family("Qwen2VLForConditionalGeneration", "<|image_pad|>", _qwen2_vl),
    "qwen2.5vl_merger": Family("Qwen2_5_VLForConditionalGeneration", "<|image_pad|>", _qwen2_5_vl),
}
