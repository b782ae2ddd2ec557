"""The LLaVA projector: maps vision-encoder features into the language model's embedding space."""

from __future__ import annotations

import torch
from torch import nn

from engine.models.linear import Linear
from engine.vision.layers import activation


class LlavaProjector(nn.Module):
    """linear_1 -> activation -> linear_2, from `vision_dim` (the encoder width times the number of feature
    layers concatenated) to the text model's `text_dim`."""

    def __init__(self, vision_dim: int, text_dim: int, act: str, bias: bool):
        super().__init__()
        self.linear_1 = Linear(vision_dim, text_dim, bias=bias)
        self.act = activation(act, "projector_hidden_act")
        self.linear_2 = Linear(text_dim, text_dim, bias=bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(features)))
