"""Phi-3 and Phi-4 (Phi-4-mini, phi-4): Llama's layers, as transformers' Phi3ForCausalLM computes them, with
what the config may add:

    partial rotary   rotary turns the first `partial_rotary_factor` of each head (Phi-4-mini: 96 of 128
                     dimensions), the rest passing through (ModelConfig.rotary_dim)
    LongRoPE         `rope_scaling` of type "longrope" (or "su"): per-frequency divisors, short and long, and an
                     attention factor on cos and sin (engine/models/rope.py's LongRopeTable)
    sliding window   `sliding_window` on every layer, as in Mistral

The checkpoint already holds q, k and v as one `qkv_proj` and gate and up as one `gate_up_proj` (gate first),
which is our own layout, so its tensors load under their own names; llama.cpp's phi3 GGUF files fuse them the
same way (engine/gguf/names.py).
"""

from __future__ import annotations

from engine.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    architectures = ("Phi3ForCausalLM",)

    def checkpoint_names(self, name: str) -> tuple[str, ...]:
        return (name,)  # fused in the checkpoint as in our layers
