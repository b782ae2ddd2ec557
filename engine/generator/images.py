"""Image embeddings in jobs: checking that prompt ids and embeddings belong together, and splicing rows.

An image stands in a prompt as a run of ids outside the vocabulary (see engine.vision.embedding). The
scheduler and the page table treat those ids like any other token, so identical images hash to identical
pages; only the forward's input differs: those positions take the image's embedding rows instead of a
vocabulary lookup.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from engine.vision.embedding import is_mm_id


def check_job_embeddings(prompt_ids: Sequence[int], embeddings: Sequence[Any]) -> None:
    """Raise ValueError unless every image id in the prompt has its embedding and every embedding is used.

    An embedding is used when its whole id run appears in order somewhere in the prompt (a cut run would
    feed the model part of an image).
    """
    for e in embeddings:
        if not all(hasattr(e, a) for a in ("embeddings", "first_id", "last_id", "text_alias")):
            raise ValueError(
                f"embeddings holds {type(e).__name__}, not an MMEmbedding; make one with "
                "model.vision.get_image_embeddings(...)"
            )
    for pos, t in enumerate(prompt_ids):
        if not is_mm_id(t):
            continue
        if not any(e.first_id <= t <= e.last_id for e in embeddings):
            raise ValueError(
                f"input_ids position {pos} holds image token id {t} but no embedding in embeddings=[...] owns "
                "it; pass the same MMEmbedding objects the prompt was encoded with"
            )
    for e in embeddings:
        starts = [i for i, t in enumerate(prompt_ids) if t == e.first_id]
        n = e.last_id - e.first_id + 1
        whole = any(list(prompt_ids[i : i + n]) == list(range(e.first_id, e.last_id + 1)) for i in starts)
        if not whole:
            raise ValueError(
                f"the image embedding {e.text_alias!r} was passed but its {n} token ids are not in input_ids; "
                "put its text_alias in the prompt and encode it with tokenizer.encode(text, embeddings=[...])"
            )


def check_embeddings_fit(model, embeddings: Sequence[Any]) -> None:
    """Raise ValueError if the model cannot take these embedding rows (text-only model, wrong width)."""
    if not embeddings:
        return
    if getattr(model, "vision", None) is None:
        raise ValueError(
            f"{model.config.architecture} is a text-only model, so it cannot see images; load a vision model "
            "(for example the bundled demo vision model) or remove the images"
        )
    for e in embeddings:
        if e.embeddings.shape[-1] != model.config.hidden_size:
            raise ValueError(
                f"the image embedding {e.text_alias!r} has rows of width {e.embeddings.shape[-1]} but this model's "
                f"hidden size is {model.config.hidden_size}; make the embedding with this model"
            )


def splice_inputs(model, ids: torch.Tensor, runs: Sequence[tuple[int, int, Sequence[Any]]]) -> torch.Tensor:
    """Input rows for a forward: vocabulary embeddings, with image rows where image ids stand.

    `runs` lists (start, length, embeddings) per sequence slice of `ids` that may hold image ids.
    """
    vocab = model.config.vocab_size
    x = model.embed(torch.where(ids < vocab, ids, torch.zeros_like(ids)))
    for start, length, embeddings in runs:
        part = ids[start : start + length]
        for e in embeddings:
            mask = (part >= e.first_id) & (part <= e.last_id)
            if mask.any():
                rows = (part[mask] - e.first_id).to(e.embeddings.device)
                x[start : start + length][mask] = e.embeddings[rows].to(device=x.device, dtype=x.dtype)
    return x


def longest_image_run(token_ids: Sequence[int]) -> int:
    """The longest run of consecutive image ids: how far a prefill chunk may grow to keep an image whole."""
    longest = run = 0
    for i, t in enumerate(token_ids):
        run = run + 1 if is_mm_id(t) and i > 0 and t == token_ids[i - 1] + 1 else int(is_mm_id(t))
        longest = max(longest, run)
    return longest
