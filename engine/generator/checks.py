"""Whether a job can ever run on a generator: its ids, its images, and its length against the cache.

enqueue() (and DynamicGeneratorAsync.enqueue, in the caller's thread) raise these errors before a job is
queued, so a job that could never fit fails at once instead of waiting forever.
"""

from __future__ import annotations

import torch

from engine.cache.manager import CacheManager
from engine.generator import guidance
from engine.generator.images import check_embeddings_fit, longest_image_run
from engine.generator.job import DynamicJob
from engine.vision.embedding import is_mm_id


def check_job(job: DynamicJob, model, cache: CacheManager, max_batch_size: int, max_seq_len: int) -> None:
    """Raise ValueError, saying what to change, if `job` can never run with this model and cache."""
    num_pages = cache.num_pages
    vocab = model.config.vocab_size
    bad = [t for t in job.prompt_ids if not 0 <= t < vocab and not is_mm_id(t)]
    if bad:
        raise ValueError(f"input_ids holds token ids outside the vocabulary (0..{vocab - 1}): {bad[:5]}")
    _check_vocab_ids(job, vocab)
    check_embeddings_fit(model, job.embeddings)
    total = len(job.prompt_ids) + job.max_new_tokens
    needed = cache.pages_for(total)
    if needed > num_pages:
        raise ValueError(
            f"the job needs {needed} cache pages of {cache.page_size} tokens (prompt {len(job.prompt_ids)} + "
            f"max_new_tokens {job.max_new_tokens}) but the whole cache has {num_pages}; make the cache "
            "larger, shorten the prompt, or lower max_new_tokens"
        )
    window = cache.window
    if window is not None:
        step = max(window.decode_tokens, longest_image_run(job.prompt_ids))
        if window.slots_for(step) > window.num_slots:
            tokens = window.slots_for(step) * cache.page_size
            raise ValueError(
                f"the cache's sliding-window layers keep {window.num_slots * cache.page_size} tokens, fewer than "
                f"one window and one step of this job need ({tokens}); make the cache with sliding_tokens >= {tokens}"
            )
    states = getattr(cache, "states", None)
    if states is not None:
        _check_state_slots(job, cache, states)
    if job.negative_ids is not None:
        guidance.check_fits(job, vocab, max_batch_size, cache.pages_for, num_pages, max_seq_len)
    if total > max_seq_len:
        raise ValueError(
            f"the job needs {total} tokens (prompt {len(job.prompt_ids)} + max_new_tokens "
            f"{job.max_new_tokens}) but max_seq_len is {max_seq_len}; shorten the prompt or lower "
            "max_new_tokens"
        )


def _check_vocab_ids(job: DynamicJob, vocab: int) -> None:
    """Token ids a job names besides its prompt must be in the model's vocabulary (0..vocab - 1)."""
    stop = sorted(t for t in job.stop_tokens if t >= vocab)
    if stop:
        raise ValueError(
            f"stop_conditions holds token ids outside the vocabulary (0..{vocab - 1}): {stop[:5]}; pass ids the "
            "tokenizer gives, e.g. tokenizer.eos_token_ids"
        )
    settings = job.gen_settings
    bias = settings.token_bias
    if isinstance(bias, torch.Tensor) and bias.numel() > vocab:
        raise ValueError(
            f"gen_settings.token_bias has {bias.numel()} entries but the vocabulary has {vocab} tokens; pass a "
            f"[{vocab}] tensor or a dict token id -> bias"
        )
    named = {
        "gen_settings.token_bias": bias if isinstance(bias, dict) else (),
        "gen_settings.disallowed_tokens": settings.disallowed_tokens,
    }
    for name, ids in named.items():
        bad = sorted(t for t in ids if t >= vocab)
        if bad:
            raise ValueError(
                f"{name} holds token ids outside the vocabulary (0..{vocab - 1}): {bad[:5]}; use ids below {vocab}"
            )


def _check_state_slots(job: DynamicJob, cache: CacheManager, states) -> None:
    """A hybrid model's job needs a recurrent-state slot per sequence (two with CFG) among the live ones, and a
    spare each, from the whole pool, when it may rewind (banned strings, speculative decoding)."""
    num_seqs = 2 if job.negative_ids is not None else 1
    needed = cache.slots_needed(bool(job.banned_strings), num_seqs)
    if num_seqs <= states.num_live and needed <= states.num_slots:
        return
    what = "a CFG job runs two sequences, each with its own recurrent state: it" if num_seqs > 1 else "this job"
    spares = " and a spare each, to rewind (banned strings, drafts)," if needed > num_seqs else ""
    raise ValueError(
        f"{what} needs {num_seqs} live recurrent-state slot(s){spares} {needed} in all, but the cache has "
        f"{states.num_live} live and {states.num_slots} in all; make the cache with state_bytes >= "
        f"{num_seqs * states.bytes_per_slot:,} and state_bytes + snapshot_bytes >= {needed * states.bytes_per_slot:,}"
    )
