"""Per projector type: how an mmproj's `clip.*` metadata and `v.*` / `mm.*` tensors read as the Hugging Face
config and checkpoint of the family Tandem already runs (see engine/loading/mmproj.py). One module per family;
base.py holds what they share.
"""

from __future__ import annotations

from engine.loading.mmproj_families.base import Family, MmprojError
from engine.loading.mmproj_families.gemma3 import translate_gemma3
from engine.loading.mmproj_families.idefics3 import translate_idefics3
from engine.loading.mmproj_families.llava import translate_llava_mlp
from engine.loading.mmproj_families.pixtral import translate_pixtral
from engine.loading.mmproj_families.qwen2_vl import translate_qwen2_5_vl, translate_qwen2_vl

__all__ = ["FAMILIES", "Family", "MmprojError"]

FAMILIES: dict[str, Family] = {
    "gemma3": Family("Gemma3ForConditionalGeneration", "<image_soft_token>", translate_gemma3),
    "idefics3": Family("Idefics3ForConditionalGeneration", "<image>", translate_idefics3),
    "mlp": Family("LlavaForConditionalGeneration", "<image>", translate_llava_mlp, width_tensor="mm.2.bias"),
    "pixtral": Family("LlavaForConditionalGeneration", "[IMG]", translate_pixtral, "Mistral3ForConditionalGeneration"),
    "qwen2vl_merger": Family("Qwen2VLForConditionalGeneration", "<|image_pad|>", translate_qwen2_vl),
    "qwen2.5vl_merger": Family("Qwen2_5_VLForConditionalGeneration", "<|image_pad|>", translate_qwen2_5_vl),
}
