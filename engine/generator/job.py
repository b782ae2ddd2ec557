"""DynamicJob: one generation request, its settings, and the state the generator keeps for it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from numbers import Integral
from typing import Any

import torch

from engine.generator.filters import Filter
from engine.generator.guidance import check_cfg_scale, split_prompt_pair
from engine.generator.images import check_job_embeddings
from engine.generator.sampler import SamplerSettings
from engine.reasoning import ReasoningFormat


def _as_id_list(input_ids: Any) -> list[int]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise ValueError(
                    f"input_ids has batch size {input_ids.shape[0]}; a job takes one sequence of shape (1, n), "
                    "or two (positive, negative) for classifier-free guidance. Create one job per prompt."
                )
            input_ids = input_ids[0]
        if input_ids.dim() != 1 or input_ids.is_floating_point():
            raise ValueError(f"input_ids must be integer token ids of shape (1, n), got {tuple(input_ids.shape)}")
        return input_ids.tolist()
    if isinstance(input_ids, (list, tuple)) and all(isinstance(t, int) for t in input_ids):
        return list(input_ids)
    raise ValueError("input_ids must be a LongTensor of shape (1, n) or a list of ints")


def _check_filters(filters: Any, token_healing: bool) -> list[Filter]:
    if filters is None:
        return []
    if isinstance(filters, Filter):
        filters = [filters]
    if not isinstance(filters, (list, tuple)):
        raise ValueError(f"filters must be a list of filters (JSONFilter, RegexFilter, ChoiceFilter), got {filters!r}")
    for f in filters:
        if not isinstance(f, Filter):
            raise ValueError(
                f"filters must hold Filter objects (JSONFilter, RegexFilter, ChoiceFilter from "
                f"engine.generator.filters), got {type(f).__name__}: {f!r}"
            )
    if filters and token_healing:
        # A healed first token starts with prompt text the filter never sees, so the two cannot be combined.
        raise ValueError("token_healing cannot be combined with filters; turn one of them off for this job")
    return list(filters)


def check_text(name: str, text: str) -> None:
    """A lone surrogate ("\\udcff", e.g. from a file name decoded with surrogateescape) is no character: no
    tokenizer can encode it and no decoded text contains it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{name} holds {text!r}, which is not valid text ({e.reason} at position {e.start}); "
            "pass strings of real characters"
        ) from None


def _count(name: str, value: Any, lo: int) -> int:
    # bool is an int to Python, but max_new_tokens=True is a mistake, not a request for one token.
    if isinstance(value, bool) or not isinstance(value, Integral) or value < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")
    return int(value)


def _check_stop_conditions(stop_conditions: Any) -> tuple[set[int], list[str]]:
    if stop_conditions is None:
        return set(), []
    if isinstance(stop_conditions, str):
        raise ValueError(
            f"stop_conditions must be a list of token ids and strings, got the string {stop_conditions!r} (which "
            f"would stop on each of its characters); pass [{stop_conditions!r}] to stop on that string"
        )
    if isinstance(stop_conditions, Integral) and not isinstance(stop_conditions, bool):
        raise ValueError(
            f"stop_conditions must be a list of token ids and strings, got the int {stop_conditions!r}; "
            f"pass [{stop_conditions!r}] to stop on that token"
        )
    if not isinstance(stop_conditions, Iterable):
        raise ValueError(
            f"stop_conditions must be a list of token ids (int) and strings, got {type(stop_conditions).__name__} "
            f"({stop_conditions!r}), e.g. [tokenizer.eos_token_id, '\\n\\n']"
        )
    stop_tokens: set[int] = set()
    stop_strings: list[str] = []
    for cond in stop_conditions:
        if isinstance(cond, bool) or not isinstance(cond, (Integral, str)):
            raise ValueError(
                f"stop_conditions may hold token ids (int) and strings, not {type(cond).__name__} ({cond!r})"
            )
        if isinstance(cond, str):
            check_text("stop_conditions", cond)
            if cond:
                stop_strings.append(cond)
        elif cond < 0:
            raise ValueError(f"stop_conditions holds the token id {cond}; token ids are >= 0")
        else:
            stop_tokens.add(int(cond))
    return stop_tokens, stop_strings


def _check_seed(seed: Any) -> int | None:
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, Integral) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be None (random) or an int in [0, 2**64), got {seed!r}")
    return int(seed)


class DynamicJob:
    """A generation request. Create it, hand it to `DynamicGenerator.enqueue`, read results from `iterate()`.

    input_ids may be a (positive, negative) prompt pair for classifier-free guidance with gen_settings.cfg_scale
    (see engine.generator.guidance), the scale read when the job is made; a single prompt ignores cfg_scale. A pair
    given as one [2, n] tensor is taken to be left-padded, and its padding is stripped at enqueue.

    With `reasoning` (an engine.reasoning.ReasoningFormat, e.g. from reasoning_format_of(template, tokenizer))
    each streaming result also splits its "text" into "reasoning" and "answer", tags left out, and the eos
    result holds "full_reasoning" and "full_answer"; whether the answer starts inside a reasoning block is
    read from the prompt's last tokens (a template that opened one).

    `prompt_penalties` False makes the presence and frequency penalties count generated tokens only, OpenAI's
    rule (the server's); the repetition penalty still counts the prompt too, as vLLM's does. True (the
    default, exllamav2's way) counts the prompt for all three.

    `priority`: waiting jobs of a higher priority are admitted first, equal ones first come first served (the
    app's chats go ahead of its local server's requests). A running job is never preempted.
    """

    def __init__(
        self,
        input_ids: torch.Tensor | Sequence[int],
        max_new_tokens: int,
        min_new_tokens: int = 0,
        max_skips: int = 4,
        gen_settings: SamplerSettings | None = None,
        seed: int | None = None,
        stop_conditions: Sequence[int | str] | None = None,
        decode_special_tokens: bool = False,
        return_top_tokens: int = 0,
        return_logits: bool = False,
        return_probs: bool = False,
        filters: Sequence[Filter] | Filter | None = None,
        filter_prefer_eos: bool = False,
        token_healing: bool = False,
        identifier: object = None,
        banned_strings: Sequence[str] | None = None,
        embeddings: Sequence[Any] | None = None,
        reasoning: ReasoningFormat | None = None,
        prompt_penalties: bool = True,
        priority: int = 0,
    ):
        filters = _check_filters(filters, token_healing)
        pair = split_prompt_pair(input_ids)
        self.negative_ids: list[int] | None = None  # the negative prompt of a CFG job
        self.left_padded = False  # a [2, n] pair whose padding the generator strips at enqueue
        self.cfg_scale: float | None = None  # gen_settings.cfg_scale of a CFG job, read here once
        if pair is None:
            self.prompt_ids = _as_id_list(input_ids)
        else:
            self.prompt_ids, self.negative_ids, self.left_padded = pair
            self.cfg_scale = check_cfg_scale(gen_settings)
        if not self.prompt_ids:
            raise ValueError("input_ids is empty: a job needs at least one prompt token")
        max_new_tokens = _count("max_new_tokens", max_new_tokens, 1)
        min_new_tokens = _count("min_new_tokens", min_new_tokens, 0)
        if min_new_tokens > max_new_tokens:
            raise ValueError(
                f"min_new_tokens ({min_new_tokens}) must be between 0 and max_new_tokens ({max_new_tokens})"
            )
        max_skips = _count("max_skips", max_skips, 0)
        return_top_tokens = _count("return_top_tokens", return_top_tokens, 0)
        if gen_settings is not None and not isinstance(gen_settings, SamplerSettings):
            raise ValueError(f"gen_settings must be a SamplerSettings, got {type(gen_settings).__name__}")
        seed = _check_seed(seed)
        stop_tokens, stop_strings = _check_stop_conditions(stop_conditions)
        check_job_embeddings(self.prompt_ids, list(embeddings or ()))
        if isinstance(banned_strings, str):
            raise ValueError(f"banned_strings must be a list of strings; pass [{banned_strings!r}]")
        for s in banned_strings or ():
            if not isinstance(s, str) or not s:
                raise ValueError(f"banned_strings must be non-empty strings, got {s!r}")
            check_text("banned_strings", s)

        self.max_new_tokens = max_new_tokens
        self.min_new_tokens = min_new_tokens
        self.max_skips = max_skips
        self.gen_settings = gen_settings if gen_settings is not None else SamplerSettings()
        self.seed = seed
        self.stop_tokens = stop_tokens
        self.stop_strings = tuple(stop_strings)
        self.decode_special_tokens = decode_special_tokens
        self.return_top_tokens = return_top_tokens
        self.return_logits = return_logits
        self.return_probs = return_probs
        self.filters = filters  # list of Filter, empty when the output is free
        self.filter_prefer_eos = filter_prefer_eos
        self.token_healing = token_healing
        self.identifier = identifier
        self.banned_strings = tuple(banned_strings or ())
        self.embeddings = list(embeddings or ())
        if reasoning is not None and not isinstance(reasoning, ReasoningFormat):
            raise ValueError(f"reasoning must be a ReasoningFormat (engine.reasoning) or None, got {reasoning!r}")
        self.reasoning = reasoning  # results then tell reasoning from answer
        self.prompt_penalties = bool(prompt_penalties)
        if isinstance(priority, bool) or not isinstance(priority, Integral):
            raise ValueError(f"priority must be an int (higher is admitted first), got {priority!r}")
        self.priority = int(priority)

        # Set by the generator.
        self.serial: int | None = None
        self.generator: Any = None  # the DynamicGenerator it is queued on or running in; None once it ends
        self.time_enqueued = time.perf_counter()

    def __repr__(self) -> str:
        ident = f" identifier={self.identifier!r}" if self.identifier is not None else ""
        neg = f" negative={len(self.negative_ids)} tokens" if self.negative_ids is not None else ""
        return f"<DynamicJob serial={self.serial}{ident} prompt={len(self.prompt_ids)} tokens{neg}>"
