"""Gemma 3 from an mmproj of projector type 'gemma3'."""

from __future__ import annotations

from typing import Any

from engine.loading.mmproj_families.base import SIGLIP_BLOCK, MmprojError, Tensors, rename, vision_config


def translate_gemma3(meta: dict[str, Any], raw: Tensors, text_meta: dict[str, Any], source: str):
    from engine.config.gguf import gemma3_text_keys
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
    vision = vision_config(meta, "siglip_vision_model")
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
    tensors = rename(raw, names, SIGLIP_BLOCK, "vision_tower.encoder.layers.", source)
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
