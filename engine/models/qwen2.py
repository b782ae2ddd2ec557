"""Qwen2: Llama with biases on the q/k/v projections (never on o)."""

from __future__ import annotations

from engine.config.model import ModelConfig
from engine.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    architectures = ("Qwen2ForCausalLM",)

    @staticmethod
    def projection_biases(config: ModelConfig) -> tuple[bool, bool]:
        return True, False
