"""Sampler: one batched ``sample`` call over per-job settings (:mod:`.sampler_settings`) and state
(:mod:`.sampler_state`).

Order of steps (each is a no-op for a row that does not use it; the math of each step is in
its docstring in :mod:`engine.generator.sampler_steps`)::

    logits [B, V] float32 (copied; the caller's tensor is never changed)
     1. penalties        repetition (divide positive / multiply negative logits), presence,
                         frequency; over token_repetition_range with token_repetition_decay
     2. bias / bans      token_bias added; disallowed_tokens and this step's `blocked` ids -> -inf
     3. DRY              multiplier * base ** (match_len - allowed_length) off each continuation
        --- greedy rows (top_k == 1 or temperature == 0) stop here: argmax, no sort ---
     4. softmax          p ∝ exp((l - max) / T), or exp(-s (l - max)**2 / T) with smoothing_factor s;
                         T = temperature, or 1 when temperature_last
     5. top_k  6. top_p  7. top_a  8. min_p  9. tfs  10. typical  11. mirostat (truncate)
    12. late temperature p ** (1/T): dynamic temperature when max_temp > min_temp, else
                         temperature when temperature_last (dynamic replaces it then, as in exllamav2)
    13. XTC              with probability xtc_probability (the job's own coin) drop every token
                         with p >= xtc_threshold except the least probable of them
    14. skew             C_k ** exp(skew) - C_{k-1} ** exp(skew) over the sorted candidates
    15. draw             inverse CDF with one uniform from the job's generator; mirostat mu update

Candidates are ordered by logit, highest first, ties by lower token id, and stay in that order
through every step; the rank-based steps (top_k, top_p, tfs, typical's tie order, XTC's "least
probable", skew, the draw) all use it. The returned probability is the chosen token's in the
final distribution (1.0 for greedy rows).

Determinism: every random number a row uses comes from its own ``SamplerState.generator``
(two uniforms per sampled step: the XTC coin, then the draw), distribution math runs in float64
with a batch-independent candidate order, so a seeded job draws the same tokens alone or in any
batch. Stateful steps (penalties, DRY: token history; mirostat: mu) run per row; everything
else is vectorised across rows, whatever their settings.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch

from engine.generator import sampler_steps as steps
from engine.generator.sampler_settings import SamplerSettings
from engine.generator.sampler_state import SamplerState, tokenize_breakers

# SamplerSettings, SamplerState and tokenize_breakers live in their own modules; importers keep this one.
__all__ = ["SampleOutput", "SamplerSettings", "SamplerState", "distribution", "sample", "tokenize_breakers"]


@dataclass(frozen=True)
class SampleOutput:
    """Result of :func:`sample` for a batch of ``B`` rows.

    ``token_ids [B]`` int64; ``token_probs [B]`` float32, the chosen token's probability in the
    final distribution; ``top_ids``/``top_probs [B, K]`` the ``K = return_top_k`` most probable
    tokens of the final distribution (zero-probability tokens follow in candidate order), or
    None when ``return_top_k = 0``.
    """

    token_ids: torch.Tensor
    token_probs: torch.Tensor
    top_ids: torch.Tensor | None = None
    top_probs: torch.Tensor | None = None


def sample(
    logits: torch.Tensor,
    settings: Sequence[SamplerSettings],
    states: Sequence[SamplerState],
    blocked: Sequence[Collection[int] | None] | None = None,
    return_top_k: int = 0,
) -> SampleOutput:
    """Sample one token per row of ``logits [B, V]``; row ``i`` uses ``settings[i]`` and ``states[i]``.

    ``blocked[i]`` holds ids that row ``i`` may not draw this step. Updates each mirostat
    state's ``mu``; appending the chosen tokens to the states' history is the caller's job (it
    knows which tokens it keeps). Raises ``ValueError`` when a row has no finite logit left
    (every token banned, or NaN/inf logits).

    Device syncs: one to check the logits; DRY rows, a tie across the top_k cut, and trimming a
    candidate list longer than 1024 each add one.
    """
    if logits.dim() != 2:
        raise ValueError(f"sample: logits must be [batch, vocab], got shape {tuple(logits.shape)}")
    num_rows, vocab_size = logits.shape
    if not len(settings) == len(states) == num_rows or (blocked is not None and len(blocked) != num_rows):
        raise ValueError(f"sample: need one settings, state (and blocked entry) per logits row ({num_rows})")
    if not 0 <= return_top_k <= vocab_size:
        raise ValueError(f"sample: return_top_k must be in [0, {vocab_size}], got {return_top_k}")
    device = logits.device
    logits = logits.to(torch.float32, copy=True)  # [B, V]
    _adjust_logits(logits, settings, states, blocked)
    row_max = logits.amax(dim=-1)
    if not bool(torch.isfinite(row_max).all()):
        bad = torch.nonzero(~torch.isfinite(row_max)).flatten().tolist()
        raise ValueError(f"sample: rows {bad} have no finite logit: every token is banned, or the logits hold NaN/inf")

    token_ids = torch.empty(num_rows, dtype=torch.int64, device=device)
    token_probs = torch.empty(num_rows, dtype=torch.float64, device=device)
    top_ids = torch.empty(num_rows, return_top_k, dtype=torch.int64, device=device) if return_top_k else None
    top_probs = torch.empty_like(top_ids, dtype=torch.float64) if top_ids is not None else None
    greedy = [i for i, s in enumerate(settings) if s.is_greedy]
    sampled = [i for i, s in enumerate(settings) if not s.is_greedy]
    outputs = (token_ids, token_probs, top_ids, top_probs)
    if greedy:
        _sample_greedy(logits, greedy, settings, states, outputs)
    if sampled:
        _sample_rows(logits, sampled, settings, states, outputs)
    return SampleOutput(token_ids, token_probs.float(), top_ids, top_probs.float() if top_probs is not None else None)


def _penalise(row: torch.Tensor, s: SamplerSettings, state: SamplerState) -> None:
    history = state.history_on(row.device)
    window = (s.token_repetition_range, s.token_repetition_decay)
    if state.prompt_penalties:
        rep, freq, pres = s.token_repetition_penalty, s.token_frequency_penalty, s.token_presence_penalty
        steps.apply_penalties(row, history, rep, freq, pres, *window)
        return
    # OpenAI's rule: presence and frequency count generated tokens only; repetition sees the prompt too.
    if s.token_repetition_penalty != 1.0:
        steps.apply_penalties(row, history, s.token_repetition_penalty, 0.0, 0.0, *window)
    if s.token_frequency_penalty != 0.0 or s.token_presence_penalty != 0.0:
        generated = history[state.num_prompt_tokens :]
        steps.apply_penalties(row, generated, 1.0, s.token_frequency_penalty, s.token_presence_penalty, *window)


def _adjust_logits(
    logits: torch.Tensor,
    settings: Sequence[SamplerSettings],
    states: Sequence[SamplerState],
    blocked: Sequence[Collection[int] | None] | None,
) -> None:
    """Steps 1-3 in place: penalties, bias and bans, DRY."""
    vocab_size = logits.shape[-1]
    ban_rows: list[int] = []
    ban_ids: list[int] = []
    for row, (s, state) in enumerate(zip(settings, states, strict=True)):
        if s.token_repetition_penalty != 1.0 or s.token_frequency_penalty != 0.0 or s.token_presence_penalty != 0.0:
            _penalise(logits[row], s, state)
        if isinstance(s.token_bias, torch.Tensor):
            width = min(vocab_size, s.token_bias.numel())
            logits[row, :width] += s.token_bias[:width].to(logits.device, torch.float32)
        elif s.token_bias:
            bias_ids = [t for t in s.token_bias if t < vocab_size]
            bias = torch.tensor([float(s.token_bias[t]) for t in bias_ids], dtype=torch.float32)
            logits[row].index_add_(
                0, torch.tensor(bias_ids, dtype=torch.int64, device=logits.device), bias.to(logits.device)
            )
        row_bans = [t for t in s.disallowed_tokens if t < vocab_size]
        if blocked is not None and blocked[row]:
            row_bans += [int(t) for t in blocked[row] if 0 <= t < vocab_size]
        ban_rows += [row] * len(row_bans)
        ban_ids += row_bans
    if ban_ids:
        index = (torch.tensor(ban_rows, device=logits.device), torch.tensor(ban_ids, device=logits.device))
        logits.index_put_(index, torch.tensor(-torch.inf, device=logits.device))
    for row, (s, state) in enumerate(zip(settings, states, strict=True)):
        if s.dry_multiplier > 0.0:
            history = state.history_on(logits.device)
            steps.apply_dry(
                logits[row],
                history,
                state.dry_breaker_ids,
                s.dry_multiplier,
                s.dry_base,
                s.dry_allowed_length,
                s.dry_max_ngram,
                s.dry_range,
            )


def _sample_greedy(logits, rows, settings, states, outputs) -> None:
    token_ids, token_probs, top_ids, top_probs = outputs
    index = torch.tensor(rows, device=logits.device)
    sub = logits[index]  # [G, V]
    token_ids[index] = sub.argmax(dim=-1)  # first maximum = lowest id, same tie rule as the sort
    token_probs[index] = 1.0
    if top_ids is not None:
        top_ids[index] = steps.candidate_order(sub, top_ids.shape[-1])
        one_hot = torch.zeros(len(rows), top_ids.shape[-1], dtype=torch.float64, device=logits.device)
        one_hot[:, 0] = 1.0
        top_probs[index] = one_hot
    for row in rows:  # the chosen token has p = 1: surprise 0
        if settings[row].mirostat:
            s, state = settings[row], states[row]
            mu = state.mirostat_mu if state.mirostat_mu is not None else _initial_mu(s, logits.device)
            state.mirostat_mu = mu + s.mirostat_eta * s.mirostat_tau


def _initial_mu(s: SamplerSettings, device: torch.device) -> torch.Tensor:
    return torch.tensor(2.0 * s.mirostat_tau, dtype=torch.float64, device=device)


def _sample_rows(logits, rows, settings, states, outputs) -> None:
    """Steps 4-15 for the non-greedy rows, vectorised across them."""
    token_ids, token_probs, top_ids, top_probs = outputs
    row_settings = [settings[i] for i in rows]
    row_states = [states[i] for i in rows]
    index = torch.tensor(rows, device=logits.device)
    sub = logits if len(rows) == logits.shape[0] else logits[index]  # [R, V]
    num_top = top_ids.shape[-1] if top_ids is not None else 0
    order, probs, uniforms, mirostat_rows = _final_distribution(sub, row_settings, row_states, num_top)
    column = steps.draw(probs, uniforms[:, 1:])  # [R]
    chosen_prob = probs.gather(-1, column[:, None]).squeeze(-1)
    token_ids[index] = order.gather(-1, column[:, None]).squeeze(-1)
    token_probs[index] = chosen_prob
    for j in mirostat_rows:
        s = row_settings[j]
        surprise = -torch.log2(chosen_prob[j])
        row_states[j].mirostat_mu = row_states[j].mirostat_mu - s.mirostat_eta * (surprise - s.mirostat_tau)
    if top_ids is not None:
        # Stable: zero-probability candidates keep the candidate (logit) order.
        ranked = probs.sort(dim=-1, descending=True, stable=True).indices[:, :num_top]
        top_ids[index] = order.gather(-1, ranked)
        top_probs[index] = probs.gather(-1, ranked)


def _final_distribution(sub, row_settings, row_states, num_top):
    """Steps 4-14 for sampled rows ``sub [R, V]``: candidate ids and their final probabilities.

    Returns ``(order [R, W], probs [R, W] float64, uniforms [R, 2], mirostat_rows)``; the second
    uniform of each row is its draw point. Mirostat's ``mu`` is initialised but not updated here.
    """
    device = sub.device
    vocab_size = sub.shape[-1]
    if any(s.top_k == 0 for s in row_settings):
        width = vocab_size
    else:  # only the top_k candidates can survive
        width = min(vocab_size, max(max(s.top_k for s in row_settings), num_top))
    order = steps.candidate_order(sub, width)  # [R, W]
    cand = sub.gather(-1, order).double()  # [R, W]

    # One generator call per row: the XTC coin, then the draw point.
    uniforms = torch.stack([torch.rand(2, generator=st.generator, dtype=torch.float64) for st in row_states]).to(device)

    def col(value: Callable[[SamplerSettings], float]) -> torch.Tensor:  # per-row parameter [R, 1]
        return torch.tensor([[float(value(s))] for s in row_settings], dtype=torch.float64, device=device)

    early_temp = col(lambda s: 1.0 if s.temperature_last else s.temperature)
    probs = steps.softmax_with_temperature(cand, early_temp, col(lambda s: s.smoothing_factor))
    probs = steps.top_k(probs, col(lambda s: s.top_k).long())
    if any(0.0 < s.top_p < 1.0 for s in row_settings):
        probs = steps.top_p(probs, col(lambda s: s.top_p))
    if any(s.top_a > 0.0 for s in row_settings):
        probs = steps.top_a(probs, col(lambda s: s.top_a))
    if any(s.min_p > 0.0 for s in row_settings):
        probs = steps.min_p(probs, col(lambda s: s.min_p))
    if order.shape[-1] > 1024:
        # Every step so far keeps a prefix of each row, so the tail beyond the longest live prefix
        # is all zeros: drop it once (one sync) and run the remaining steps on live candidates.
        width = max(int((probs > 0).sum(dim=-1).max()), num_top)
        probs, order = probs[:, :width], order[:, :width]
    if any(0.0 < s.tfs < 1.0 for s in row_settings):
        probs = steps.tail_free(probs, col(lambda s: s.tfs))
    if any(0.0 < s.typical < 1.0 for s in row_settings):
        probs = steps.typical(probs, col(lambda s: s.typical))
    mirostat_rows = [j for j, s in enumerate(row_settings) if s.mirostat]
    if mirostat_rows:
        for j in mirostat_rows:
            if row_states[j].mirostat_mu is None:
                row_states[j].mirostat_mu = _initial_mu(row_settings[j], device)
        mu = torch.full((len(row_settings), 1), torch.inf, dtype=torch.float64, device=device)  # inf: no limit
        for j in mirostat_rows:
            mu[j, 0] = row_states[j].mirostat_mu
        probs = steps.mirostat_truncate(probs, mu)
    if any(s.max_temp > s.min_temp or (s.temperature_last and s.temperature != 1.0) for s in row_settings):
        late_temp = col(lambda s: s.temperature if s.temperature_last else 1.0)
        dynamic = (col(lambda s: s.min_temp), col(lambda s: s.max_temp), col(lambda s: s.temp_exponent))
        probs = steps.late_temperature(probs, late_temp, *dynamic)
    if any(s.xtc_probability > 0.0 for s in row_settings):
        probs = steps.xtc(probs, col(lambda s: s.xtc_threshold), col(lambda s: s.xtc_probability), uniforms[:, :1])
    if any(s.skew != 0.0 for s in row_settings):
        probs = steps.skew(probs, col(lambda s: s.skew))

    return order, probs, uniforms, mirostat_rows


def distribution(
    logits: torch.Tensor,
    settings: SamplerSettings,
    state: SamplerState,
    blocked: Collection[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The final distribution one :func:`sample` call would draw from, for one row ``logits [V]``.

    Returns ``(token_ids [W], probs [W] float64)`` (zero-probability candidates may be included). A greedy
    row is a point mass on its argmax. Speculative decoding uses it to accept or reject drafted tokens.
    A sampled row takes its two uniforms from ``state.generator`` as :func:`sample` does (the XTC coin
    is used here), so the job's random stream advances the same way. Mirostat rows are not supported: their
    ``mu`` update depends on the token finally chosen.
    """
    if settings.mirostat and not settings.is_greedy:
        raise ValueError("distribution: mirostat rows need the chosen token to update mu; use sample()")
    row = logits.to(torch.float32, copy=True)[None]  # [1, V]
    _adjust_logits(row, [settings], [state], [blocked])
    if not bool(torch.isfinite(row.amax()).item()):
        raise ValueError("distribution: no finite logit: every token is banned, or the logits hold NaN/inf")
    if settings.is_greedy:
        ids = row.argmax(dim=-1)  # [1]
        return ids, torch.ones(1, dtype=torch.float64, device=row.device)
    order, probs, _, _ = _final_distribution(row, [settings], [state], 0)
    return order[0], probs[0] / probs[0].sum()
