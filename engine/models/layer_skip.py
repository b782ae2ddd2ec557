"""Self-speculative drafting: a model's first layers, read out through its own final norm and head.

A speculative decoder needs a cheap draft model that agrees with the main model often. When no smaller
model with the same tokenizer is at hand, the main model can draft for itself by exiting early: run only
its first k decoder layers, then apply the final norm and the LM head to that intermediate hidden state
(early-exit self-speculation, as in LayerSkip, Elhoushi et al. 2024; Draft & Verify, Zhang et al. 2023,
skips a chosen set of middle layers instead). The residual stream of a pre-norm transformer stays in one
space from layer to layer, so the head can read a distribution from it early; later layers refine it.

    full model   embed -> layer 0 .. layer k-1 -> layer k .. layer L-1 -> norm -> head
    draft        embed -> layer 0 .. layer k-1 ---------------------------> norm -> head
                 (the same module objects: no weight is copied)

The draft costs about k/L of a forward and a KV cache of k layers (`Cache(draft, ...)`). The main model
verifies every drafted token, so output is unchanged whatever the draft proposes; only speed depends on
how often it is right. Models trained for early exit (LayerSkip) agree with their early layers often; a
stock model rarely does (`python -m engine bench --only features` shows the share of drafts accepted), so
there the draft costs more than it saves.
"""

from __future__ import annotations

import copy
import dataclasses

from torch import nn

from engine.models.base import Model


def truncated_draft(model: Model, num_layers: int) -> Model:
    """A shallow copy of `model` that runs only its first `num_layers` decoder layers, then its norm and head.

    The copy shares every parameter and buffer with `model` (no memory is copied) and has its own config
    with `num_hidden_layers = num_layers`, so `Cache(draft, ...)` holds K/V for those layers only. It shares
    the tokenizer too. For a vision-language model the draft is its language model's truncated copy (the
    generator drafts text only). Raises ValueError when `num_layers` is not between 1 and the model's layer
    count minus one, or when the model does not keep its layers where this function looks for them.
    """
    text_model = getattr(model, "language_model", None)
    if isinstance(text_model, Model):
        draft = truncated_draft(text_model, num_layers)
        draft.tokenizer = _tokenizer_of(model)  # the VLM's, which its prompts are written in
        return draft
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not hasattr(body, "norm"):
        raise ValueError(
            f"{type(model).__name__} keeps no decoder layers at model.layers with a final model.norm, so no "
            "early-exit draft can be cut from it; use n-gram speculation or a separate draft model instead"
        )
    total = len(layers)
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers < total:
        raise ValueError(
            f"a truncated draft keeps between 1 and {total - 1} of the model's {total} layers, got {num_layers!r}"
        )

    draft_body = _shallow_module_copy(body)
    draft_body.layers = nn.ModuleList(list(layers)[:num_layers])  # the same layer objects
    draft = _shallow_module_copy(model)
    draft.model = draft_body
    draft.config = dataclasses.replace(model.config, num_hidden_layers=num_layers)
    draft.tokenizer = _tokenizer_of(model)  # loaded once, for both
    return draft


def _tokenizer_of(model: Model):
    try:
        return model.tokenizer
    except AttributeError:  # built in memory, not from files: no tokenizer to share
        return None


def _shallow_module_copy(module: nn.Module) -> nn.Module:
    # copy.copy shares the instance dict's values, including nn.Module's registries (_modules, _parameters,
    # _buffers): give the copy its own, so replacing a child on it leaves the original untouched.
    twin = copy.copy(module)
    twin._modules = dict(module._modules)
    twin._parameters = dict(module._parameters)
    twin._buffers = dict(module._buffers)
    return twin
