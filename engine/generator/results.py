"""The result dictionaries `iterate()` returns, described for readers and type checkers."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

import torch

Stage = Literal["started", "prefill", "streaming"]
EosReason = Literal["stop_token", "stop_string", "max_new_tokens", "end_filter"]


class Held(TypedDict):
    text: str  # text held back (a possible stop/banned string start, or half a character) and never emitted
    token_ids: torch.Tensor  # [1, n] the tokens behind it


class Result(TypedDict, total=False):
    job: Any  # the DynamicJob
    serial: int
    identifier: object  # only when the job has one
    stage: Stage
    eos: bool
    # stage "prefill"
    curr_progress: int
    max_progress: int
    # stage "streaming"
    text: str
    reasoning: str  # with a job's ReasoningFormat: the part of `text` that is thinking, tags left out
    answer: str  # ... and the part that is answer
    token_ids: torch.Tensor  # [1, n] tokens released with `text`
    token_probs: torch.Tensor  # [1, n] when return_probs
    top_k_tokens: torch.Tensor  # [1, n, k] when return_top_tokens
    top_k_probs: torch.Tensor
    logits: torch.Tensor  # [1, n, vocab] when return_logits
    suppressed_text: str  # a banned string that was undone this step
    suppressed_tokens: torch.Tensor
    # when eos
    eos_reason: EosReason
    eos_triggering_token_id: int
    eos_triggering_token_str: str
    eos_triggering_string: str
    full_completion: str
    full_reasoning: str  # with a ReasoningFormat: all the thinking, tags left out
    full_answer: str  # ... and all the answer
    new_tokens: int
    prompt_tokens: int
    cached_tokens: int
    cached_pages: int
    time_enqueued: float
    time_prefill: float
    time_generate: float
    held: Held
    accepted_draft_tokens: int  # when the generator speculates: drafted tokens the model accepted
    rejected_draft_tokens: int  # ... and drafted tokens it rejected
