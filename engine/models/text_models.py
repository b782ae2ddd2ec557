"""The text model families by architecture name: what `registry` lists, and what a vision-language model
builds its language model from (engine/models/vlm.py imports this, not the registry, which imports it)."""

from __future__ import annotations

from engine.errors import UnsupportedArchitectureError
from engine.models.base import Model
from engine.models.gemma3.text import Gemma3ForCausalLM
from engine.models.gpt_oss import GptOssForCausalLM
from engine.models.llama import LlamaForCausalLM
from engine.models.phi3 import Phi3ForCausalLM
from engine.models.qwen2 import Qwen2ForCausalLM
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.models.qwen3_5 import Qwen3_5ForCausalLM
from engine.models.qwen3_moe import Qwen3MoeForCausalLM
from engine.models.smollm3 import SmolLM3ForCausalLM

TEXT_MODELS: dict[str, type[Model]] = {
    arch: cls
    for cls in (
        LlamaForCausalLM,
        Qwen2ForCausalLM,
        Qwen3ForCausalLM,
        Qwen3MoeForCausalLM,
        Qwen3_5ForCausalLM,
        Gemma3ForCausalLM,
        GptOssForCausalLM,
        Phi3ForCausalLM,
        SmolLM3ForCausalLM,
    )
    for arch in cls.architectures
}


def text_model_class(architecture: str) -> type[Model]:
    try:
        return TEXT_MODELS[architecture]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"architecture {architecture!r} is not a supported language model. Supported: {', '.join(sorted(TEXT_MODELS))}."
        ) from None
