"""The C decode and prefill kernels (kernels/cpu/attention.py) against their torch twin (which is checked against dense
attention in test_paged_decode.py).

Layouts tried: pages in one run, runs with free pages between them, scattered ids, prefix pages shared by
several sequences, lengths ending on a page boundary, one-token sequences, long sequences over many 16-token
blocks and pages, sliding windows; both memory layouts of the cache (plain and the CPU's head-major one);
float32 and bfloat16; head sizes 64 and 128 (the vector path's instances), 8 and 24 (the portable path) and
GQA groups 1, 3, 7 and 12 (12 has no instance of its own); several new tokens per sequence (a speculative
step), each equal to decoding it alone. Prompts (the prefill kernel with AVX512-BF16, the decode kernel
elsewhere and for float32): alone, over a cached history (a later chunk), several of different lengths at
once, shared and scattered pages, sliding windows, head sizes 32, 64 and 128, groups 1, 3 and 8; a token's
bits the same in any call on either path. The kernels must decline float16 caches and head sizes over 256,
and a whole model must decode the same greedy tokens with them as with the twins.
"""

from __future__ import annotations

import random

import pytest
import torch

from kernels.cpu import attention as cpu_attention
from kernels.cpu import build
from kernels.torch_ref.attention import paged_attention as twin_attention
from kernels.torch_ref.paged_decode import decode_attention

pytestmark = pytest.mark.skipif(build.load("paged_decode") is None, reason="no C compiler to build the CPU kernel")


def make_cache(num_pages, page_size, hkv, d, dtype, head_major, g):
    if head_major:  # the CPU cache's memory: [pages, heads, slots, dim], seen as [pages, slots, heads, dim]
        return torch.randn(num_pages, hkv, page_size, d, generator=g).to(dtype).permute(0, 2, 1, 3)
    return torch.randn(num_pages, page_size, hkv, d, generator=g).to(dtype)


def compare(tables, lengths, page_size=4, hq=6, hkv=2, d=8, window=None, seed=0, dtype=torch.float32, head_major=True):
    g = torch.Generator().manual_seed(seed)
    num_pages = max(max(t) for t in tables) + 1
    k_cache = make_cache(num_pages, page_size, hkv, d, dtype, head_major, g)
    v_cache = make_cache(num_pages, page_size, hkv, d, dtype, head_major, g)
    q = torch.randn(len(tables), hq, d, generator=g).to(dtype)
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    seq_lens = torch.tensor(lengths)
    got = cpu_attention.paged_attention(
        q, k_cache, v_cache, block_tables, seq_lens, [1] * len(tables), lengths, 0.3, window
    )
    assert got is not None, "the C kernel declined a decode step it handles"
    want = decode_attention(q.float(), k_cache.float(), v_cache.float(), block_tables, lengths, 0.3, window)
    assert got.dtype == dtype and got.shape == want.shape
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, atol=tolerance, rtol=tolerance)


CASES = {
    "one run": ([[0, 1, 2], [3], [4, 5]], [9, 4, 6]),
    "run with free pages between": ([[0, 1], [3], [6, 7]], [5, 2, 8]),
    "scattered": ([[7, 2, 5], [0]], [10, 1]),
    "shared prefix pages": ([[0, 1, 2], [0, 1, 3], [0, 4]], [11, 12, 6]),
    "page boundaries": ([[0, 1], [2, 3]], [8, 4]),
    "one token each": ([[0], [1], [2]], [1, 1, 1]),
}


@pytest.mark.parametrize("head_major", [True, False], ids=["head-major", "plain"])
@pytest.mark.parametrize("name", list(CASES))
def test_layouts(name, head_major):
    tables, lengths = CASES[name]
    compare(tables, lengths, head_major=head_major)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(("d", "hq", "hkv"), [(64, 9, 3), (128, 8, 2), (64, 12, 1), (64, 7, 7), (8, 6, 2), (24, 6, 3)])
def test_head_sizes_groups_and_dtypes(d, hq, hkv, dtype):
    # many 16-token blocks and pages, a length ending inside a block, and one ending on a block boundary
    tables = [[0, 1, 2, 3, 4], [5, 6], [7]]
    compare(tables, [75, 32, 3], page_size=16, hq=hq, hkv=hkv, d=d, dtype=dtype, seed=d + hq)


@pytest.mark.parametrize("window", [1, 3, 17, 40, 1000])
def test_sliding_window(window):
    compare([[0, 1, 2, 3], [4, 5]], [60, 20], page_size=16, hq=9, hkv=3, d=64, window=window)


@pytest.mark.parametrize("seed", range(8))
def test_random_layouts(seed):
    rng = random.Random(seed)
    page_size = rng.choice([4, 16, 32])
    pages = list(range(40))
    rng.shuffle(pages)
    tables, lengths = [], []
    for _ in range(rng.randint(1, 6)):
        length = rng.randint(1, 4 * page_size)
        tables.append([pages.pop() for _ in range((length + page_size - 1) // page_size)])
        lengths.append(length)
    d = rng.choice([16, 64])
    compare(
        tables,
        lengths,
        page_size=page_size,
        hq=4,
        hkv=2,
        d=d,
        seed=seed,
        dtype=rng.choice([torch.float32, torch.bfloat16]),
    )


@pytest.mark.parametrize("window", [None, 3], ids=["causal", "window 3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_several_new_tokens_per_sequence_match_the_twin(dtype, window):
    # a speculative step: sequences verifying 3, 1 and 6 new tokens over their cached history
    g = torch.Generator().manual_seed(7)
    k_cache = make_cache(12, 8, 2, 64, dtype, True, g)
    v_cache = make_cache(12, 8, 2, 64, dtype, True, g)
    query_lens, seq_lens = [3, 1, 6], [20, 9, 6]
    q = torch.randn(sum(query_lens), 6, 64, generator=g).to(dtype)
    tables = torch.tensor([[4, 0, 7], [2, 9, 0], [11, 0, 0]])
    args = (tables, torch.tensor(seq_lens), query_lens, seq_lens, 0.3, window)
    got = cpu_attention.paged_attention(q, k_cache, v_cache, *args)
    want = twin_attention(q.float(), k_cache.float(), v_cache.float(), *args)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, atol=tolerance, rtol=tolerance)
    # each verified token gets what decoding it alone gives
    alone = cpu_attention.paged_attention(
        q[2:3], k_cache, v_cache, tables[:1], torch.tensor([20]), [1], [20], 0.3, window
    )
    assert torch.equal(got[2], alone[0])


def decline_args(dtype=torch.float32, d=8, query_lens=(1, 1)):
    k_cache = torch.zeros(10, 4, 2, d, dtype=dtype)
    q = torch.zeros(sum(query_lens), 4, d, dtype=dtype)
    tables = torch.tensor([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]])
    return q, k_cache, k_cache.clone(), tables, torch.tensor([17, 6]), list(query_lens), [17, 6], 0.5


@pytest.mark.parametrize(
    "args",
    [decline_args(dtype=torch.float16), decline_args(d=512)],
    ids=["float16", "head size 512"],
)
def test_declines_what_it_does_not_handle(args):
    assert cpu_attention.paged_attention(*args) is None


def test_a_model_decodes_the_same_greedy_tokens_as_with_the_twins(tiny_model, monkeypatch):
    from engine import Cache, DynamicGenerator, DynamicJob, SamplerSettings

    calls = []
    kernel = cpu_attention._kernel

    def counted():
        calls.append(1)
        return kernel()

    def decode():
        generator = DynamicGenerator(tiny_model, Cache(tiny_model, max_seq_len=256, page_size=16), tiny_model.tokenizer)
        prompts = [[1, 5, 9, 13, 2], [1] + [7] * 30 + [3], [1, 4]]
        jobs = [DynamicJob(p, 24, min_new_tokens=24, gen_settings=SamplerSettings.greedy()) for p in prompts]
        generator.enqueue(jobs)
        tokens = {id(job): [] for job in jobs}
        while generator.num_remaining_jobs():
            for result in generator.iterate():
                if result["stage"] == "streaming":
                    tokens[id(result["job"])] += result["token_ids"].flatten().tolist()
        return [tokens[id(job)] for job in jobs]

    monkeypatch.setattr(cpu_attention, "_kernel", counted)
    with_kernel = decode()
    assert calls, "decode steps did not reach the C kernel"
    monkeypatch.setattr(cpu_attention, "_kernel", lambda: None)
    with_twins = decode()
    assert with_kernel == with_twins and all(len(t) == 24 for t in with_kernel)


def compare_prompts(tables, lengths, query_lens, page_size=16, hq=9, hkv=3, d=64, window=None, head_major=True):
    g = torch.Generator().manual_seed(sum(lengths) + d)
    num_pages = max(max(t) for t in tables) + 1
    k_cache = make_cache(num_pages, page_size, hkv, d, torch.bfloat16, head_major, g)
    v_cache = make_cache(num_pages, page_size, hkv, d, torch.bfloat16, head_major, g)
    q = torch.randn(sum(query_lens), hq, d, generator=g).to(torch.bfloat16)
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    args = (block_tables, torch.tensor(lengths), query_lens, lengths, d**-0.5, window)
    got = cpu_attention.paged_attention(q, k_cache, v_cache, *args)
    assert got is not None, "the C kernels declined a prompt they handle"
    want = twin_attention(q.float(), k_cache.float(), v_cache.float(), *args)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("head_major", [True, False], ids=["head-major", "plain"])
@pytest.mark.parametrize(
    ("tables", "lengths", "query_lens"),
    [
        ([[0, 1, 2, 3, 4, 5, 6]], [100], [100]),  # a prompt alone, ending inside a page and a block
        ([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]], [150], [37]),  # a later chunk over 113 cached tokens
        ([[3, 0, 9], [1, 2], [4, 5, 6, 7, 8]], [40, 17, 70], [40, 17, 64]),  # several at once, scattered pages
        ([[0, 1, 2, 3], [0, 1, 2, 4]], [64, 60], [20, 60]),  # a shared prefix of three pages
        ([[0, 1, 2, 3, 4, 5, 6, 7, 8]], [129], [129]),  # one past two whole key blocks
    ],
    ids=["alone", "later chunk", "several", "shared prefix", "block boundary"],
)
def test_prompts(tables, lengths, query_lens, head_major):
    compare_prompts(tables, lengths, query_lens, head_major=head_major)


@pytest.mark.parametrize(("d", "hq", "hkv"), [(32, 4, 4), (128, 8, 1), (64, 12, 4)])
def test_prompt_head_sizes_and_groups(d, hq, hkv):
    compare_prompts([[0, 1, 2, 3, 4, 5]], [90], [90], hq=hq, hkv=hkv, d=d)


@pytest.mark.parametrize("window", [1, 5, 16, 63, 64, 65, 500])
def test_prompt_sliding_window(window):
    compare_prompts([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], [170], [150], window=window)


def test_float32_prompts_take_the_decode_kernel():
    # they once went to the twin, which rounds differently from the kernel that decodes the next tokens
    g = torch.Generator().manual_seed(5)
    k_cache, v_cache = torch.randn(2, 16, 2, 32, generator=g), torch.randn(2, 16, 2, 32, generator=g)
    q = torch.randn(20, 4, 32, generator=g)
    args = (torch.tensor([[0, 1]]), torch.tensor([20]), [20], [20], 0.2)
    got = cpu_attention.paged_attention(q, k_cache, v_cache, *args)
    assert got is not None
    torch.testing.assert_close(got, twin_attention(q, k_cache, v_cache, *args), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("window", [None, 40], ids=["causal", "window 40"])
def test_a_token_gets_the_same_bits_in_any_call(window, dtype):
    # The last token of a 150-token prompt: computed with the whole prompt (cold), in a last chunk of 3, alone
    # after a prefix-cache hit, as a decode step beside another sequence, and through a decode plan's binding.
    # One kernel for all, so greedy answers do not change when a prompt is cached.
    g = torch.Generator().manual_seed(3)
    k_cache = make_cache(12, 16, 3, 64, dtype, True, g)
    v_cache = make_cache(12, 16, 3, 64, dtype, True, g)
    q = torch.randn(150, 9, 64, generator=g).to(dtype)
    own, other = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [10, 11, 0, 0, 0, 0, 0, 0, 0, 0]
    table, scale = torch.tensor([own]), 0.125

    def attend(rows, tables, query_lens, seq_lens):
        args = (tables, torch.tensor(seq_lens), query_lens, seq_lens, scale, window)
        return cpu_attention.paged_attention(rows, k_cache, v_cache, *args)

    cold = attend(q, table, [150], [150])
    chunk = attend(q[147:], table, [3], [150])
    alone = attend(q[149:], table, [1], [150])
    beside = attend(torch.cat([q[149:], q[:1]]), torch.tensor([own, other]), [1, 1], [150, 20])
    out, lens = torch.empty_like(q[149:]), torch.tensor([150])
    fn, args = cpu_attention.bind_decode(q[149:].contiguous(), k_cache, v_cache, out, table, lens, scale, window, 2)
    assert fn(*args) == 0
    assert torch.equal(chunk, cold[147:])
    for row in (alone[0], beside[0], out[0]):
        assert torch.equal(row, cold[149])
