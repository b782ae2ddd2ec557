"""Classifier-free guidance (CFG): a job guided by a positive prompt and pushed away from a negative one.

A CFG job's input_ids is a pair: a [2, n] tensor (row 0 positive, row 1 negative, as exllamav2's tokenizer
returns for a list of two strings, left-padded), or a list/tuple of two prompts (1-D or [1, n] tensors, or
lists of ints). The generator runs the two as two sequences of one job, planned into the same forward, and
samples every step from the mixture of their next-token log-probabilities (exllamav2's convention):

    mixed = cfg_scale * log_softmax(positive) + (1 - cfg_scale) * log_softmax(negative)

cfg_scale = 1 is the positive prompt alone, 0 the negative alone, > 1 steers away from the negative. The
token sampled from `mixed` (through every sampler step, with the job's own seeded generator) is appended to
both sequences, so the negative sequence mirrors the generated text. A CFG job never speculates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from numbers import Real
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from engine.generator.scheduler import Step

# A token the negative prompt rules out entirely (log-prob -inf) would get an infinite mixed logit for
# cfg_scale > 1; it is treated as merely very unlikely there instead.
_MIN_NEGATIVE_LOGPROB = -1.0e4


class PairJob(Protocol):
    """The fields of a CFG job this module reads and rewrites (DynamicJob has them; job.py imports this module)."""

    prompt_ids: list[int]
    negative_ids: list[int] | None
    left_padded: bool
    max_new_tokens: int


def _one_prompt(prompt: Any, which: str) -> list[int]:
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() == 2 and prompt.shape[0] == 1:
            prompt = prompt[0]
        if prompt.dim() != 1 or prompt.is_floating_point():
            raise ValueError(
                f"the {which} prompt of a CFG pair must be integer token ids of shape (n,) or (1, n), "
                f"got {prompt.dtype} {tuple(prompt.shape)}"
            )
        return prompt.tolist()
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    raise ValueError(f"the {which} prompt of a CFG pair must be a LongTensor or a list of ints, got {prompt!r}")


def split_prompt_pair(input_ids: Any) -> tuple[list[int], list[int], bool] | None:
    """(positive ids, negative ids, left_padded) when input_ids is a CFG pair; None for a single prompt.

    left_padded is True for a [2, n] tensor: its shorter row may start with padding, which the generator
    strips at enqueue (it knows the tokenizer's pad id). Raises ValueError for more than two prompts and for
    an empty one.
    """
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() != 2 or input_ids.shape[0] != 2:
            return None  # one prompt, or a shape _as_id_list reports
        pair, left_padded = [_one_prompt(row, which) for row, which in zip(input_ids, ("positive", "negative"))], True
    elif (
        isinstance(input_ids, (list, tuple))
        and input_ids
        and all(isinstance(p, (torch.Tensor, list, tuple)) for p in input_ids)
    ):
        if len(input_ids) != 2:
            raise ValueError(
                f"input_ids holds {len(input_ids)} prompts; a job takes one prompt, or two (positive, negative) "
                "for classifier-free guidance. Create one job per prompt."
            )
        pair, left_padded = [_one_prompt(p, which) for p, which in zip(input_ids, ("positive", "negative"))], False
    else:
        return None
    for ids, which in zip(pair, ("positive", "negative")):
        if not ids:
            raise ValueError(f"the {which} prompt of the CFG pair is empty: each needs at least one token")
    return pair[0], pair[1], left_padded


def check_cfg_scale(settings: Any) -> float:
    """The job's cfg_scale as a float; ValueError when a CFG job has none or a non-finite one."""
    scale = getattr(settings, "cfg_scale", None)
    if scale is None:
        raise ValueError(
            "input_ids is a (positive, negative) prompt pair but gen_settings.cfg_scale is None; set the guidance "
            "scale, e.g. SamplerSettings(cfg_scale=1.5) (1.0 follows the positive prompt alone)"
        )
    if isinstance(scale, bool) or not isinstance(scale, Real) or not math.isfinite(scale):
        raise ValueError(f"gen_settings.cfg_scale must be a finite number, got {scale!r}")
    return float(scale)


def padding_id(tokenizer: Any) -> int:
    """The id a batch of prompts is left-padded with: the pad token, else end-of-sequence, else 0."""
    return next((i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id) if i is not None), 0)


def strip_left_padding(job: PairJob, tokenizer: Any) -> None:
    """Drop the left padding of a [2, n] CFG pair (a no-op for other jobs); called once, at enqueue.

    Only padding the other row lacks is removed: a pad-valued token both rows start with (a BOS that doubles
    as pad) is part of both prompts. Raises ValueError when a row was nothing but padding.
    """
    if not job.left_padded:
        return
    pad = padding_id(tokenizer)
    rows = [job.prompt_ids, job.negative_ids]
    leading = [next((i for i, t in enumerate(r) if t != pad), len(r)) for r in rows]
    common = min(leading)
    job.prompt_ids, job.negative_ids = (r[n - common :] for r, n in zip(rows, leading))
    job.left_padded = False
    for ids, which in zip((job.prompt_ids, job.negative_ids), ("positive", "negative")):
        if not ids:
            raise ValueError(
                f"the {which} row of the CFG input_ids is only padding (id {pad}); encode a non-empty prompt"
            )


def check_fits(
    job: PairJob,
    vocab_size: int,
    max_batch_size: int,
    pages_for: Callable[[int], int],
    num_pages: int,
    max_seq_len: int,
) -> None:
    """Raise ValueError when a CFG job's two sequences can never run together on this generator."""
    bad = [t for t in job.negative_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(
            f"the negative prompt holds token ids outside the vocabulary (0..{vocab_size - 1}): {bad[:5]}; "
            "a negative prompt is text only (no image tokens)"
        )
    if max_batch_size < 2:
        raise ValueError(
            f"a CFG job runs two sequences at once but this generator's max_batch_size is {max_batch_size} "
            "(paged=False allows one); make the generator with paged=True and max_batch_size >= 2"
        )
    pos, neg = len(job.prompt_ids) + job.max_new_tokens, len(job.negative_ids) + job.max_new_tokens
    needed = pages_for(pos) + pages_for(neg)
    if needed > num_pages:
        raise ValueError(
            f"the CFG job needs {needed} cache pages for its two sequences (positive {len(job.prompt_ids)} + "
            f"negative {len(job.negative_ids)} prompt tokens, each + max_new_tokens {job.max_new_tokens}) but the "
            f"whole cache has {num_pages}; make the cache larger, shorten the prompts, or lower max_new_tokens"
        )
    if neg > max_seq_len:
        raise ValueError(
            f"the negative prompt needs {neg} tokens (prompt {len(job.negative_ids)} + max_new_tokens "
            f"{job.max_new_tokens}) but max_seq_len is {max_seq_len}; shorten it or lower max_new_tokens"
        )


def mix_logits(positive: torch.Tensor, negative: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """scale * log_softmax(positive) + (1 - scale) * log_softmax(negative), rows [R, V] in float32.

    `scale` is [R, 1]. A token impossible under the positive prompt stays impossible.
    """
    pos = torch.log_softmax(positive.float(), dim=-1)
    neg = torch.log_softmax(negative.float(), dim=-1).clamp_min(_MIN_NEGATIVE_LOGPROB)
    mixed = scale * pos + (1.0 - scale) * neg
    return mixed.masked_fill(pos == -torch.inf, -torch.inf)


def mix_pairs(
    steps: Sequence[Step], logits: torch.Tensor, num_rows: Mapping[int, int], scales: Mapping[int, float]
) -> tuple[list[Step], torch.Tensor]:
    """Each CFG job's positive and negative logits row -> one mixed row in the positive's place.

    `steps` are the steps that produced logits, in forward order; step k owns num_rows.get(serial, 1)
    consecutive rows (speculative verify steps own more). Negative (shadow) steps and their rows are dropped;
    other rows are kept unchanged, in order, in the logits' dtype.
    """
    kept: list[Step] = []
    index: list[int] = []
    positive_at: dict[int, tuple[int, int]] = {}  # serial -> (row in logits, row in the output)
    negative_at: dict[int, int] = {}
    row = 0
    for step in steps:
        n = num_rows.get(step.seq.serial, 1)
        if step.seq.shadow:
            negative_at[step.seq.serial] = row
        else:
            if step.seq.negative is not None:
                positive_at[step.seq.serial] = (row, len(index))
            kept.append(step)
            index.extend(range(row, row + n))
        row += n
    out = logits[index]  # [len(index), V], a copy
    serials = list(positive_at)
    if serials:
        pos = logits[[positive_at[s][0] for s in serials]]
        neg = logits[[negative_at[s] for s in serials]]
        scale = torch.tensor([[scales[s]] for s in serials], dtype=torch.float32, device=logits.device)
        out[[positive_at[s][1] for s in serials]] = mix_logits(pos, neg, scale).to(out.dtype)
    return kept, out
