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

from engine.errors import CorruptFileError

Tensors = dict[str, torch.Tensor]
# (mmproj metadata, mmproj tensors by GGUF name, text file metadata, source for messages)
#   -> (config.json keys besides text_config, checkpoint tensors, image processor)
Translate = Callable[[dict[str, Any], Tensors, dict[str, Any], str], tuple[dict[str, Any], Tensors, Any]]


@dataclass(frozen=True)
class Family:
    architecture: str  # the model class the translated checkpoint loads as
    image_token: str  # the vocabulary token the family's prompts hold where an image goes
    translate: Translate


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


FAMILIES: dict[str, Family] = {
    "idefics3": Family("Idefics3ForConditionalGeneration", "<image>", _idefics3),
}
