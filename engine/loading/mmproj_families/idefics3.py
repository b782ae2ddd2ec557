"""Idefics3 / SmolVLM from an mmproj of projector type 'idefics3'."""

from __future__ import annotations

from typing import Any

from engine.loading.mmproj_families.base import SIGLIP_BLOCK, Tensors, rename, vision_config


def translate_idefics3(meta: dict[str, Any], raw: Tensors, text_meta: dict[str, Any], source: str):
    from engine.models.idefics3.processor import Idefics3ImageProcessor

    vision = vision_config(meta, "idefics3_vision")
    extra = {"vision_config": vision, "scale_factor": meta["clip.vision.projector.scale_factor"]}
    names = {
        "v.patch_embd.weight": "model.vision_model.embeddings.patch_embedding.weight",
        "v.patch_embd.bias": "model.vision_model.embeddings.patch_embedding.bias",
        "v.position_embd.weight": "model.vision_model.embeddings.position_embedding.weight",
        "v.post_ln.weight": "model.vision_model.post_layernorm.weight",
        "v.post_ln.bias": "model.vision_model.post_layernorm.bias",
        "mm.model.fc.weight": "model.connector.modality_projection.proj.weight",
    }
    tensors = rename(raw, names, SIGLIP_BLOCK, "model.vision_model.encoder.layers.", source)
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
