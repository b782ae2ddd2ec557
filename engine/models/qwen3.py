"""Qwen3: Llama with an RMSNorm over each head of q and k before rotary (`config.qk_norm`)."""

from __future__ import annotations

from engine.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    architectures = ("Qwen3ForCausalLM",)
