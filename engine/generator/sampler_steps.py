"""The individual sampler steps, each a pure function on tensors.

Two kinds of step live here:

* Logit steps work on one row of logits ``[V]`` in place (penalties, DRY). They need the
  job's token history, so the sampler calls them once per row that uses them.
* Distribution steps work on a batch of candidate rows ``probs [R, W]`` (float64, each row
  sorted by logit, highest first, ties by lower token id; removed tokens hold 0). Per-row
  parameters arrive as ``[R, 1]`` tensors, and a row whose parameter is at its neutral value
  comes out unchanged, so rows with different settings share one vectorised call.

The order in which :func:`engine.generator.sampler.sample` applies them, and why, is written
in that module's docstring.
"""

from __future__ import annotations

import torch

__all__ = [
    "apply_dry",
    "apply_penalties",
    "draw",
    "late_temperature",
    "min_p",
    "mirostat_truncate",
    "normalize",
    "penalty_strength",
    "candidate_order",
    "skew",
    "softmax_with_temperature",
    "tail_free",
    "top_a",
    "top_k",
    "top_p",
    "typical",
    "xtc",
]


# --------------------------------------------------------------------------- logit steps


def penalty_strength(num_tokens: int, penalty_range: int, decay: int, device: torch.device) -> torch.Tensor:
    """Strength of the repetition penalties for each of the last ``num_tokens`` history positions.

    Distance ``d`` counts back from the newest token (``d = 0``). ``penalty_range = -1`` gives
    every position strength 1. Otherwise positions ``d < penalty_range`` get 1, the next
    ``decay`` positions fade linearly, ``1 - (d - penalty_range + 1) / (decay + 1)``, and older
    positions get 0. Returns ``[num_tokens]`` float32 in history order (oldest first).
    """
    distance = torch.arange(num_tokens - 1, -1, -1, device=device, dtype=torch.float32)  # [num_tokens]
    if penalty_range < 0:
        return torch.ones_like(distance)
    fade = 1.0 - (distance - penalty_range + 1.0) / (decay + 1.0)
    return torch.where(distance < penalty_range, torch.ones_like(distance), fade).clamp_(min=0.0)


def apply_penalties(
    logits: torch.Tensor,
    history: torch.Tensor,
    repetition: float,
    frequency: float,
    presence: float,
    penalty_range: int,
    decay: int,
) -> None:
    """Repetition, presence and frequency penalties, in place on one row ``logits [V]``.

    Each history position has a strength ``f`` (:func:`penalty_strength`). For a token ``t``
    let ``f_max(t)`` be the strongest of its occurrences and ``f_sum(t)`` the sum over them.
    Then, for every token seen in the window::

        r      = 1 + (repetition - 1) * f_max(t)
        l'     = l / r  if l > 0  else  l * r         (repetition: divide positive, multiply negative)
        l''    = l' - presence * f_max(t) - frequency * f_sum(t)

    Ids outside ``[0, V)`` (image tokens) are ignored.
    """
    vocab_size = logits.shape[-1]
    if penalty_range >= 0:
        history = history[max(0, history.numel() - (penalty_range + decay)) :]
    strength = penalty_strength(history.numel(), penalty_range, decay, logits.device)
    in_vocab = (history >= 0) & (history < vocab_size)
    token_ids, strength = history[in_vocab], strength[in_vocab]
    if token_ids.numel() == 0:
        return
    # Work on the distinct ids only: O(history), not O(vocab).
    seen, slot = torch.unique(token_ids, return_inverse=True)  # [U], [L]
    f_max = torch.zeros(seen.numel(), dtype=torch.float32, device=logits.device)
    f_max.scatter_reduce_(0, slot, strength, reduce="amax")
    f_sum = torch.zeros_like(f_max).index_add_(0, slot, strength)
    factor = 1.0 + (repetition - 1.0) * f_max
    current = logits[seen]
    penalised = torch.where(current > 0, current / factor, current * factor)
    logits[seen] = penalised - presence * f_max - frequency * f_sum


def apply_dry(
    logits: torch.Tensor,
    history: torch.Tensor,
    breaker_ids: torch.Tensor,
    multiplier: float,
    base: float,
    allowed_length: int,
    max_ngram: int,
    dry_range: int,
) -> None:
    """DRY ("don't repeat yourself") penalty, in place on one row ``logits [V]``.

    Following its public description: take the history window (the last ``dry_range`` tokens,
    or all when 0). For every earlier position ``i`` holding the same token as the newest one,
    the match length ``n`` is 1 plus how many further tokens going backwards from ``i`` equal
    the tokens going backwards from the end, stopping at a sequence breaker, the start of the
    window or ``max_ngram``. The token at ``i + 1`` would extend the repeat to ``n + 1``
    tokens; it is the candidate, and keeps the longest ``n`` over all ``i``. Every candidate
    with ``n >= allowed_length`` loses ``multiplier * base ** (n - allowed_length)`` from its
    logit. Nothing happens when the newest token is a breaker; breaker candidates are never
    penalised. Ids outside ``[0, V)`` count as breakers.
    """
    vocab_size = logits.shape[-1]
    if dry_range > 0:
        history = history[-dry_range:]
    num_tokens = history.numel()
    if num_tokens < 2:
        return
    is_breaker = torch.isin(history, breaker_ids) | (history < 0) | (history >= vocab_size)  # [L]
    match_pos = torch.nonzero((history[:-1] == history[-1]) & ~is_breaker[-1]).flatten()  # [M]
    next_ids = history[match_pos + 1]
    usable = ~is_breaker[match_pos + 1]
    match_pos, next_ids = match_pos[usable], next_ids[usable]
    if match_pos.numel() == 0:
        return
    # Compare the k-th token before each match with the k-th token before the end, k = 1..max_ngram-1.
    offsets = torch.arange(1, max_ngram, device=history.device)  # [K]
    offsets = offsets[offsets < num_tokens]
    before_match = match_pos[:, None] - offsets[None, :]  # [M, K]
    before_end = num_tokens - 1 - offsets  # [K]
    same = (before_match >= 0) & (history[before_match.clamp(min=0)] == history[before_end][None, :])
    same &= ~is_breaker[before_end][None, :]
    lengths = 1 + same.to(torch.int64).cumprod(dim=1).sum(dim=1)  # [M]
    seen, slot = torch.unique(next_ids, return_inverse=True)  # [U], [M]
    longest = torch.zeros(seen.numel(), dtype=torch.int64, device=logits.device)
    longest.scatter_reduce_(0, slot, lengths, reduce="amax")
    excess = (longest - allowed_length).to(torch.float32)
    penalty = multiplier * torch.pow(torch.tensor(base, dtype=torch.float32, device=logits.device), excess)
    logits[seen] -= torch.where(longest >= allowed_length, penalty, torch.zeros_like(penalty))


# ----------------------------------------------------------------- ordering and softmax


def candidate_order(logits: torch.Tensor, width: int) -> torch.Tensor:
    """Ids of the ``width`` highest logits of each row of ``logits [R, V]``, highest first, ties by
    lower id. Returns ``[R, width]`` int64.

    The order depends only on the row itself, never on ``width`` or the other rows, which keeps a
    job's draws independent of the batch it is in. ``topk`` leaves ties unordered, so the top
    ``width + 1`` are taken and re-sorted by (logit desc, id asc). When a tie straddles the cut
    (value ``width - 1`` equals value ``width``), every id at or above the cut value must be seen to
    pick the lowest tied ids: the top ``n`` are taken, ``n`` the most such ids in any row. Logits made
    in bfloat16 (8 significant bits) tie at the cut in most steps, and sorting the whole vocabulary
    every step would cost far more than this.
    """
    vocab_size = logits.shape[-1]
    if width >= vocab_size:
        return torch.sort(logits, dim=-1, descending=True, stable=True).indices
    values, ids = logits.topk(width + 1, dim=-1)  # [R, W+1]
    cut = values[:, width - 1 : width]
    if bool((cut[:, 0] == values[:, width]).any()):
        reach = int((logits >= cut).sum(dim=-1).max())  # every id at or above each row's cut value
        values, ids = logits.topk(reach, dim=-1)
    ids, by_id = ids.sort(dim=-1)
    values = values.gather(-1, by_id)
    return ids.gather(-1, torch.sort(values, dim=-1, descending=True, stable=True).indices[:, :width])


def normalize(probs: torch.Tensor) -> torch.Tensor:
    """Rescale each row to sum to 1."""
    return probs / probs.sum(dim=-1, keepdim=True)


def softmax_with_temperature(
    logits: torch.Tensor, temperature: torch.Tensor, smoothing_factor: torch.Tensor
) -> torch.Tensor:
    """Softmax of sorted candidate ``logits [R, W]`` (float64, column 0 is the row maximum ``m``).

    ``p ∝ exp((l - m) / T)``; with ``smoothing_factor s > 0`` (quadratic sampling)
    ``p ∝ exp(-s * (l - m)**2 / T)``. ``T`` is ``temperature`` (1 for rows that apply it last).
    """
    shifted = logits - logits[:, :1]
    quadratic = -smoothing_factor * shifted * shifted
    shifted = torch.where(smoothing_factor > 0, quadratic, shifted)
    return normalize(torch.exp(shifted / temperature))


# ------------------------------------------------------------------- truncation steps


def _exclusive_cumsum(values: torch.Tensor) -> torch.Tensor:
    # The running sum of everything before each column, summed left to right like a plain loop.
    cumsum = values.cumsum(dim=-1)
    return torch.cat([torch.zeros_like(cumsum[:, :1]), cumsum[:, :-1]], dim=-1)


def top_k(probs: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Keep the first ``k`` candidates of each row (``k = 0``: keep all)."""
    column = torch.arange(probs.shape[-1], device=probs.device)
    keep = (k == 0) | (column[None, :] < k)
    return normalize(torch.where(keep, probs, 0.0))


def top_p(probs: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Nucleus: keep candidate ``i`` while the mass of the candidates before it is ``< p``.

    This keeps the shortest prefix whose mass reaches ``p`` (always at least one token).
    Rows with ``p`` outside ``(0, 1)`` are unchanged.
    """
    active = (p > 0) & (p < 1)
    keep = ~active | (_exclusive_cumsum(probs) < p)
    return normalize(torch.where(keep, probs, 0.0))


def top_a(probs: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Keep tokens with ``p >= a * max_p**2`` (``a = 0``: keep all)."""
    max_p = probs.amax(dim=-1, keepdim=True)
    return normalize(torch.where(probs >= a * max_p * max_p, probs, 0.0))


def min_p(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Keep tokens with ``p >= min_p * max_p`` (``min_p = 0``: keep all)."""
    max_p = probs.amax(dim=-1, keepdim=True)
    return normalize(torch.where(probs >= min_p * max_p, probs, 0.0))


def tail_free(probs: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Tail-free sampling on the second derivative of the sorted probabilities.

    With the ``n`` live candidates ``p_0 >= p_1 >= ...`` (a prefix of the row: every step
    before this one keeps a prefix), ``d_i = |p_i - 2 p_{i+1} + p_{i+2}|`` for
    ``i = 0..n-3`` and ``c_i`` its normalised running sum. Token 0 is kept; token ``j >= 1``
    is kept when ``j - 1 <= n - 3`` and ``c_{j-1} <= z`` (so the last live token always goes).
    Rows with ``z`` outside ``(0, 1)``, fewer than 3 live tokens, or no curvature at all
    (``sum d = 0``) are unchanged.
    """
    num_rows, width = probs.shape
    if width < 3:
        return probs
    num_live = (probs > 0).sum(dim=-1, keepdim=True)  # [R, 1]
    second = (probs[:, :-2] - 2.0 * probs[:, 1:-1] + probs[:, 2:]).abs()  # [R, W-2]
    valid = torch.arange(width - 2, device=probs.device)[None, :] < num_live - 2
    second = torch.where(valid, second, 0.0)
    total = second.sum(dim=-1, keepdim=True)
    cdf = second.cumsum(dim=-1) / torch.where(total > 0, total, 1.0)
    keep_inner = valid & (cdf <= z)
    true_col = torch.ones(num_rows, 1, dtype=torch.bool, device=probs.device)
    keep = torch.cat([true_col, keep_inner, ~true_col], dim=-1)
    active = (z > 0) & (z < 1) & (num_live >= 3) & (total > 0)
    return normalize(torch.where(~active | keep, probs, 0.0))


def typical(probs: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Locally typical sampling.

    ``H = -sum p log p`` over live tokens; tokens are ranked by ``|-log p - H|`` (ties keep the
    candidate order) and kept while the mass of the tokens ranked before them is ``< mass``.
    Rows with ``mass`` outside ``(0, 1)`` are unchanged.
    """
    live = probs > 0
    log_p = torch.where(live, probs.clamp(min=torch.finfo(probs.dtype).tiny).log(), 0.0)
    entropy = -(probs * log_p).sum(dim=-1, keepdim=True)
    deviation = torch.where(live, (-log_p - entropy).abs(), torch.inf)
    rank_order = torch.sort(deviation, dim=-1, stable=True).indices
    ranked = probs.gather(-1, rank_order)
    keep_ranked = _exclusive_cumsum(ranked) < mass
    keep = torch.empty_like(keep_ranked).scatter_(-1, rank_order, keep_ranked)
    active = (mass > 0) & (mass < 1)
    return normalize(torch.where(~active | keep, probs, 0.0))


def mirostat_truncate(probs: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """Mirostat (v2) truncation: keep tokens with surprise ``-log2 p <= mu``, i.e. ``p >= 2**-mu``.

    The most probable token always stays. Rows with ``mu = inf`` are unchanged. The update
    ``mu <- mu - eta * (-log2 p_chosen - tau)`` happens after the draw, in the sampler.
    """
    max_p = probs.amax(dim=-1, keepdim=True)
    keep = (probs >= torch.exp2(-mu)) | (probs == max_p)
    return normalize(torch.where(keep, probs, 0.0))


# --------------------------------------------------------------- reshaping steps


def late_temperature(
    probs: torch.Tensor,
    temperature: torch.Tensor,
    min_temp: torch.Tensor,
    max_temp: torch.Tensor,
    exponent: torch.Tensor,
) -> torch.Tensor:
    """Temperature on the truncated distribution: ``p <- p**(1/T)``, renormalised.

    Where ``max_temp > min_temp`` (dynamic temperature) ``T`` replaces ``temperature``:
    ``T = min_temp + (max_temp - min_temp) * (H / ln n)**exponent`` with ``H`` the entropy
    (nats) of the ``n`` live tokens (``H / ln n = 0`` when ``n = 1``). Rows with ``T = 1``
    and no dynamic range are unchanged. Computed in the log domain so tiny ``T`` cannot
    underflow every token.
    """
    live = probs > 0
    log_p = torch.where(live, probs.clamp(min=torch.finfo(probs.dtype).tiny).log(), -torch.inf)
    num_live = live.sum(dim=-1, keepdim=True)
    entropy = -torch.where(live, probs * log_p, 0.0).sum(dim=-1, keepdim=True)
    max_entropy = torch.log(num_live.to(probs.dtype))
    normalized = torch.where(num_live > 1, entropy / torch.where(num_live > 1, max_entropy, 1.0), 0.0)
    normalized = normalized.clamp(0.0, 1.0)
    dynamic = max_temp > min_temp
    dynamic_temp = min_temp + (max_temp - min_temp) * normalized.pow(exponent)
    temp = torch.where(dynamic, dynamic_temp, temperature).clamp(min=1e-12)
    log_max = log_p.amax(dim=-1, keepdim=True)
    reshaped = normalize(torch.exp((log_p - log_max) / temp))
    active = dynamic | (temperature != 1.0)
    return torch.where(active, reshaped, probs)


def xtc(probs: torch.Tensor, threshold: torch.Tensor, probability: torch.Tensor, coin: torch.Tensor) -> torch.Tensor:
    """Exclude Top Choices: when the row's ``coin < probability`` and at least two live tokens
    have ``p >= threshold``, remove all of them except the least probable (the last of them in
    candidate order). Rows with ``probability = 0`` are unchanged.
    """
    column = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    above = (probs >= threshold) & (probs > 0)
    count = above.sum(dim=-1, keepdim=True)
    last_above = torch.where(above, column, -1).amax(dim=-1, keepdim=True)
    remove = above & (column != last_above) & (count >= 2) & (coin < probability)
    return normalize(torch.where(remove, 0.0, probs))


def skew(probs: torch.Tensor, amount: torch.Tensor) -> torch.Tensor:
    """Skew as exllamav2 defines it: the draw point ``u`` becomes ``u ** exp(-skew)`` on the
    candidates in order. Written as a distribution: with ``C_k`` the running sum of ``p`` in
    candidate order, the new probabilities are ``C_k**e - C_{k-1}**e`` with ``e = exp(skew)``,
    so positive skew moves mass towards less likely tokens. Rows with ``skew = 0`` are unchanged.
    """
    cdf = probs.cumsum(dim=-1).clamp(0.0, 1.0)
    skewed_cdf = cdf.pow(torch.exp(amount))
    skewed = torch.diff(skewed_cdf, dim=-1, prepend=torch.zeros_like(skewed_cdf[:, :1]))
    return torch.where(amount != 0, normalize(skewed.clamp(min=0.0)), probs)


def draw(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: the first column whose running sum exceeds ``uniform * total``.

    ``uniform [R, 1]`` in ``[0, 1)``. The chosen column always has ``p > 0``: with ``u < 1`` the
    product ``u * total`` rounds below ``total`` (the last running sum), and the first running sum
    above it must have grown at that column. Returns ``[R]`` column indices.
    """
    cdf = probs.cumsum(dim=-1).contiguous()
    return torch.searchsorted(cdf, (uniform * cdf[:, -1:]).contiguous(), right=True).squeeze(-1)
