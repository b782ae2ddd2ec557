"""The C kernels' attention with learned sinks (gpt-oss; kernels/cpu/attention.py and kv_quant.py's
`paged_attention_sinks`) against the twin (kernels/torch_ref/attention.py's `paged_attention_sinks`).

Float caches (float32 within 1e-5, bfloat16 within 2e-2) and quantized ones (q8, q6, q4), decode steps and
prompts (cold, and chunks over a cached history), GQA groups 1 to 12, head sizes of the vector paths' instances
(64, 128), of their general forms (96) and of the portable path (24), plain and head-major layouts, sliding
windows; sinks far above the scores (the output goes to 0), far below (plain attention), and -inf (no sink: the
same bits as paged_attention). To the bit: a prompt's row equals its token decoded alone, beside other
sequences, and through a decode plan's binding (bind_decode with sinks), on float and quantized caches. The
portable build (TANDEM_CPU_KERNEL_ARCH=x86-64) runs the same tests in a child process, and so does the AVX2
build (x86-64-v3) on an AVX-512 CPU.
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

from kernels import dispatch, ops
from kernels.cpu import attention as cpu_attention
from kernels.cpu import build
from kernels.cpu import kv_quant as cpu_kv_quant
from kernels.torch_ref import attention as twin
from kernels.torch_ref import kv_quant

pytestmark = pytest.mark.skipif(
    any(build.load(name) is None for name in ("paged_decode", "paged_prefill", "paged_prefill_quant")),
    reason="no C compiler for the CPU kernels",
)

FORMATS = list(kv_quant.FORMATS)
SCALE = 0.125


def tolerance(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 2e-2


def float_cache(num_pages, page_size, hkv, d, dtype, head_major, g):
    if head_major:  # the CPU cache's memory: [pages, heads, slots, dim], seen as [pages, slots, heads, dim]
        return torch.randn(num_pages, hkv, page_size, d, generator=g).to(dtype).permute(0, 2, 1, 3)
    return torch.randn(num_pages, page_size, hkv, d, generator=g).to(dtype)


def quant_cache(num_pages, page_size, hkv, d, bits, g):
    """A quantized layer (head-major memory) holding random rows, an outlier channel as real keys have."""
    x = torch.randn(num_pages, hkv, page_size, d, generator=g)
    x[..., 3] *= 8
    return kv_quant.quantize(kv_quant.rotate(x), bits).permute(0, 2, 1, 3)


def caches(kind, num_pages, page_size, hkv, d, g, head_major=True):
    """(k_cache, v_cache): `kind` a float dtype or a quantized format's name."""
    if isinstance(kind, str):
        bits = kv_quant.FORMATS[kind]
        return quant_cache(num_pages, page_size, hkv, d, bits, g), quant_cache(num_pages, page_size, hkv, d, bits, g)
    return tuple(float_cache(num_pages, page_size, hkv, d, kind, head_major, g) for _ in range(2))


def module(kind):
    """The candidates' module for caches of `kind`."""
    return cpu_kv_quant if isinstance(kind, str) else cpu_attention


def candidate(kind):
    return module(kind).paged_attention_sinks


def padded(tables) -> torch.Tensor:
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables])


def random_sinks(hq, g) -> torch.Tensor:
    """Sinks of the scores' size (they matter), one large (most weight on it) and one small (none on it)."""
    sinks = torch.randn(hq, generator=g) * 2
    sinks[0], sinks[-1] = 6.0, -6.0
    return sinks


def check(kind, tables, lengths, query_lens, d=64, hq=9, hkv=3, window=None, sinks=None, head_major=True, seed=0):
    """The candidate against the twin; returns its output and arguments (q first)."""
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache = caches(kind, max(max(t) for t in tables) + 1, 16, hkv, d, g, head_major)
    q_dtype = kind if not isinstance(kind, str) else (torch.bfloat16 if hq % 2 else torch.float32)
    q = torch.randn(sum(query_lens), hq, d, generator=g).to(q_dtype)
    sinks = random_sinks(hq, g) if sinks is None else sinks
    args = (q, k_cache, v_cache, padded(tables), torch.tensor(lengths), query_lens, lengths, SCALE, sinks, window)
    got = candidate(kind)(*args)
    assert got is not None, "the C kernels declined a call they handle"
    want = twin.paged_attention_sinks(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = 1e-4 if isinstance(kind, str) and q_dtype == torch.float32 else tolerance(q_dtype)  # as test_kv_quant.py
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    return got, args


# (tables, lengths, query lens): decode steps over scattered and shared pages, then prompts: cold, a chunk after
# a cached history beside a decode row, and several at once
CALLS = {
    "decode": ([[7, 2, 5], [0], [3, 6]], [40, 1, 17], [1, 1, 1]),
    "decode shared pages": ([[0, 1, 2], [0, 1, 3], [0, 4]], [41, 48, 20], [1, 1, 1]),
    "prompt": ([[4, 1, 0, 2, 3, 5, 6, 7]], [125], [125]),
    "chunk beside a decode row": ([[5, 0, 7, 2, 9, 4], [1, 3]], [90, 29], [30, 1]),
    "several prompts": ([[3, 0, 9], [1, 2], [4, 5, 6, 7, 8]], [40, 17, 70], [40, 17, 64]),
}
KINDS = [torch.float32, torch.bfloat16, *FORMATS]


def kind_id(kind) -> str:
    return kind if isinstance(kind, str) else str(kind).removeprefix("torch.")


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("kind", KINDS, ids=kind_id)
def test_calls_match_the_twin(kind, call):
    check(kind, *CALLS[call])


@pytest.mark.parametrize(("d", "hq", "hkv"), [(64, 8, 8), (128, 8, 1), (64, 7, 1), (96, 6, 2), (64, 12, 1)])
@pytest.mark.parametrize("kind", [torch.float32, torch.bfloat16, "q6"], ids=kind_id)
def test_groups_and_head_sizes(kind, d, hq, hkv):
    check(kind, *CALLS["chunk beside a decode row"], d=d, hq=hq, hkv=hkv, seed=d + hq)


@pytest.mark.parametrize(("d", "hq", "hkv"), [(24, 6, 3), (8, 4, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=kind_id)
def test_portable_head_sizes(dtype, d, hq, hkv):
    check(dtype, *CALLS["chunk beside a decode row"], d=d, hq=hq, hkv=hkv, head_major=False)


@pytest.mark.parametrize("window", [1, 7, 64, 500])
@pytest.mark.parametrize("kind", [torch.float32, torch.bfloat16, "q8", "q4"], ids=kind_id)
def test_sliding_windows(kind, window):
    check(kind, *CALLS["chunk beside a decode row"], window=window, seed=window)
    check(kind, *CALLS["decode"], window=window, seed=window)


@pytest.mark.parametrize("kind", [torch.float32, "q8"], ids=kind_id)
def test_a_sink_far_above_the_scores_takes_all_the_weight(kind):
    # 60 over scores of a few units: keys' weights about e^-60, still normal floats; then far past float32's range
    got, _ = check(kind, *CALLS["chunk beside a decode row"], sinks=torch.full((9,), 60.0))
    assert got.abs().max() < 1e-20
    got, _ = check(kind, *CALLS["chunk beside a decode row"], sinks=torch.full((9,), 1e4))
    assert got.abs().max() < 1e-30


@pytest.mark.parametrize("sink", [-60.0, -1e4, float("-inf")])
@pytest.mark.parametrize("kind", [torch.float32, torch.bfloat16, "q4"], ids=kind_id)
def test_a_sink_far_below_the_scores_is_plain_attention(kind, sink):
    got, args = check(kind, *CALLS["chunk beside a decode row"], sinks=torch.full((9,), sink))
    without = module(kind).paged_attention(*args[:8], args[9])  # the same kernels without sinks
    if sink == float("-inf"):  # no sink at all: the rows start as plain attention's, so the same bits
        assert torch.equal(got, without)
    else:
        tol = 1e-6 if got.dtype == torch.float32 else 1e-2
        torch.testing.assert_close(got, without, atol=tol, rtol=tol)


def decode_rows(kind, args):
    """Each prompt row of a call as a decode step of its own: one call, a one-token sequence per row."""
    q, k_cache, v_cache, tables, _, query_lens, lengths, scale, sinks, window = args
    rows = [(i, n) for i, (count, end) in enumerate(zip(query_lens, lengths)) for n in range(end - count + 1, end + 1)]
    lens = [n for _, n in rows]
    row_tables = tables[[i for i, _ in rows]]
    return candidate(kind)(q, k_cache, v_cache, row_tables, torch.tensor(lens), [1] * len(rows), lens, scale, sinks,
                           window)  # fmt: skip


@pytest.mark.parametrize("window", [None, 24])
@pytest.mark.parametrize("kind", KINDS, ids=kind_id)
def test_a_prompts_rows_equal_its_tokens_decoded_one_at_a_time(kind, window):
    got, args = check(kind, *CALLS["several prompts"], window=window, seed=3)
    assert torch.equal(got, decode_rows(kind, args))
    got, args = check(kind, *CALLS["chunk beside a decode row"], window=window, seed=4)
    assert torch.equal(got, decode_rows(kind, args))


@pytest.mark.parametrize(("d", "hq", "hkv"), [(64, 8, 8), (128, 4, 2), (64, 7, 1), (96, 6, 2), (32, 16, 1)])
def test_quantized_prompt_rows_equal_decode_rows_for_every_group_and_head_size(d, hq, hkv):
    kind = FORMATS[(d + hq) % len(FORMATS)]
    got, args = check(kind, *CALLS["chunk beside a decode row"], d=d, hq=hq, hkv=hkv, window=37, seed=d * hq)
    assert torch.equal(got, decode_rows(kind, args))


@pytest.mark.parametrize("kind", [torch.float32, torch.bfloat16, "q6"], ids=kind_id)
def test_bind_decode_with_sinks_runs_what_the_candidate_runs(kind):
    # a decode plan's binding: float32 sinks read in place, each row the same bits as the call
    got, args = check(kind, *CALLS["decode"], window=20, seed=5)
    q, k_cache, v_cache, tables, lens, _, _, scale, sinks, window = args
    bind = module(kind).bind_decode
    out, q = torch.empty_like(got), q.to(got.dtype).contiguous()
    fn, bound = bind(q, k_cache, v_cache, out, tables, lens, scale, window, 2, sinks=sinks)
    assert fn(*bound) == 0
    assert torch.equal(out, got)
    strided = torch.stack([sinks, sinks], 1)[:, 0]
    for bad in (sinks.double(), sinks[:-1], strided):  # read in place: float32, one per head, contiguous
        assert bind(q, k_cache, v_cache, out, tables, lens, scale, window, 2, sinks=bad) is None


def test_declines_what_it_does_not_handle():
    g = torch.Generator().manual_seed(0)
    k_cache, v_cache = caches(torch.float32, 2, 16, 2, 64, g)
    q, sinks = torch.randn(1, 4, 64), torch.zeros(4)
    rest = (torch.tensor([[0, 1]]), torch.tensor([20]), [1], [20], SCALE)
    assert cpu_attention.paged_attention_sinks(q, k_cache, v_cache, *rest, sinks) is not None
    assert cpu_attention.paged_attention_sinks(q, k_cache, v_cache, *rest, torch.zeros(3)) is None  # one per head
    assert cpu_attention.paged_attention_sinks(q.half(), k_cache.half(), v_cache.half(), *rest, sinks) is None
    assert cpu_kv_quant.paged_attention_sinks(q, k_cache, v_cache, *rest, sinks) is None  # a float cache


def test_ops_take_the_c_kernels_on_the_cpu():
    chain = dispatch.candidates("paged_attention_sinks")
    assert cpu_attention.paged_attention_sinks in chain and cpu_kv_quant.paged_attention_sinks in chain
    assert chain.index(cpu_attention.paged_attention_sinks) < chain.index(twin.paged_attention_sinks)
    for kind in (torch.bfloat16, "q8"):
        _, args = check(kind, *CALLS["chunk beside a decode row"], seed=6)
        assert torch.equal(ops.paged_attention_sinks(*args), candidate(kind)(*args))


@pytest.mark.skipif(shutil.which("cc") is None or platform.machine() != "x86_64", reason="needs cc on x86-64")
@pytest.mark.parametrize("arch", ["x86-64-v3", "x86-64"])
def test_the_other_builds_pass_the_same_tests(arch):
    """The AVX2 path (x86-64-v3; on an AVX2 CPU it is the native build above) and the plain C loops (x86-64): the
    twin and every bit-identity above, in a child process that loads that build alone."""
    if os.environ.get("TANDEM_CPU_KERNEL_ARCH"):
        pytest.skip("already the child")
    if arch == "x86-64-v3" and "avx512f" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("the native build is the AVX2 one")
    env = {**os.environ, "TANDEM_CPU_KERNEL_ARCH": arch}
    tests = "calls_match or groups or portable or windows or far or one_at_a_time or every_group or bind_decode"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__, "-k", tests],
        capture_output=True, text=True, timeout=900, env=env, cwd=Path(__file__).parents[3],
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout
