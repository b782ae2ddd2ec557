"""The pieces every family's vision tower is built from: activations by their config name, the two-layer MLP,
loading a part's weights with names and shapes checked, and reading vision config values with clear errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ModelLoadError, TensorMismatchError
from engine.models.base import PACKED, combine_parts, load_packed
from engine.models.linear import Linear


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    # CLIP's sigmoid approximation of GELU; the original OpenAI weights were trained with it.
    return x * torch.sigmoid(1.702 * x)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# Hugging Face `hidden_act` names -> functions. The tanh variants are one formula under different names.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "quick_gelu": _quick_gelu,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_new": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "silu": F.silu,
    "relu": F.relu,
}


def activation(name: str, where: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation function `name`; `where` names the config key for the error message."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ModelLoadError(
            f"config.json {where} is {name!r}, which is not supported; supported: {', '.join(sorted(ACTIVATIONS))}."
        ) from None


class VisionMLP(nn.Module):
    """fc1 -> activation -> fc2, the feed-forward block of CLIP, SigLIP and Qwen2-VL's towers; `config` has
    hidden_size, intermediate_size and hidden_act (its vision_config)."""

    def __init__(self, config: Any):
        super().__init__()
        self.act = activation(config.hidden_act, "vision_config.hidden_act")
        self.fc1 = Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def load_checked(
    module: nn.Module,
    tensors: dict[str, Any],
    what: str,
    checkpoint_names: Callable[[str], tuple[str, ...]] = lambda name: (name,),
) -> None:
    """Fill `module` (built on the meta device) from checkpoint-named `tensors`, checking every name and shape.

    `checkpoint_names(param)` lists the tensors concatenated on dim 0 to make a parameter (fused q/k/v);
    tensors the module has no use for are ignored. `what` names the part in error messages. A GGUF weight kept
    in its blocks (`BlockWeight`, `QuantizedWeight`, `SplitWeight`: an mmproj's quantized linears) stays so in
    a `Linear` that can hold it, as in the text models; anywhere else it is dequantized.
    """
    state: dict[str, torch.Tensor] = {}
    quantized: dict[str, Any] = {}
    for name, param in module.named_parameters():
        sources = checkpoint_names(name)
        missing = [s for s in sources if s not in tensors]
        if missing:
            raise TensorMismatchError(
                f"the checkpoint has no tensor {missing[0]!r} for the {what}. "
                "The checkpoint is incomplete or config.json does not describe it."
            )
        owner = module.get_submodule(name.rpartition(".")[0])
        value = combine_parts([tensors[s] for s in sources], owner)
        if tuple(value.shape) != tuple(param.shape):
            raise TensorMismatchError(
                f"tensor {' + '.join(sources)} of the {what} has shape {tuple(value.shape)} but config.json "
                f"implies {tuple(param.shape)}. config.json and the weights do not belong together."
            )
        if isinstance(value, PACKED):
            quantized[name] = value
        else:
            state[name] = value
    for name, value in quantized.items():  # each replaces its Linear's weight parameter by buffers
        load_packed(module, name, value)
    # not strict: a packed Linear's buffers are not in `state`; every parameter is, which the check below keeps
    module.load_state_dict(state, strict=False, assign=True)
    unfilled = [n for n, p in module.named_parameters() if p.is_meta]
    if unfilled:
        raise TensorMismatchError(
            f"no weights were found for {unfilled[:5]} of the {what}; the checkpoint is incomplete."
        )


def config_value(d: dict[str, Any], key: str, default: Any, cast: Callable[[Any], Any]) -> Any:
    """`cast(d[key])`, or `default` when the key is absent or null, with a clear error for a bad value."""
    value = d.get(key)
    if value is None:
        return default
    try:
        return cast(value)
    except (TypeError, ValueError):
        raise ModelLoadError(f"config.json has {key}={value!r}, which is not a valid {cast.__name__}.") from None


def config_int(d: dict[str, Any], key: str, default: int) -> int:
    """`d[key]` as a whole number (a token id, a count), or `default` when absent or null; no other type passes."""
    value = d.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelLoadError(f"config.json {key} must be an integer, got {value!r}")
    return value


def read_feature_layers(value: Any, num_layers: int) -> tuple[int, ...]:
    """`vision_feature_layer` (an index or a list) as non-negative indices into the hidden states.

    There are num_layers + 1 hidden states (index 0 is the encoder input), and negative indices count
    from the end, as in transformers.
    """
    indices = value if isinstance(value, list) else [value]
    num_states = num_layers + 1
    out = []
    for idx in indices:
        if isinstance(idx, bool) or not isinstance(idx, int) or not -num_states <= idx < num_states:
            raise ModelLoadError(
                f"config.json vision_feature_layer {value!r} is not a layer index (or list of them) of a vision "
                f"encoder with {num_layers} layers; valid indices are {-num_states}..{num_layers}."
            )
        out.append(idx % num_states)
    if not out:
        raise ModelLoadError("config.json vision_feature_layer is an empty list; name at least one layer.")
    return tuple(out)
