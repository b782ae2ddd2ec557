"""The C kernels for quantized KV pages (kernels/cpu/kv_quant.py) against their torch twin.

Writes: codes equal kv_quant.quantize(kv_quant.rotate(x)) to the bit for 8, 6 and 4 bits, float32 and bfloat16
rows, head sizes 32, 64 and 128, into the CPU's head-major cache memory at scattered slots, from k and v views
of one fused projection (rows strided); rows with a block of zeros, blocks of tiny values (float16 scales
that are subnormal or zero), ties for the largest magnitude, and values far apart in size. A slot outside the
cache writes nothing.

Attention: close to the twin (kernels/torch_ref/attention.py over uint8 pages) for GQA groups 1, 3 and 8,
head sizes 32, 64, 128 and 96 (no instance of its own), sliding windows, scattered and shared page tables,
plain and head-major layouts, float32 and bfloat16 queries; and to the bit: a decode row equals the float32
kernel on the dequantized pages with the rotated query, its output rotated back (the design's invariant), and
a prompt's rows (paged_prefill_quant's tiles) equal the same tokens decoded one at a time, alone or beside
other sequences: GQA groups 1 to 8 and 16, head sizes 32 to 128, cold prompts and chunks after cached tokens,
lengths that are no multiple of a tile or a block, sliding windows of one key to more than a block. Declined:
head sizes not a multiple of 32, float caches, float16 queries, GQA groups over 16, a uint8 row of no format,
a prompt whose page table points outside the cache. The portable build (TANDEM_CPU_KERNEL_ARCH=x86-64) runs
the same tests in a child process, and so does the AVX2 build (x86-64-v3) on an AVX-512 CPU.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.cpu import attention as cpu_attention
from kernels.cpu import build
from kernels.cpu import kv_quant as cpu_kv_quant
from kernels.torch_ref import kv_quant
from kernels.torch_ref.attention import paged_attention as twin_attention

pytestmark = pytest.mark.skipif(
    build.load("kv_quant") is None or build.load("paged_decode") is None, reason="no C compiler for the CPU kernels"
)

FORMATS = list(kv_quant.FORMATS)


def quant_cache(num_pages, page_size, heads, head_dim, bits, head_major=True):
    """An empty quantized K or V layer (the CPU's head-major memory seen as [pages, slots, heads, row bytes])."""
    row = kv_quant.row_bytes(head_dim, bits)
    if head_major:
        return torch.zeros(num_pages, heads, page_size, row, dtype=torch.uint8).permute(0, 2, 1, 3)
    return torch.zeros(num_pages, page_size, heads, row, dtype=torch.uint8)


def awkward_rows(tokens, heads, head_dim, g):
    """Rows of every size, with the blocks that test the scale and rounding rules."""
    x = torch.randn(tokens, heads, head_dim, generator=g) * torch.logspace(-3, 3, tokens)[:, None, None]
    x[0, 0, :32] = 0  # a block of zeros: scale 0, every code the middle one
    x[1, :, :] *= 1e-9  # float16 scales that underflow to subnormals or zero
    # one value in a block rotates to 32 of equal magnitude, alternating in sign: the first sets the scale's sign
    x[2, :, :] = 0
    x[2, 0, 1], x[2, 1, 1], x[2, 2, 33 % head_dim] = 1.0, -3.0, 0.5
    x[3, 0, :] = 1e4  # large values; after rotation most of a block is zero
    return x


@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", FORMATS)
def test_write_codes_equal_the_twins(name, dtype, head_dim):
    bits, heads, page_size, num_pages = kv_quant.FORMATS[name], 3, 16, 6
    g = torch.Generator().manual_seed(bits + head_dim)
    tokens = 40
    # k and v as views of one fused projection [tokens, 2 * heads * head_dim]: rows strided, heads packed
    fused = torch.cat([awkward_rows(tokens, heads, head_dim, g), torch.randn(tokens, heads, head_dim, generator=g)], 1)
    fused = fused.to(dtype).reshape(tokens, -1)
    k = fused[:, : heads * head_dim].view(tokens, heads, head_dim)
    v = fused[:, heads * head_dim :].view(tokens, heads, head_dim)
    slots = torch.randperm(num_pages * page_size, generator=g)[:tokens]
    caches = [quant_cache(num_pages, page_size, heads, head_dim, bits) for _ in range(4)]
    assert cpu_kv_quant.write_kv(caches[0], caches[1], k, v, slots) is True
    kv_quant.write_kv(caches[2], caches[3], k, v, slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_a_slot_outside_the_cache_writes_nothing():
    k_cache, v_cache = quant_cache(2, 16, 2, 64, 4), quant_cache(2, 16, 2, 64, 4)
    k = torch.randn(3, 2, 64)
    assert cpu_kv_quant.write_kv(k_cache, v_cache, k, k, torch.tensor([0, 5, 32])) is None
    assert not k_cache.any() and not v_cache.any()


def filled(tables, lengths, bits, hkv, d, page_size, g, head_major=True):
    """K and V layers with every slot the tables reach written through the C write kernel."""
    num_pages = max(max(t) for t in tables) + 1
    k_cache = quant_cache(num_pages, page_size, hkv, d, bits, head_major)
    v_cache = quant_cache(num_pages, page_size, hkv, d, bits, head_major)
    slots = torch.arange(num_pages * page_size)
    k = torch.randn(len(slots), hkv, d, generator=g)
    k[:, :, 3] *= 8  # an outlier channel, as real keys have
    v = torch.randn(len(slots), hkv, d, generator=g)
    assert cpu_kv_quant.write_kv(k_cache, v_cache, k, v, slots)
    return k_cache, v_cache


def padded(tables) -> torch.Tensor:
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables])


def float_kernel_rows(q, k_cache, v_cache, tables, lengths, bits, scale, window):
    """The invariant's right side: the float32 kernel on the dequantized pages, q rotated in, out rotated back."""
    d = q.shape[-1]
    k, v = kv_quant.dequantize(k_cache, bits, d), kv_quant.dequantize(v_cache, bits, d)
    lens = torch.tensor(lengths)
    out = cpu_attention.paged_attention(
        kv_quant.rotate(q), k, v, tables, lens, [1] * len(lengths), lengths, scale, window
    )
    return kv_quant.rotate(out).to(q.dtype)


DECODES = {
    "scattered": ([[7, 2, 5], [0], [3, 6]], [40, 1, 17]),
    "shared prefix pages": ([[0, 1, 2], [0, 1, 3], [0, 4]], [41, 48, 20]),
    "long": ([[4, 1, 0, 2, 3, 5, 6, 7]], [125]),  # two 64-key blocks and a part, over page ends
}


@pytest.mark.parametrize("layout", list(DECODES))
@pytest.mark.parametrize(("d", "hq", "hkv"), [(64, 9, 3), (128, 8, 1), (32, 4, 4), (96, 6, 2)])
@pytest.mark.parametrize("name", FORMATS)
def test_decode_rows_match_the_twin_and_the_float_kernel_to_the_bit(name, d, hq, hkv, layout):
    bits, (tables, lengths) = kv_quant.FORMATS[name], DECODES[layout]
    g = torch.Generator().manual_seed(d + hq + bits)
    k_cache, v_cache = filled(tables, lengths, bits, hkv, d, 16, g, head_major=layout != "long")
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(len(tables), hq, d, generator=g).to(dtype)
        args = (q, k_cache, v_cache, padded(tables), torch.tensor(lengths), [1] * len(lengths), lengths, 0.125)
        got = cpu_kv_quant.paged_attention(*args)
        assert got is not None and got.dtype == dtype and got.shape == q.shape
        want = twin_attention(*args)
        tolerance = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.float(), want.float(), atol=tolerance, rtol=tolerance)
        exact = float_kernel_rows(q, k_cache, v_cache, padded(tables), lengths, bits, 0.125, None)
        assert torch.equal(got, exact)


@pytest.mark.parametrize("window", [1, 20, 70])
@pytest.mark.parametrize("name", ["q8", "q4"])
def test_sliding_windows(name, window):
    bits, tables, lengths = kv_quant.FORMATS[name], [[3, 1, 4, 0, 5, 2, 6, 7], [8, 9]], [120, 30]
    g = torch.Generator().manual_seed(window)
    k_cache, v_cache = filled(tables, lengths, bits, 2, 64, 16, g)
    q = torch.randn(2, 6, 64, generator=g).to(torch.bfloat16)
    args = (q, k_cache, v_cache, padded(tables), torch.tensor(lengths), [1, 1], lengths, 0.125, window)
    got = cpu_kv_quant.paged_attention(*args)
    torch.testing.assert_close(got.float(), twin_attention(*args).float(), atol=2e-2, rtol=2e-2)
    assert torch.equal(got, float_kernel_rows(q, k_cache, v_cache, padded(tables), lengths, bits, 0.125, window))


@pytest.mark.parametrize("window", [None, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", FORMATS)
def test_a_prompts_rows_equal_its_tokens_decoded_one_at_a_time(name, dtype, window):
    """A prompt (paged_prefill_quant) and a decode step (paged_decode_quant) give a token the same bits: a
    30-token chunk over a cached history (with the window, its first pages are not read) beside a one-token
    sequence and a short prompt."""
    bits = kv_quant.FORMATS[name]
    tables, lengths, query_lens = [[5, 0, 7, 2, 9, 4], [1, 3], [6, 8]], [90, 29, 5], [30, 1, 5]
    g = torch.Generator().manual_seed(bits)
    k_cache, v_cache = filled(tables, lengths, bits, 3, 64, 16, g)
    q = torch.randn(sum(query_lens), 9, 64, generator=g).to(dtype)
    block_tables = padded(tables)
    args = (k_cache, v_cache, block_tables, torch.tensor(lengths), query_lens, lengths, 0.125, window)
    got = cpu_kv_quant.paged_attention(q, *args)
    assert got is not None and got.dtype == dtype
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), twin_attention(q, *args).float(), atol=tolerance, rtol=tolerance)
    row = 0
    for i, (n, end) in enumerate(zip(query_lens, lengths)):
        for length in range(end - n + 1, end + 1):
            one = cpu_kv_quant.paged_attention(
                q[row : row + 1], k_cache, v_cache, block_tables[i : i + 1], torch.tensor([length]), [1], [length],
                0.125, window,
            )  # fmt: skip
            assert torch.equal(one, got[row : row + 1]), (i, length)
            row += 1


def decode_rows(q, k_cache, v_cache, tables, query_lens, lengths, scale, window):
    """Each prompt row as a decode step of its own: one call, a sequence of one token per row."""
    rows = [
        (i, length) for i, (n, end) in enumerate(zip(query_lens, lengths)) for length in range(end - n + 1, end + 1)
    ]
    row_tables = tables[[i for i, _ in rows]]
    row_lens = [length for _, length in rows]
    one = [1] * len(rows)
    return cpu_kv_quant.paged_attention(
        q, k_cache, v_cache, row_tables, torch.tensor(row_lens), one, row_lens, scale, window
    )


# (head_dim, q heads, kv heads): GQA groups 1 to 8 at the instanced head sizes, and the general ones (head size
# 96, group 16)
PROMPT_SHAPES = [(64, 8, 8), (128, 4, 2), (64, 9, 3), (128, 8, 2), (64, 10, 2), (128, 12, 2), (64, 7, 1), (128, 8, 1)]
PROMPT_SHAPES += [(96, 6, 2), (32, 16, 1)]


@pytest.mark.parametrize("window", [None, 37])
@pytest.mark.parametrize(("d", "hq", "hkv"), PROMPT_SHAPES)
def test_prompt_rows_equal_decode_rows_for_every_group_and_head_size(d, hq, hkv, window):
    """Several prompts in one call, each row to the bit its token's decode step: a cold prompt of 70 tokens, a
    83-token chunk after 130 cached ones (rows over 3 blocks, the tiles' last rows cut mid-block), a one-token
    sequence and a 17-token prompt; with a window, the rows' first keys move with them."""
    name = FORMATS[(d + hq) % len(FORMATS)]
    bits, page_size = kv_quant.FORMATS[name], 16
    tables = [[3, 0, 6, 9, 1], [2, 4, 7, 8, 10, 11, 12, 13, 5, 14, 15, 16, 17, 18], [19], [20, 21]]
    lengths, query_lens = [70, 213, 9, 17], [70, 83, 1, 17]
    g = torch.Generator().manual_seed(d * hq + hkv)
    k_cache, v_cache = filled(tables, lengths, bits, hkv, d, page_size, g)
    dtype = torch.bfloat16 if hq % 2 else torch.float32
    q = torch.randn(sum(query_lens), hq, d, generator=g).to(dtype)
    block_tables = padded(tables)
    args = (k_cache, v_cache, block_tables, torch.tensor(lengths), query_lens, lengths, 0.125, window)
    got = cpu_kv_quant.paged_attention(q, *args)
    assert got is not None and got.dtype == dtype
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), twin_attention(q, *args).float(), atol=tolerance, rtol=tolerance)
    want = decode_rows(q, k_cache, v_cache, block_tables, query_lens, lengths, 0.125, window)
    assert torch.equal(got, want)


@pytest.mark.parametrize("window", [None, 1, 64, 100])
def test_long_prompt_rows_equal_decode_rows(window):
    """A 300-token chunk after 200 cached tokens in 256-slot pages (the engine's): many tiles, several blocks
    per row, windows of one key, of exactly a block, and longer than one."""
    bits, tables, lengths, query_lens = 4, [[1, 0]], [500], [300]
    g = torch.Generator().manual_seed(window or 0)
    k_cache, v_cache = filled(tables, lengths, bits, 2, 64, 256, g)
    q = torch.randn(300, 6, 64, generator=g).to(torch.bfloat16)
    block_tables = padded(tables)
    got = cpu_kv_quant.paged_attention(q, k_cache, v_cache, block_tables, torch.tensor(lengths), query_lens, lengths,
                                       0.125, window)  # fmt: skip
    want = decode_rows(q, k_cache, v_cache, block_tables, query_lens, lengths, 0.125, window)
    assert got is not None and torch.equal(got, want)


def test_a_prompt_over_a_page_outside_the_cache_is_declined():
    k_cache, v_cache = quant_cache(2, 16, 2, 64, 4), quant_cache(2, 16, 2, 64, 4)
    q = torch.randn(20, 4, 64)
    tables = torch.tensor([[0, 2]])  # the second page is past the cache's two
    assert cpu_kv_quant.paged_attention(q, k_cache, v_cache, tables, torch.tensor([20]), [20], [20], 0.125) is None


def test_bind_decode_and_bind_write_run_what_the_candidates_run():
    bits, tables, lengths = 6, [[2, 0], [1]], [20, 9]
    g = torch.Generator().manual_seed(0)
    k_cache, v_cache = filled(tables, lengths, bits, 2, 64, 16, g)
    q = torch.randn(2, 4, 64, generator=g).to(torch.bfloat16)
    lens, block_tables = torch.tensor(lengths), padded(tables)
    out = torch.empty_like(q)
    fn, args = cpu_kv_quant.bind_decode(q, k_cache, v_cache, out, block_tables, lens, 0.125, None, 2)
    assert fn(*args) == 0
    assert torch.equal(
        out, cpu_kv_quant.paged_attention(q, k_cache, v_cache, block_tables, lens, [1, 1], lengths, 0.125)
    )
    k, v, slots = (
        torch.randn(2, 2, 64).to(torch.bfloat16),
        torch.randn(2, 2, 64).to(torch.bfloat16),
        torch.tensor([3, 40]),
    )
    copies = k_cache.clone(), v_cache.clone()
    fn, args = cpu_kv_quant.bind_write(k, v, k_cache, v_cache, slots, 1)
    assert fn(*args) == 0
    kv_quant.write_kv(*copies, k, v, slots)
    assert torch.equal(k_cache, copies[0]) and torch.equal(v_cache, copies[1])


def decline_args(d=64, q_dtype=torch.bfloat16, hq=4, cache_dtype=torch.uint8, row=None):
    cache = torch.zeros(2, 16, 2, row or (kv_quant.row_bytes(d, 4) if cache_dtype == torch.uint8 else d))
    cache = cache.to(cache_dtype)
    q = torch.randn(1, hq, d).to(q_dtype)
    return q, cache, cache.clone(), torch.tensor([[0]]), torch.tensor([5]), [1], [5], 0.125


@pytest.mark.parametrize(
    "args",
    [
        decline_args(d=40, row=40),  # a head size that is no multiple of 32
        decline_args(cache_dtype=torch.bfloat16),  # a float cache: kernels/cpu/attention.py's
        decline_args(q_dtype=torch.float16),
        decline_args(hq=34),  # a GQA group of 17
        decline_args(row=37),  # uint8 rows of no format
    ],
    ids=["head size 40", "bfloat16 cache", "float16 q", "group 17", "row of no format"],
)
def test_declines_what_it_does_not_handle(args):
    assert cpu_kv_quant.paged_attention(*args) is None
    q, k_cache, v_cache = args[:3]
    k = q[:, : k_cache.shape[2]]
    if q.shape[1] != 34:  # the write has no GQA group
        assert cpu_kv_quant.write_kv(k_cache, v_cache, k, k, torch.tensor([0])) is None


@pytest.mark.skipif(shutil.which("cc") is None or platform.machine() != "x86_64", reason="needs cc on x86-64")
@pytest.mark.parametrize("arch", ["x86-64-v3", "x86-64"])
def test_the_other_builds_pass_the_same_tests(arch):
    """The AVX2 path (x86-64-v3; on an AVX2 CPU it is the native build above) and the plain C loops (x86-64):
    codes, the twin, and every bit-identity above, in a child process that loads that build alone."""
    if os.environ.get("TANDEM_CPU_KERNEL_ARCH"):
        pytest.skip("already the child")
    if arch == "x86-64-v3" and "avx512f" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("the native build is the AVX2 one")
    env = {**os.environ, "TANDEM_CPU_KERNEL_ARCH": arch}
    tests = "write_codes or decode_rows or sliding or one_at_a_time or prompt_rows"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__, "-k", tests],
        capture_output=True, text=True, timeout=900, env=env, cwd=Path(__file__).parents[3],
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout
