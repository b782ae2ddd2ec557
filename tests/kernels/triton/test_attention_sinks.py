"""Triton paged attention with learned sinks (kernels/triton/attention_sinks.py) against the twin
(kernels/torch_ref/attention.py's `paged_attention_sinks`), on CPU through triton's interpreter; and its dispatch
candidate.

Float pages (float32 within 1e-5, bfloat16 within 2e-2) and quantized ones (q8, q6, q4), decode steps (one
program per sequence and KV head, and split along the keys, where only split 0 starts with the sink) and ragged
prompts, GQA groups 1 to 8, head sizes 32 to 128 (80: a masked tile), sliding windows (one that leaves split 0
no keys at all); sinks far above the scores (the output goes to 0), far below (plain attention), and -inf (no
sink: what `kernels.triton.attention` gives). Every case draws fresh random inputs seeded by its id, lays pages
out in shuffled order, and starts every buffer the kernels allocate as NaN.
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

from kernels.torch_ref import attention as twin  # noqa: E402
from kernels.torch_ref import kv_quant  # noqa: E402
from kernels.triton import attention, attention_sinks  # noqa: E402
from kernels.triton import candidates as triton_kernels  # noqa: E402
from kernels.triton import kv_quant as triton_quant  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
FORMATS = list(kv_quant.FORMATS)


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Make every output and scratch buffer of the launchers start as NaN instead of whatever memory held."""
    monkeypatch.setattr(
        launch, "empty", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device)
    )


def generator(request) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(request.node.name.encode()))


def paged_case(g, seq_lens, query_lens, num_q_heads, num_kv_heads, head_dim, kind, page_size=16, sinks=None):
    """Random pages (float of dtype `kind`, or quantized of format `kind`) with shuffled page tables and unused
    pages, q a strided view of a fused qkv, and sinks of the scores' size (one large, one small) unless given."""
    pages_per_seq = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(pages_per_seq) + 2
    order = torch.randperm(num_pages, generator=g).tolist()
    tables, used = [], 0
    for n in pages_per_seq:
        tables.append(order[used : used + n])
        used += n
    width = max(pages_per_seq)
    block_tables = torch.tensor([t + [order[-1]] * (width - len(t)) for t in tables], dtype=torch.int32)
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    if isinstance(kind, str):
        bits, dtype = kv_quant.FORMATS[kind], torch.float32
        k_cache, v_cache = (kv_quant.quantize(kv_quant.rotate(torch.randn(shape, generator=g)), bits) for _ in "kv")
    else:
        dtype = kind
        k_cache, v_cache = (torch.randn(shape, generator=g).to(dtype) for _ in "kv")
    qkv = torch.randn(sum(query_lens), (num_q_heads + 2 * num_kv_heads) * head_dim, generator=g).to(dtype)
    q = qkv[:, : num_q_heads * head_dim].view(-1, num_q_heads, head_dim)
    if sinks is None:
        sinks = torch.randn(num_q_heads, generator=g) * 2
        sinks[0], sinks[-1] = 6.0, -6.0
    tensors = (q, k_cache, v_cache, block_tables, torch.tensor(seq_lens))
    on_device = tuple(t.to(DEVICE) for t in tensors)
    return on_device + (tuple(query_lens), tuple(seq_lens), head_dim**-0.5, sinks.to(DEVICE))


def check(args, window=None) -> torch.Tensor:
    """The kernels against the twin, within the output dtype's tolerance relative to the largest magnitude."""
    out = attention_sinks.paged_attention_sinks(*args, window)
    ref = twin.paged_attention_sinks(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args), window)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    tol = TOLERANCE[ref.dtype]
    scale = max(ref.float().abs().max().item(), 1e-30)
    torch.testing.assert_close(out.cpu().float(), ref.float(), rtol=tol, atol=tol * scale)
    return out


def heads(gqa: int) -> tuple[int, int]:
    """(query heads, KV heads): one KV head at GQA 8, so that case also takes the split-keys decode path."""
    return (8, 1) if gqa == 8 else (2 * gqa, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("gqa", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 80])
def test_decode_matches_twin(request, head_dim, gqa, dtype):
    # Lengths cross page boundaries and sit exactly on them; one sequence has a single token.
    args = paged_case(generator(request), [1, 16, 17, 140], [1] * 4, *heads(gqa), head_dim, dtype)
    check(args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("gqa", [1, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_matches_twin(request, head_dim, gqa, dtype):
    # Ragged: a whole prompt, a decode row, a chunk after cached pages that crosses a page boundary.
    seq_lens, query_lens = [12, 17, 35], [12, 1, 30]
    check(paged_case(generator(request), seq_lens, query_lens, *heads(gqa), head_dim, dtype))


def test_decode_split_over_many_pages(request):
    """One long sequence: the keys are split over several programs and merged, the sink counted once."""
    args = paged_case(generator(request), [700], [1], 8, 1, 128, torch.float32)
    assert attention._num_splits(1, 700, args[0].device, 64)[0] > 1
    check(args)


@pytest.mark.parametrize("window", [7, 50])
@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 30, 5]], ids=["decode", "prefill"])
def test_sliding_window(request, query_lens, window):
    # 300 keys split in two: with a window of 7 or 50 the first split sees no key, only the sink
    args = paged_case(generator(request), [300, 100, 37], query_lens, 4, 2, 64, torch.float32)
    check(args, window)


@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 30, 5]], ids=["decode", "prefill"])
@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("kv_format", FORMATS)
def test_quantized_pages_match_twin(request, kv_format, head_dim, query_lens):
    seq_lens = [300, 40, 37]
    check(paged_case(generator(request), seq_lens, query_lens, 4, 2, head_dim, kv_format))


def test_quantized_pages_window_and_bfloat16_queries(request):
    q, *rest = paged_case(generator(request), [300, 40, 37], [1, 30, 5], 8, 2, 64, "q4")
    check((q.to(torch.bfloat16), *rest), window=20)


@pytest.mark.parametrize("kind", [torch.float32, "q8"], ids=str)
@pytest.mark.parametrize("query_lens", [[1, 1], [20, 3]], ids=["decode", "prefill"])
def test_a_sink_far_above_the_scores_takes_all_the_weight(request, query_lens, kind):
    g = generator(request)
    for sink, most in ((60.0, 1e-20), (1e4, 0.0)):
        args = paged_case(g, [200, 40], query_lens, 4, 2, 64, kind, sinks=torch.full((4,), sink))
        assert check(args).abs().max().item() <= most


@pytest.mark.parametrize("sink", [-60.0, -1e4, float("-inf")])
@pytest.mark.parametrize("kind", [torch.float32, "q6"], ids=str)
@pytest.mark.parametrize("query_lens", [[1, 1], [20, 3]], ids=["decode", "prefill"])
def test_a_sink_far_below_the_scores_is_plain_attention(request, query_lens, kind, sink):
    args = paged_case(generator(request), [200, 40], query_lens, 4, 2, 64, kind, sinks=torch.full((4,), sink))
    got = check(args)
    plain = (triton_quant if isinstance(kind, str) else attention).paged_attention(*args[:8])  # without sinks
    torch.testing.assert_close(got, plain, rtol=1e-6, atol=1e-6)


CPU_DECLINE = """
import sys
import torch
from kernels.triton import candidates
cache = torch.zeros(2, 16, 2, 64)
q = torch.randn(2, 4, 64)
args = (q, cache, cache.clone(), torch.tensor([[0], [1]]), torch.tensor([3, 5]), (1, 1), (3, 5), 0.125, torch.zeros(4))
assert candidates.paged_attention_sinks(*args) is None
assert "triton" not in sys.modules, "a CPU call imported triton"
"""


def test_the_candidate_declines_cpu_tensors_without_importing_triton():
    run = subprocess.run([sys.executable, "-c", CPU_DECLINE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", [torch.bfloat16, "q6"], ids=str)
def test_the_candidate_on_cuda_takes_float_and_quantized_pages(request, kind):
    args = paged_case(generator(request), [3, 40], [1, 20], 4, 2, 64, kind)
    got = triton_kernels.paged_attention_sinks(*args)
    assert got is not None
    torch.testing.assert_close(got, attention_sinks.paged_attention_sinks(*args), rtol=0, atol=0)
    q, *rest, sinks = args
    assert triton_kernels.paged_attention_sinks(q, *rest, sinks[:3]) is None  # one sink per query head
    assert triton_kernels.paged_attention_sinks(q, *rest, sinks.cpu()) is None  # all on one device
    assert triton_kernels.paged_attention_sinks(q, *rest, sinks.bfloat16()) is not None  # widened to float32
