"""What every projector type shares: the family record, the error for files Tandem cannot pair, the renaming of
llama.cpp's tensor names into checkpoint names, and the tower config every mmproj holds.

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


BLOCK = re.compile(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)")
SIGLIP_BLOCK = {
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
        match = BLOCK.fullmatch(name)
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


def vision_config(meta: dict[str, Any], model_type: str) -> dict[str, Any]:
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
