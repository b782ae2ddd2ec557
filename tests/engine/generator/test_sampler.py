"""Sampler tests: every step against a plain-Python reference, plus transformers where it has the step.

The reference below is written from the step definitions in engine/generator/sampler.py, loop by
loop, in float64. Candidate order everywhere: higher logit first, ties by lower token id.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.generator import sampler_steps as steps
from engine.generator.sampler import SamplerSettings, SamplerState, sample, tokenize_breakers

NEG_INF = float("-inf")


# ----------------------------------------------------------------------- reference code


def neutral(**overrides) -> SamplerSettings:
    """Settings with every step off, then ``overrides``."""
    values = dict(temperature=1.0, top_k=0, top_p=0.0, token_repetition_penalty=1.0)
    values.update(overrides)
    return SamplerSettings(**values)


def ref_penalties(logits: list[float], history: list[int], s: SamplerSettings) -> list[float]:
    out = list(logits)
    vocab_size, n = len(logits), len(history)
    f_max: dict[int, float] = {}
    f_sum: dict[int, float] = {}
    for pos, token in enumerate(history):
        d = n - 1 - pos
        rng, decay = s.token_repetition_range, s.token_repetition_decay
        if rng < 0 or d < rng:
            f = 1.0
        elif d < rng + decay:
            f = 1.0 - (d - rng + 1) / (decay + 1)
        else:
            f = 0.0
        if f <= 0 or not 0 <= token < vocab_size:
            continue
        f_max[token] = max(f_max.get(token, 0.0), f)
        f_sum[token] = f_sum.get(token, 0.0) + f
    for token, fm in f_max.items():
        r = 1.0 + (s.token_repetition_penalty - 1.0) * fm
        x = out[token]
        x = x / r if x > 0 else x * r
        out[token] = x - s.token_presence_penalty * fm - s.token_frequency_penalty * f_sum[token]
    return out


def ref_dry(logits: list[float], history: list[int], s: SamplerSettings, breakers: set[int]) -> list[float]:
    out = list(logits)
    h = history[-s.dry_range :] if s.dry_range > 0 else list(history)
    vocab_size = len(logits)

    def is_breaker(t: int) -> bool:
        return t in breakers or not 0 <= t < vocab_size

    if len(h) < 2 or is_breaker(h[-1]):
        return out
    longest: dict[int, int] = {}
    for i in range(len(h) - 1):
        if h[i] != h[-1] or is_breaker(h[i + 1]):
            continue
        n = 1
        while n < s.dry_max_ngram:
            j, k = i - n, len(h) - 1 - n
            if j < 0 or h[j] != h[k] or is_breaker(h[k]):
                break
            n += 1
        longest[h[i + 1]] = max(longest.get(h[i + 1], 0), n)
    for token, n in longest.items():
        if n >= s.dry_allowed_length:
            out[token] -= s.dry_multiplier * s.dry_base ** (n - s.dry_allowed_length)
    return out


def _norm(p: list[float]) -> list[float]:
    total = sum(p)
    return [x / total for x in p]


def ref_distribution(
    logits: list[float], s: SamplerSettings, mu: float | None = None, coin: float = 0.0
) -> tuple[list[int], list[float]]:
    """Steps 4-14 on already-adjusted logits: (candidate order, final probabilities in that order)."""
    order = sorted(range(len(logits)), key=lambda i: (-logits[i], i))
    lg = [logits[i] for i in order]
    top = lg[0]
    temp = 1.0 if s.temperature_last else s.temperature
    weights = []
    for x in lg:
        if x == NEG_INF:
            weights.append(0.0)
        elif s.smoothing_factor > 0:
            weights.append(math.exp(-s.smoothing_factor * (x - top) ** 2 / temp))
        else:
            weights.append(math.exp((x - top) / temp))
    p = _norm(weights)
    if s.top_k > 0:
        p = _norm([x if i < s.top_k else 0.0 for i, x in enumerate(p)])
    if 0 < s.top_p < 1:
        kept, mass = [], 0.0
        for x in p:
            kept.append(x if mass < s.top_p else 0.0)
            mass += x
        p = _norm(kept)
    if s.top_a > 0:
        pmax = max(p)
        p = _norm([x if x >= s.top_a * pmax * pmax else 0.0 for x in p])
    if s.min_p > 0:
        pmax = max(p)
        p = _norm([x if x >= s.min_p * pmax else 0.0 for x in p])
    if 0 < s.tfs < 1:
        n = sum(1 for x in p if x > 0)
        if n >= 3:
            d = [abs(p[i] - 2 * p[i + 1] + p[i + 2]) for i in range(n - 2)]
            total = sum(d)
            if total > 0:
                cdf = list(np.cumsum(d) / total)
                keep = [True] + [cdf[j - 1] <= s.tfs for j in range(1, n - 1)] + [False]
                p = _norm([x if j < n and keep[j] else 0.0 for j, x in enumerate(p)])
    if 0 < s.typical < 1:
        live = [i for i, x in enumerate(p) if x > 0]
        entropy = -sum(p[i] * math.log(p[i]) for i in live)
        ranked = sorted(live, key=lambda i: (abs(-math.log(p[i]) - entropy), i))
        keep, mass = set(), 0.0
        for i in ranked:
            if mass < s.typical:
                keep.add(i)
            mass += p[i]
        p = _norm([x if i in keep else 0.0 for i, x in enumerate(p)])
    if s.mirostat:
        mu = 2 * s.mirostat_tau if mu is None else mu
        pmax = max(p)
        p = _norm([x if x >= 2.0**-mu or x == pmax else 0.0 for x in p])
    late = s.max_temp > s.min_temp or (s.temperature_last and s.temperature != 1.0)
    if late:
        live = [i for i, x in enumerate(p) if x > 0]
        t = s.temperature if s.temperature_last else 1.0
        if s.max_temp > s.min_temp:
            entropy = -sum(p[i] * math.log(p[i]) for i in live)
            normalized = entropy / math.log(len(live)) if len(live) > 1 else 0.0
            t = s.min_temp + (s.max_temp - s.min_temp) * normalized**s.temp_exponent
        pmax = max(p)
        p = _norm([math.exp((math.log(x) - math.log(pmax)) / t) if x > 0 else 0.0 for x in p])
    if s.xtc_probability > 0 and coin < s.xtc_probability:
        above = [i for i, x in enumerate(p) if x > 0 and x >= s.xtc_threshold]
        if len(above) >= 2:
            p = _norm([0.0 if i in above[:-1] else x for i, x in enumerate(p)])
    if s.skew != 0:
        e = math.exp(s.skew)
        cdf = [min(c, 1.0) for c in np.cumsum(p)]
        p = _norm([cdf[0] ** e] + [cdf[i] ** e - cdf[i - 1] ** e for i in range(1, len(p))])
    return order, p


def ref_draw(p: list[float], u: float) -> int:
    """Inverse CDF: first position whose running sum exceeds u * total."""
    total, acc = sum(p), 0.0
    for i, x in enumerate(p):
        acc += x
        if acc > u * total:
            return i
    return max(i for i, x in enumerate(p) if x > 0)


def job_uniforms(seed: int, num_steps: int = 1) -> list[tuple[float, float]]:
    """The (XTC coin, draw point) pairs a job seeded with ``seed`` uses, per the documented stream."""
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.rand(2, generator=g, dtype=torch.float64).tolist()) for _ in range(num_steps)]


def make_logits(vocab_size: int, seed: int) -> torch.Tensor:
    """Random logits with a three-way tie at the top, a tie in the middle and -inf entries."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab_size, generator=g) * 2.0
    top = int(logits.argmax())
    others = [i for i in range(vocab_size) if i != top]
    logits[others[0]] = logits[top]
    logits[others[1]] = logits[top]
    logits[others[-1]] = logits[others[-2]]
    logits[others[2]] = NEG_INF
    if vocab_size > 20:
        logits[others[3:8]] = NEG_INF
    return logits


def final_distribution(logits: torch.Tensor, s: SamplerSettings, state: SamplerState):
    vocab_size = logits.shape[-1]
    out = sample(logits[None], [s], [state], return_top_k=vocab_size)
    probs = dict(zip(out.top_ids[0].tolist(), out.top_probs[0].double().tolist(), strict=True))
    return out, [probs[i] for i in range(vocab_size)]


STEP_CASES = {
    "temperature_low": dict(temperature=0.5),
    "temperature_high": dict(temperature=1.7),
    "smoothing": dict(temperature=1.2, smoothing_factor=0.3),
    "top_k_3": dict(top_k=3),
    "top_k_10": dict(top_k=10),
    "top_p_05": dict(top_p=0.5),
    "top_p_09": dict(top_p=0.9),
    "top_a_02": dict(top_a=0.2),
    "top_a_08": dict(top_a=0.8),
    "min_p_005": dict(min_p=0.05),
    "min_p_03": dict(min_p=0.3),
    "min_p_09": dict(min_p=0.9),
    "tfs_05": dict(tfs=0.5),
    "tfs_095": dict(tfs=0.95),
    "typical_03": dict(typical=0.3),
    "typical_08": dict(typical=0.8),
    "mirostat_15": dict(mirostat=True, mirostat_tau=1.5),
    "mirostat_3": dict(mirostat=True, mirostat_tau=3.0),
    "dynamic_temp": dict(min_temp=0.5, max_temp=2.0),
    "dynamic_temp_exp2_last": dict(min_temp=0.3, max_temp=1.5, temp_exponent=2.0, temperature_last=True),
    "temperature_last_min_p": dict(temperature=1.8, temperature_last=True, min_p=0.2),
    "xtc": dict(xtc_probability=1.0, xtc_threshold=0.05),
    "xtc_half": dict(xtc_probability=0.5, xtc_threshold=0.02),
    "skew_pos": dict(skew=0.7),
    "skew_neg": dict(skew=-0.5),
    "everything": dict(
        temperature=0.9, top_k=20, top_p=0.95, top_a=0.05, min_p=0.02, tfs=0.97, typical=0.95,
        mirostat=True, mirostat_tau=4.0, min_temp=0.7, max_temp=1.3, xtc_probability=0.5,
        xtc_threshold=0.05, skew=0.3, smoothing_factor=0.1,
    ),
}  # fmt: skip


@pytest.mark.parametrize("vocab_size", [5, 37, 300])
@pytest.mark.parametrize("case", list(STEP_CASES))
def test_each_step_matches_reference(case: str, vocab_size: int) -> None:
    s = neutral(**STEP_CASES[case])
    for seed in range(3):
        logits = make_logits(vocab_size, seed)
        state = SamplerState(s, seed=seed)
        out, probs = final_distribution(logits, s, state)
        coin, u = job_uniforms(seed)[0]
        order, ref = ref_distribution(logits.double().tolist(), s, coin=coin)
        expected = [0.0] * vocab_size
        for pos, token in enumerate(order):
            expected[token] = ref[pos]
        np.testing.assert_allclose(probs, expected, atol=1e-6, err_msg=f"{case} V={vocab_size} seed={seed}")
        assert int(out.token_ids[0]) == order[ref_draw(ref, u)]
        assert float(out.token_probs[0]) == pytest.approx(ref[ref_draw(ref, u)], abs=1e-6)
        assert all(probs[t] == 0.0 for t in range(vocab_size) if logits[t] == NEG_INF)


@pytest.mark.parametrize("case", ["top_p_09", "min_p_005", "min_p_09", "typical_08", "tfs_095", "skew_pos", "xtc_half"])
def test_large_vocab_full_sort_path_matches_reference(case: str) -> None:
    """top_k = 0 over 3000 tokens: the sampler sorts everything, then trims the dead tail."""
    s = neutral(**STEP_CASES[case])
    logits = make_logits(3000, 1)
    for seed in range(3):
        out = sample(logits[None], [s], [SamplerState(s, seed=seed)], return_top_k=5)
        coin, u = job_uniforms(seed)[0]
        order, ref = ref_distribution(logits.double().tolist(), s, coin=coin)
        position = ref_draw(ref, u)
        assert int(out.token_ids[0]) == order[position]
        assert float(out.token_probs[0]) == pytest.approx(ref[position], abs=1e-6)
        ranked = sorted(range(3000), key=lambda i: (-ref[i], i))[:5]
        assert out.top_ids[0].tolist() == [order[i] for i in ranked]
        np.testing.assert_allclose(out.top_probs[0].tolist(), [ref[i] for i in ranked], atol=1e-6)


def test_ties_follow_the_lowest_id_rule_at_exact_boundaries() -> None:
    """Four equal logits give p = 0.25 exactly: top_p 0.5 keeps the first two (lowest ids) only."""
    s = neutral(top_p=0.5)
    _, probs = final_distribution(torch.zeros(4), s, SamplerState(s, seed=0))
    assert probs == [0.5, 0.5, 0.0, 0.0]
    s = neutral(top_k=3)
    _, probs = final_distribution(torch.tensor([1.0, 2.0, 1.0, 1.0, 1.0]), s, SamplerState(s, seed=0))
    assert [p > 0 for p in probs] == [True, True, True, False, False]


def test_tail_free_drops_the_last_token_when_all_are_live() -> None:
    s = neutral(tfs=0.99)
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0, -2.0])
    _, probs = final_distribution(logits, s, SamplerState(s, seed=0))
    order, ref = ref_distribution(logits.double().tolist(), s)
    np.testing.assert_allclose([probs[t] for t in order], ref, atol=1e-6)
    assert probs[5] == 0.0 and probs[3] > 0.0


def test_draw_never_picks_a_zero_probability_column() -> None:
    probs = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25, 0.75, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    low = torch.zeros(3, 1, dtype=torch.float64)
    high = torch.full((3, 1), 1.0 - 2.0**-53, dtype=torch.float64)
    assert steps.draw(probs, low).tolist() == [1, 0, 2]
    assert steps.draw(probs, high).tolist() == [2, 1, 2]
    assert steps.draw(probs, torch.full((3, 1), 0.5, dtype=torch.float64)).tolist() == [2, 1, 2]


@pytest.mark.parametrize("width", [1, 2, 3, 5, 8, 19])
def test_candidate_order_is_logit_then_lowest_id(width: int) -> None:
    g = torch.Generator().manual_seed(width)
    logits = torch.randint(-3, 3, (6, 20), generator=g).float()  # many ties, some across the cut
    logits[0, :] = 1.0
    order = steps.candidate_order(logits, width)
    for row in range(6):
        expected = sorted(range(20), key=lambda i, row=row: (-float(logits[row, i]), i))[:width]
        assert order[row].tolist() == expected


@pytest.mark.parametrize("width", [1, 50, 64])
def test_candidate_order_of_bfloat16_logits_is_the_stable_sort(width: int) -> None:
    # logits rounded to bfloat16 (as the model's head gives them) tie at the cut in most rows; the rows differ
    # in how many ids tie there, and each row's order is its own whatever rows come with it
    g = torch.Generator().manual_seed(width)
    logits = (torch.randn(5, 49152, generator=g) * 3).to(torch.bfloat16).float()
    logits[1, 100:400] = logits[1].max()  # 300 ids tied at the top
    logits[3, :] = 0.0  # one tie across the whole row
    order = steps.candidate_order(logits, width)
    assert torch.equal(order, torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :width])
    for row in range(5):
        assert torch.equal(steps.candidate_order(logits[row : row + 1], width)[0], order[row])


def test_fast_top_k_path_with_ties_draws_like_reference() -> None:
    s = neutral(top_k=3, temperature=0.7)
    for vocab_size in (5, 37, 300):
        logits = make_logits(vocab_size, 0)  # three-way tie at the top
        order, ref = ref_distribution(logits.double().tolist(), s)
        for seed in range(10):
            out = sample(logits[None], [s], [SamplerState(s, seed=seed)])
            assert int(out.token_ids[0]) == order[ref_draw(ref, job_uniforms(seed)[0][1])]


def test_fast_top_k_path_draws_like_reference() -> None:
    """Without return_top_k the sampler only sorts top_k candidates; draws and probs must not change."""
    s = neutral(top_k=7, top_p=0.9, temperature=0.8)
    logits = make_logits(300, 5)
    order, ref = ref_distribution(logits.double().tolist(), s)
    for seed in range(40):
        out = sample(logits[None], [s], [SamplerState(s, seed=seed)])
        position = ref_draw(ref, job_uniforms(seed)[0][1])
        assert int(out.token_ids[0]) == order[position]
        assert float(out.token_probs[0]) == pytest.approx(ref[position], abs=1e-6)


def test_skew_equals_exllamav2_draw_point() -> None:
    """exllamav2 draws at u ** exp(-skew) on the unskewed distribution; ours must pick the same token."""
    skewed, plain = neutral(top_p=0.95, skew=0.8), neutral(top_p=0.95)
    logits = make_logits(37, 1)
    order, ref = ref_distribution(logits.double().tolist(), plain)
    for seed in range(60):
        out = sample(logits[None], [skewed], [SamplerState(skewed, seed=seed)])
        u = job_uniforms(seed)[0][1]
        assert int(out.token_ids[0]) == order[ref_draw(ref, u ** math.exp(-0.8))]


def test_mirostat_mu_is_used_and_updated() -> None:
    s = neutral(mirostat=True, mirostat_tau=2.0, mirostat_eta=0.3)
    state = SamplerState(s, seed=3)
    logits = make_logits(37, 2)
    mu = 2 * s.mirostat_tau
    for step, (coin, u) in enumerate(job_uniforms(3, 4)):
        order, ref = ref_distribution(logits.double().tolist(), s, mu=mu, coin=coin)
        out = sample(logits[None], [s], [state])
        position = ref_draw(ref, u)
        assert int(out.token_ids[0]) == order[position], f"step {step}"
        mu -= s.mirostat_eta * (-math.log2(ref[position]) - s.mirostat_tau)
        assert float(state.mirostat_mu) == pytest.approx(mu, abs=1e-9)
    # A greedy row picks with p = 1 (surprise 0), so mu grows by eta * tau per step.
    greedy = SamplerSettings.greedy(mirostat=True, mirostat_tau=2.0, mirostat_eta=0.3)
    state = SamplerState(greedy, seed=0)
    for _ in range(2):
        sample(logits[None], [greedy], [state])
    assert float(state.mirostat_mu) == pytest.approx(4.0 + 2 * 0.3 * 2.0)


# ---------------------------------------------------------------- penalties, bias, DRY


@pytest.mark.parametrize(
    "params",
    [
        dict(token_repetition_penalty=1.3),
        dict(token_repetition_penalty=0.8, token_frequency_penalty=0.2),
        dict(token_repetition_penalty=1.5, token_presence_penalty=0.4, token_repetition_range=4),
        dict(token_repetition_penalty=1.2, token_frequency_penalty=0.3, token_repetition_range=4, token_repetition_decay=3),
        dict(token_presence_penalty=-0.5, token_repetition_range=0, token_repetition_decay=5),
        dict(token_repetition_penalty=1.4, token_repetition_range=0),
    ],
)  # fmt: skip
def test_penalties_match_reference(params: dict) -> None:
    s = neutral(**params)
    vocab_size = 37
    logits = make_logits(vocab_size, 4)
    pos = [i for i in range(vocab_size) if 0 < logits[i] < float("inf")]
    neg = [i for i in range(vocab_size) if NEG_INF < logits[i] < 0]
    # Repeats of positive and negative logits; 40 and 100 lie outside the vocabulary.
    history = [pos[0], neg[0], neg[0], 40, pos[1], pos[0], neg[1], pos[2], neg[0], 100, pos[0], neg[2]]
    adjusted = ref_penalties(logits.double().tolist(), history, s)
    order, ref = ref_distribution(adjusted, s)
    _, probs = final_distribution(logits, s, SamplerState(s, history, seed=0))
    expected = [0.0] * vocab_size
    for pos, token in enumerate(order):
        expected[token] = ref[pos]
    np.testing.assert_allclose(probs, expected, atol=1e-6)


@pytest.mark.parametrize(
    "params",
    [
        dict(token_presence_penalty=0.7, token_frequency_penalty=0.3),
        dict(token_repetition_penalty=1.3, token_frequency_penalty=0.5),
        dict(token_repetition_penalty=1.2, token_presence_penalty=0.4, token_repetition_range=3),
    ],
)  # fmt: skip
def test_openai_penalties_count_only_generated_tokens(params: dict) -> None:
    # DynamicJob(prompt_penalties=False), the server's rule: presence and frequency over what the job wrote,
    # repetition over the prompt too. The reference applies the two parts one after the other.
    s = neutral(**params)
    vocab_size = 37
    logits = make_logits(vocab_size, 5)
    pos = [i for i in range(vocab_size) if 0 < logits[i] < float("inf")]
    prompt, generated = [pos[0], pos[0], pos[1], pos[2]], [pos[1], pos[3], pos[1]]
    state = SamplerState(s, prompt, seed=0, prompt_penalties=False)
    state.append(generated)
    repetition_only = neutral(**{**params, "token_presence_penalty": 0.0, "token_frequency_penalty": 0.0})
    adjusted = ref_penalties(logits.double().tolist(), prompt + generated, repetition_only)
    adjusted = ref_penalties(adjusted, generated, neutral(**{**params, "token_repetition_penalty": 1.0}))
    order, ref = ref_distribution(adjusted, s)
    expected = [0.0] * vocab_size
    for rank, token in enumerate(order):
        expected[token] = ref[rank]
    np.testing.assert_allclose(final_distribution(logits, s, state)[1], expected, atol=1e-6)
    # The prompt's tokens alone take no presence or frequency penalty.
    fresh = SamplerState(s, prompt, seed=0, prompt_penalties=False)
    alone = ref_penalties(logits.double().tolist(), prompt, repetition_only)
    order, ref = ref_distribution(alone, s)
    expected = [0.0] * vocab_size
    for rank, token in enumerate(order):
        expected[token] = ref[rank]
    np.testing.assert_allclose(final_distribution(logits, s, fresh)[1], expected, atol=1e-6)


def test_penalties_and_warpers_match_transformers() -> None:
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
        TypicalLogitsWarper,
    )

    g = torch.Generator().manual_seed(11)
    logits = torch.randn(2, 64, generator=g) * 3  # no ties: transformers' top_k keeps tied tokens
    history = torch.randint(0, 64, (2, 12), generator=g)
    configs = [
        dict(token_repetition_penalty=1.3, temperature=0.7, top_k=20, top_p=0.9, min_p=0.05),
        dict(token_repetition_penalty=1.1, temperature=1.3, top_k=40, typical=0.8),
    ]
    for row, params in enumerate(configs):
        s = neutral(**params)
        hf = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(s.token_repetition_penalty)])
        hf.append(TemperatureLogitsWarper(s.temperature))
        hf.append(TopKLogitsWarper(s.top_k))
        if s.top_p:
            hf.append(TopPLogitsWarper(s.top_p))
        if s.min_p:
            hf.append(MinPLogitsWarper(s.min_p))
        if s.typical:
            hf.append(TypicalLogitsWarper(s.typical))
        expected = hf(history[row : row + 1], logits[row : row + 1].clone()).softmax(-1)[0]
        _, probs = final_distribution(logits[row], s, SamplerState(s, history[row], seed=0))
        np.testing.assert_allclose(probs, expected.double().numpy(), atol=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_dry_matches_reference(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    vocab_size = 12
    history = torch.randint(0, 6, (60,), generator=g).tolist()
    history[-4:] = history[10:14]  # make sure a long repeat exists
    breakers = {0}
    params = [
        dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2),
        dict(dry_multiplier=1.5, dry_base=2.0, dry_allowed_length=1, dry_range=30, dry_max_ngram=3),
    ][seed % 2]
    s = neutral(**params)
    logits = torch.randn(vocab_size, generator=g)
    adjusted = ref_dry(logits.double().tolist(), history, s, breakers)
    order, ref = ref_distribution(adjusted, s)
    _, probs = final_distribution(logits, s, SamplerState(s, history, seed=0, dry_breaker_ids=breakers))
    expected = [0.0] * vocab_size
    for pos, token in enumerate(order):
        expected[token] = ref[pos]
    np.testing.assert_allclose(probs, expected, atol=1e-6)


def test_dry_penalises_the_continuation_of_a_repeat() -> None:
    s = neutral(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2)
    history = [7, 1, 2, 3, 4, 5, 8, 9, 1, 2, 3, 4]  # "1 2 3 4" repeats; 5 would continue it
    logits = torch.zeros(12)
    _, probs = final_distribution(logits, s, SamplerState(s, history, seed=0, dry_breaker_ids=[]))
    penalty = 0.8 * 1.75 ** (4 - 2)
    assert probs[5] / probs[6] == pytest.approx(math.exp(-penalty), rel=1e-5)
    assert probs[6] == pytest.approx(probs[0], rel=1e-6)  # nothing else touched
    # dry_max_ngram caps the match length used in the exponent.
    capped = neutral(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_max_ngram=3)
    _, probs = final_distribution(logits, capped, SamplerState(capped, history, seed=0, dry_breaker_ids=[]))
    assert probs[5] / probs[6] == pytest.approx(math.exp(-0.8 * 1.75 ** (3 - 2)), rel=1e-5)
    # A sequence breaker inside the repeat cuts the match to "4" alone (length 1 < 2): no penalty.
    _, probs = final_distribution(logits, s, SamplerState(s, history, seed=0, dry_breaker_ids=[3]))
    assert probs[5] == pytest.approx(probs[6], rel=1e-6)
    # The newest token is a breaker: no penalty at all.
    _, probs = final_distribution(logits, s, SamplerState(s, history, seed=0, dry_breaker_ids=[4]))
    assert probs[5] == pytest.approx(probs[6], rel=1e-6)
    # The repeat is outside a short dry_range: no penalty either.
    short = neutral(dry_multiplier=0.8, dry_range=5)
    _, probs = final_distribution(logits, short, SamplerState(short, history, seed=0, dry_breaker_ids=[]))
    assert probs[5] == pytest.approx(probs[6], rel=1e-6)


def test_dry_breakers_come_from_the_tokenizer() -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    vocab = {ch: i for i, ch in enumerate(["<unk>", "a", "b", "\n", ":", '"', "*", "x"])}
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    assert tokenize_breakers(["\n", ":", '"', "*"], tokenizer) == [3, 4, 5, 6]
    state = SamplerState(neutral(dry_multiplier=1.0), seed=0, tokenizer=tokenizer)
    assert state.dry_breaker_ids.tolist() == [3, 4, 5, 6]
    assert tokenize_breakers(["b"], lambda text: [vocab[c] for c in text]) == [2]
    with pytest.raises(ValueError, match="tokenizer"):
        SamplerState(neutral(dry_multiplier=1.0), seed=0)


def test_token_bias_and_disallowed_tokens() -> None:
    logits = torch.tensor([[5.0, 1.0, 0.0, 0.0, 0.0]])
    s = SamplerSettings.greedy(token_bias={3: 10.0})
    assert sample(logits, [s], [SamplerState(s, seed=0)]).token_ids.tolist() == [3]
    s = SamplerSettings.greedy(token_bias=torch.tensor([0.0, 0.0, 6.0, 0.0, 0.0, 0.0, 0.0, 0.0]))  # padded
    assert sample(logits, [s], [SamplerState(s, seed=0)]).token_ids.tolist() == [2]
    s = SamplerSettings.greedy()
    s.disallow_tokens(5, [0, 1])
    assert s.disallowed_tokens == frozenset({0, 1})
    assert sample(logits, [s], [SamplerState(s, seed=0)]).token_ids.tolist() == [2]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        s.disallow_tokens(5, [5])
    s.disallow_tokens(5, [2, 3, 4])
    with pytest.raises(ValueError, match="no finite logit"):
        sample(logits, [s], [SamplerState(s, seed=0)])


# ---------------------------------------------------------------------- greedy, order


def test_greedy_is_argmax_with_lowest_id_on_ties() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 1000, generator=g)
    logits[1, [10, 500]] = 50.0  # tie: the lower id wins
    rows = [SamplerSettings.greedy(), SamplerSettings.greedy(), neutral(temperature=0.0), neutral(top_k=1)]
    out = sample(logits, rows, [SamplerState(s, seed=0) for s in rows], return_top_k=3)
    expected = logits.argmax(-1)
    assert out.token_ids.tolist() == expected.tolist()
    assert out.token_ids[1] == 10
    assert out.token_probs.tolist() == [1.0] * 4
    for row in range(4):
        by_logit = sorted(range(1000), key=lambda i, row=row: (-float(logits[row, i]), i))
        assert out.top_ids[row].tolist() == by_logit[:3]
    assert out.top_ids[1, :2].tolist() == [10, 500]
    assert out.top_probs[0].tolist() == [1.0, 0.0, 0.0]
    greedy = SamplerSettings.greedy()
    assert (greedy.top_k, greedy.top_p, greedy.token_repetition_penalty, greedy.is_greedy) == (
        1,
        0.0,
        1.0,
        True,
    )


def test_temperature_last_changes_what_min_p_sees() -> None:
    logits = make_logits(37, 7)
    first = neutral(temperature=2.0, min_p=0.3)
    last = neutral(temperature=2.0, min_p=0.3, temperature_last=True)
    _, p_first = final_distribution(logits, first, SamplerState(first, seed=0))
    _, p_last = final_distribution(logits, last, SamplerState(last, seed=0))
    # min_p after a hot temperature keeps more tokens than min_p on the plain distribution.
    assert sum(x > 0 for x in p_first) > sum(x > 0 for x in p_last)
    for probs, s in ((p_first, first), (p_last, last)):
        order, ref = ref_distribution(logits.double().tolist(), s)
        np.testing.assert_allclose([probs[t] for t in order], ref, atol=1e-6)


def test_return_top_k_is_sorted_and_from_the_final_distribution() -> None:
    s = neutral(top_k=4, temperature=0.7)
    logits = make_logits(300, 9)
    out = sample(logits[None], [s], [SamplerState(s, seed=0)], return_top_k=6)
    probs = out.top_probs[0].tolist()
    assert probs == sorted(probs, reverse=True)
    assert sum(probs) == pytest.approx(1.0, abs=1e-6)
    assert probs[4:] == [0.0, 0.0]
    assert out.top_ids[0, :4].tolist() == sorted(range(300), key=lambda i: (-float(logits[i]), i))[:4]


# ------------------------------------------------------------- state and determinism


def _step_logits(job: int, step: int, vocab_size: int = 97) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * job + step)
    return torch.randn(vocab_size, generator=g) * 2


JOBS = [
    neutral(temperature=0.9, top_k=0, top_p=0.9),  # full sort when in a batch
    neutral(top_k=8, min_p=0.05, token_repetition_penalty=1.2, token_repetition_range=16),
    SamplerSettings.greedy(),
    neutral(top_k=30, mirostat=True, mirostat_tau=3.0, xtc_probability=0.5, xtc_threshold=0.05, skew=0.4),
    neutral(top_k=20, typical=0.9, min_temp=0.5, max_temp=1.5, temperature_last=True, dry_multiplier=0.5),
]


def _run(jobs: list[int], num_steps: int) -> dict[int, tuple[list[int], list[float]]]:
    states = {j: SamplerState(JOBS[j], [1, 2, 3], seed=100 + j, dry_breaker_ids=[0]) for j in jobs}
    tokens: dict[int, list[int]] = {j: [] for j in jobs}
    probs: dict[int, list[float]] = {j: [] for j in jobs}
    for step in range(num_steps):
        logits = torch.stack([_step_logits(j, step) for j in jobs])
        out = sample(logits, [JOBS[j] for j in jobs], [states[j] for j in jobs])
        for row, j in enumerate(jobs):
            tokens[j].append(int(out.token_ids[row]))
            probs[j].append(float(out.token_probs[row]))
            states[j].append(out.token_ids[row])
    return {j: (tokens[j], probs[j]) for j in jobs}


def test_seeded_job_draws_the_same_alone_or_batched() -> None:
    alone = {j: _run([j], 15)[j] for j in range(len(JOBS))}
    batched = _run([3, 0, 4, 2, 1], 15)
    for j in range(len(JOBS)):
        assert batched[j][0] == alone[j][0], f"job {j}"
        np.testing.assert_allclose(batched[j][1], alone[j][1], rtol=1e-6)
    assert len({tuple(alone[j][0]) for j in alone}) == len(JOBS)  # the jobs really differ


def test_states_sharing_settings_keep_their_own_mirostat_mu() -> None:
    shared = neutral(mirostat=True, mirostat_tau=2.0, mirostat_eta=0.5)
    logits = torch.stack([_step_logits(0, 0), _step_logits(1, 0)])
    a, b = SamplerState(shared, seed=1), SamplerState(shared, seed=2)
    a_alone, b_alone = SamplerState(shared, seed=1), SamplerState(shared, seed=2)
    for _ in range(4):
        sample(logits, [shared, shared], [a, b])
        sample(logits[:1], [shared], [a_alone])
        sample(logits[1:], [shared], [b_alone])
    assert float(a.mirostat_mu) == float(a_alone.mirostat_mu)
    assert float(b.mirostat_mu) == float(b_alone.mirostat_mu)
    assert float(a.mirostat_mu) != float(b.mirostat_mu)
    assert not hasattr(shared, "mirostat_mu")


# ------------------------------------------------------------- distribution checks


def test_blocked_ids_are_never_drawn() -> None:
    logits = torch.tensor([4.0, 3.9, 3.8, 0.0, -1.0, 0.5])
    s = neutral(temperature=1.5)
    states = [SamplerState(s, seed=i) for i in range(300)]
    blocked = [{0, 1, 4}] * 300
    out = sample(logits.expand(300, -1), [s] * 300, states, blocked=blocked, return_top_k=6)
    assert not set(out.token_ids.tolist()) & {0, 1, 4}
    assert set(out.token_ids.tolist()) == {2, 3, 5}
    greedy = SamplerSettings.greedy()
    out = sample(logits[None], [greedy], [SamplerState(greedy, seed=0)], blocked=[{0, 1}])
    assert out.token_ids.tolist() == [2]


def test_sampling_frequencies_match_the_distribution() -> None:
    """Chi-square goodness of fit over 4000 draws (fixed seeds, so the outcome is reproducible)."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.2, -0.5, -3.0])
    s = neutral(temperature=0.9, top_p=0.97)
    order, ref = ref_distribution(logits.double().tolist(), s)
    expected = {order[i]: ref[i] for i in range(6)}
    counts = dict.fromkeys(range(6), 0)
    for batch in range(4):
        states = [SamplerState(s, seed=batch * 1000 + i) for i in range(1000)]
        out = sample(logits.expand(1000, -1), [s] * 1000, states)
        for token in out.token_ids.tolist():
            counts[token] += 1
    live = [t for t in range(6) if expected[t] > 0]
    assert all(counts[t] == 0 for t in range(6) if expected[t] == 0)
    chi2 = sum((counts[t] - 4000 * expected[t]) ** 2 / (4000 * expected[t]) for t in live)
    critical = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}[len(live) - 1]  # p = 0.001
    assert chi2 < critical, (chi2, counts, expected)


# ---------------------------------------------------------------------------- bad input


def test_bad_sample_inputs() -> None:
    s = SamplerSettings()
    state = SamplerState(s, seed=0)
    with pytest.raises(ValueError, match="batch, vocab"):
        sample(torch.zeros(5), [s], [state])
    with pytest.raises(ValueError, match="one settings"):
        sample(torch.zeros(2, 5), [s], [state])
    with pytest.raises(ValueError, match="one settings"):
        sample(torch.zeros(1, 5), [s], [state], blocked=[])
    with pytest.raises(ValueError, match="return_top_k"):
        sample(torch.zeros(1, 5), [s], [state], return_top_k=6)
    with pytest.raises(ValueError, match="no finite logit"):
        sample(torch.tensor([[0.0, float("nan")]]), [s], [state])
