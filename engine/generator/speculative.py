"""Speculative decoding: draft tokens cheaply, verify them all in one forward of the main model.

A draft proposes k tokens d_1..d_k after a job's newest token t. The main model runs [t, d_1..d_k] as one
query chunk and yields k + 1 logits rows; row i is the distribution p_i the job would sample from had
d_1..d_i been generated. Both drafters here (n-gram lookup and a draft model's argmax) propose one token
per position deterministically, i.e. q_i is a point mass on d_i, so the standard rule reduces to:

    greedy:  accept d_i while argmax(p_i) == d_i; the first mismatch emits argmax(p_i) instead.
    sampled: accept d_i with probability p_i(d_i); on rejection draw from p_i with d_i removed and
             renormalised:  P(x) = (1 - p(d)) * p(x) / (1 - p(d)) = p(x) for x != d,  P(d) = p(d).

so every emitted token has exactly the distribution of non-speculative sampling. When all k drafts are
accepted, row k gives one more token for free. Random numbers come from the job's seeded generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.generator import sampler_steps as steps
from engine.generator.results import Result
from engine.generator.sampler import SamplerSettings, SamplerState, distribution

_CONCAT_TENSORS = ("token_ids", "token_probs", "top_k_tokens", "top_k_probs", "logits")


def ngram_draft(tokens: Sequence[int], max_ngram: int, num_tokens: int, vocab_size: int) -> list[int]:
    """Up to `num_tokens` ids that followed the most recent earlier occurrence of the context's longest suffix.

    Suffixes of max_ngram tokens down to 1 are tried; ids outside the vocabulary (image runs) end a draft,
    since the main model could not be fed them as plain tokens.
    """
    n_tokens = len(tokens)
    for n in range(min(max_ngram, n_tokens - 1), 0, -1):
        suffix = list(tokens[n_tokens - n :])
        for start in range(n_tokens - n - 1, -1, -1):
            if tokens[start + n - 1] != suffix[-1] or list(tokens[start : start + n]) != suffix:
                continue
            draft = []
            for t in tokens[start + n : start + n + num_tokens]:
                if not 0 <= t < vocab_size:
                    break
                draft.append(t)
            if draft:
                return draft
    return []


def verify_sampled(
    logits_row: torch.Tensor,
    settings: SamplerSettings,
    state: SamplerState,
    blocked: set[int] | None,
    draft_id: int,
) -> tuple[tuple[int, float, None], bool]:
    """Accept or replace one drafted token of a sampled job -> ((token id, its probability, None), accepted).

    The probability returned is the token's in the job's final distribution, as sample() reports it.
    """
    ids, probs = distribution(logits_row, settings, state, blocked)  # [W], [W] float64, sums to 1
    hit = ids == draft_id
    p_draft = float(probs[hit].sum())
    u = float(torch.rand(1, generator=state.generator, dtype=torch.float64))
    if u < p_draft:
        return (draft_id, p_draft, None), True
    rest = probs.masked_fill(hit, 0.0)
    point = torch.rand(1, 1, generator=state.generator, dtype=torch.float64).to(rest.device)
    col = int(steps.draw(rest[None], point)[0])
    return (int(ids[col]), float(probs[col]), None), False


def merge_results(results: list[Result]) -> Result:
    """One streaming result for several tokens of one job emitted in the same iterate()."""
    if len(results) == 1:
        return results[0]
    merged: Result = dict(results[-1])  # eos, held text and counters come from the last
    merged["text"] = "".join(r.get("text", "") for r in results)
    for key in _CONCAT_TENSORS:
        parts = [r[key] for r in results if key in r]
        if parts:
            merged[key] = torch.cat(parts, dim=1)
    return merged


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
