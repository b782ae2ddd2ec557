"""Triton kernels for quantized KV pages (write, paged attention) against their twins (the format's in
kernels/torch_ref/kv_quant.py; attention's, which routes uint8 pages there, in kernels/torch_ref/attention.py),
on CPU through triton's interpreter; and the dispatch candidates that choose them.

Every case draws fresh random inputs (seeded by the case's id, so a failure reproduces), lays each sequence's
pages out in shuffled order with unused pages between, and starts every buffer the kernels allocate as NaN.
"""

from __future__ import annotations

import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from kernels.triton import launch  # does not import triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    launch.use_interpreter()  # before triton is imported: it picks the interpreter at import
pytest.importorskip("triton", reason="triton is not installed: the Triton kernels are tested only where it is")

from kernels.torch_ref import attention as attention_twin  # noqa: E402
from kernels.torch_ref import kv_quant as twin  # noqa: E402
from kernels.triton import attention, kv_quant  # noqa: E402
from kernels.triton import candidates as triton_kernels  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
FORMATS = list(twin.FORMATS)  # "q8", "q6", "q4"
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
PAGE_SIZE = 16


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Make every output and scratch buffer of the launchers start as NaN instead of whatever memory held."""
    monkeypatch.setattr(
        launch, "empty", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device)
    )


def generator(request) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(request.node.name.encode()))


def rows(g: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Random K/V-like rows: a few channels far larger than the rest, as real keys have."""
    x = torch.randn(shape, generator=g)
    x[..., 3] *= 20.0
    return x


# --- writing ---------------------------------------------------------------------------------------------------


def assert_same_codes(actual: torch.Tensor, expected: torch.Tensor, bits: int, head_dim: int) -> None:
    """Written rows [..., row_bytes]: every scale equal, at least 99.9% of the codes equal and the rest one step
    off (a GPU may round a tie the other way). Under the interpreter, equal to the bit."""
    if launch.interpreting():
        assert torch.equal(actual, expected)
    blocks_a = actual.reshape(-1, 2 + twin.payload_bytes(bits))
    blocks_e = expected.reshape(-1, 2 + twin.payload_bytes(bits))
    assert torch.equal(blocks_a[:, :2], blocks_e[:, :2])
    values_a = twin.dequantize(actual, bits, head_dim).reshape(-1, twin.GROUP)
    values_e = twin.dequantize(expected, bits, head_dim).reshape(-1, twin.GROUP)
    differ = values_a != values_e
    assert differ.float().mean().item() <= 1e-3
    scales = blocks_e[:, :2].contiguous().view(torch.float16).float().abs()  # [blocks, 1]
    steps = (values_a - values_e).abs()
    assert torch.equal(steps[differ], scales.expand_as(steps)[differ])


def write_case(g, kv_format: str, head_dim: int, dtype: torch.dtype, head_major: bool = False):
    """(caches, k, v, slots): random bytes in the caches (no slot may change but the written ones), k and v as
    strided views of a fused projection, one all-zero row, slots scattered over the pages."""
    num_pages, num_kv_heads, num_tokens = 3, 2, 13
    row_bytes = twin.row_bytes(head_dim, twin.FORMATS[kv_format])
    if head_major:  # the CPU cache's layout: a permuted view of [pages, heads, slots, row bytes]
        memory = torch.randint(0, 256, (num_pages, num_kv_heads, PAGE_SIZE, row_bytes), generator=g, dtype=torch.uint8)
        k_cache = memory.permute(0, 2, 1, 3)
        v_cache = memory.clone().permute(0, 2, 1, 3)
    else:
        shape = (num_pages, PAGE_SIZE, num_kv_heads, row_bytes)
        k_cache = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
        v_cache = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    width = num_kv_heads * head_dim
    fused = rows(g, (num_tokens, 3, num_kv_heads, head_dim)).reshape(num_tokens, 3 * width).to(dtype)
    fused[0, width : width + head_dim] = 0.0  # token 0's first key head: an all-zero row (scale 0)
    k = fused[:, width : 2 * width].view(num_tokens, num_kv_heads, head_dim)
    v = fused[:, 2 * width :].view(num_tokens, num_kv_heads, head_dim)
    slots = torch.randperm(num_pages * PAGE_SIZE, generator=g)[:num_tokens]
    return k_cache, v_cache, k, v, slots


def check_write(case, kv_format: str, head_dim: int) -> None:
    k_cache, v_cache, k, v, slots = case
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    twin.write_kv(ref_k, ref_v, k, v, slots)
    dev = [t.to(DEVICE) for t in case]
    assert kv_quant.write_kv(*dev) is True
    written = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    written[slots // PAGE_SIZE, slots % PAGE_SIZE] = True
    for actual, expected in ((dev[0].cpu(), ref_k), (dev[1].cpu(), ref_v)):
        assert torch.equal(actual[~written], expected[~written])
        assert_same_codes(actual[written], expected[written], twin.FORMATS[kv_format], head_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("kv_format", FORMATS)
def test_write_matches_twin(request, kv_format, head_dim, dtype):
    check_write(write_case(generator(request), kv_format, head_dim, dtype), kv_format, head_dim)


def test_write_into_head_major_pages(request):
    """The kernel follows the cache's strides: the CPU cache's permuted view works as the contiguous one."""
    check_write(write_case(generator(request), "q4", 64, torch.float32, head_major=True), "q4", 64)


# --- attention ---------------------------------------------------------------------------------------------------


def paged_case(g, seq_lens, query_lens, kv_format, num_q_heads, num_kv_heads, head_dim, dtype=torch.float32):
    """Quantized caches of random rows with shuffled page tables (plus unused pages), q a strided view."""
    pages_per_seq = [-(-n // PAGE_SIZE) for n in seq_lens]
    num_pages = sum(pages_per_seq) + 2
    order = torch.randperm(num_pages, generator=g).tolist()
    tables, used = [], 0
    for n in pages_per_seq:
        tables.append(order[used : used + n])
        used += n
    width = max(pages_per_seq)
    block_tables = torch.tensor([t + [order[-1]] * (width - len(t)) for t in tables], dtype=torch.int32)
    shape = (num_pages, PAGE_SIZE, num_kv_heads, head_dim)
    bits = twin.FORMATS[kv_format]
    k_cache = twin.quantize(twin.rotate(rows(g, shape)), bits)
    v_cache = twin.quantize(twin.rotate(rows(g, shape)), bits)
    qkv = torch.randn(sum(query_lens), (num_q_heads + 2 * num_kv_heads) * head_dim, generator=g).to(dtype)
    q = qkv[:, : num_q_heads * head_dim].view(-1, num_q_heads, head_dim)
    tensors = (q, k_cache, v_cache, block_tables, torch.tensor(seq_lens))
    return tuple(t.to(DEVICE) for t in tensors) + (tuple(query_lens), tuple(seq_lens), head_dim**-0.5)


def check_attention(args, window=None, key_ends=None) -> None:
    dtype = args[0].dtype
    out = kv_quant.paged_attention(*args, window, key_ends)
    cpu = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
    if key_ends is None:
        ref = attention_twin.paged_attention(*cpu, window)
    else:
        ref = attention_twin.paged_attention_key_ends(*cpu, window, key_ends.cpu())
    assert out.dtype == ref.dtype == dtype and out.shape == ref.shape
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.cpu().float(), ref.float(), rtol=tol, atol=tol * ref.float().abs().max().item())


@pytest.mark.parametrize("gqa", [1, 2])
@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("kv_format", FORMATS)
def test_decode_matches_twin(request, kv_format, head_dim, gqa):
    # Lengths cross page boundaries and sit exactly on them; one sequence has a single token.
    seq_lens = [1, 16, 17, 40]
    check_attention(paged_case(generator(request), seq_lens, [1] * 4, kv_format, 2 * gqa, 2, head_dim))


@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("kv_format", FORMATS)
def test_prefill_matches_twin(request, kv_format, head_dim):
    # Ragged: a whole prompt, a decode row, a chunk after cached pages that crosses a page boundary.
    past, query_lens = [0, 16, 5], [12, 1, 30]
    seq_lens = [p + n for p, n in zip(past, query_lens)]
    check_attention(paged_case(generator(request), seq_lens, query_lens, kv_format, 4, 2, head_dim))


def test_decode_split_over_many_pages(request):
    """One long sequence: the keys are split over several programs, each rotating its part back, then merged."""
    args = paged_case(generator(request), [300], [1], "q4", 4, 2, 64)
    block_n = kv_quant._blocks(64)[1]
    assert attention._num_splits(2, 300, args[0].device, block_n)[0] > 1
    check_attention(args)


@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 30, 5]], ids=["decode", "prefill"])
def test_sliding_window(request, query_lens):
    args = paged_case(generator(request), [100, 37, 20], query_lens, "q6", 4, 2, 64)
    check_attention(args, window=7)


def test_bfloat16_queries_give_bfloat16_output(request):
    check_attention(paged_case(generator(request), [40, 9], [10, 1], "q8", 4, 2, 64, torch.bfloat16))


def test_key_ends_make_a_run_bidirectional(request):
    """Gemma 3's image tokens: a run of new tokens sees each other both ways; the rest stays causal."""
    seq_lens, query_lens = [40, 20], [30, 3]
    args = paged_case(generator(request), seq_lens, query_lens, "q4", 4, 2, 32)
    key_ends = torch.cat([torch.arange(11, 41), torch.arange(18, 21)])  # each token's position + 1
    key_ends[5:12] = 22  # tokens at positions 15..21 see the whole run
    check_attention(args, window=16, key_ends=key_ends.to(DEVICE))


# --- candidates --------------------------------------------------------------------------------------------------

CPU_DECLINE = """
import sys
import torch
from kernels.torch_ref import kv_quant
from kernels.triton import candidates
bits, head_dim = 4, 64
cache = torch.zeros(2, 16, 2, kv_quant.row_bytes(head_dim, bits), dtype=torch.uint8)
k = torch.randn(3, 2, head_dim)
q = torch.randn(2, 4, head_dim)
tables, seq_lens = torch.tensor([[0], [1]]), torch.tensor([3, 5])
attn = (q, cache, cache.clone(), tables, seq_lens, (1, 1), (3, 5), 0.125)
assert candidates.write_kv_quant(cache, cache.clone(), k, k, torch.tensor([0, 5, 17])) is None
assert candidates.paged_attention_quant(*attn) is None
assert candidates.paged_attention_key_ends_quant(*attn, None, torch.tensor([3, 5])) is None
assert "triton" not in sys.modules, "a CPU call imported triton"
"""


def test_candidates_decline_cpu_tensors_without_importing_triton():
    run = subprocess.run([sys.executable, "-c", CPU_DECLINE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_candidates_on_cuda_accept_quantized_caches_and_decline_the_rest(request):
    args = paged_case(generator(request), [3, 5], [1, 1], "q6", 4, 2, 64, torch.bfloat16)
    assert triton_kernels.paged_attention_quant(*args) is not None
    assert triton_kernels.paged_attention(*args) is None  # the float kernels leave uint8 pages alone
    q, k_cache, v_cache, *rest = args
    assert triton_kernels.paged_attention_quant(q[:, :, :32].contiguous(), k_cache, v_cache, *rest) is None
    floats = torch.zeros(k_cache.shape[:3] + (64,), device="cuda")
    assert triton_kernels.paged_attention_quant(q, floats, floats.clone(), *rest) is None
    k = torch.randn(2, 2, 64, device="cuda")
    slots = torch.tensor([0, 20], device="cuda")
    assert triton_kernels.write_kv_quant(k_cache, v_cache, k, k, slots) is True
    assert triton_kernels.write_kv_quant(k_cache, v_cache, k.double(), k.double(), slots) is None
