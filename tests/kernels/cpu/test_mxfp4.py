"""MXFP4 weights (gpt-oss's experts) through the C block kernel (block32_matmul.c, repacked "MXFP4x16") and the
ops that hold them, against gguf's own dequantization.

Tried: blocks gguf's quantizer wrote and random valid blocks (every code, seven exponents), 1 to 70 rows of x
(the 8-row tiles with remainders, a decode step's single row), 16 to 2880 weight rows (gpt-oss's 2880 is 180
groups of 16) and 32 to 2880 values a row (odd block counts), 3-D x, a bias, blocks of x that are all zero, the
largest integer sums, each row's result against the row alone, an expert's rows sliced from a stack of experts,
`ops.block_rows` lookups, float32 x (the twin), and a GGUF file gguf's writer wrote loading packed. The 8-bit
paths (AVX2 here, AVX512-VNNI where the CPU has it) are held to x quantized as their twin
(gguf_blocks.linear_q8) quantizes it, the portable C loop (TANDEM_CPU_KERNEL_ARCH=x86-64) to x as it is; the
AVX-512 path must give the AVX2 path's outputs to the bit, and is at least compiled on a CPU without it.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kernels import ops
from kernels.cpu import blocks as cpu_blocks
from kernels.cpu import build
from kernels.torch_ref import gguf_blocks

HERE = Path(__file__).parent
MXFP4 = gguf.GGMLQuantizationType.MXFP4


def quantized_blocks(num_rows: int, num_cols: int, seed: int) -> torch.Tensor:
    """Random weights [num_rows, num_cols] as gguf's quantizer writes them: rows of MXFP4 blocks."""
    values = np.random.default_rng(seed).standard_normal((num_rows, num_cols)).astype(np.float32) * 0.05
    return torch.from_numpy(gguf.quants.quantize(values, MXFP4))


def gguf_weight(blocks: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(blocks.numpy(), MXFP4)).float()


def linear(x, blocks, bias=None):
    """The kernel on the file's blocks packed as it reads them."""
    tiles, kernel_type = cpu_blocks.pack(blocks, "MXFP4")
    assert kernel_type == "MXFP4x16" and tiles.shape == (blocks.shape[0] // 16, 16 * blocks.shape[1])
    return cpu_blocks.linear(x, tiles, kernel_type, bias)


pytestmark = pytest.mark.skipif(
    linear(torch.ones(1, 32, dtype=torch.bfloat16), gguf_blocks.random_blocks(16, 32, "MXFP4", 0)) is None,
    reason="needs a C compiler",
)


def check(got, x, weight, bias=None):
    """As tests/kernels/cpu/test_blocks.py checks the other types: float32 sums in another order than float64's,
    one bf16 rounding of the product (2^-8 relative) and, with a bias, one of the sum."""
    if cpu_blocks.path("MXFP4x16") > 0:  # the 8-bit paths multiply x as their twin quantizes it
        x = gguf_blocks.quantize_activations(x, 32)
    product = F.linear(x.double(), weight.double())
    want = product if bias is None else product + bias.double()
    assert got is not None and got.dtype == torch.bfloat16 and got.shape == want.shape
    allowed = 2**-7 * want.abs() + 2**-8 * product.abs() + 1e-4 * want.abs().max()
    assert ((got.double() - want).abs() <= allowed).all(), (got.double() - want).abs().max()


@pytest.mark.parametrize("rows", [1, 2, 7, 8, 9, 16, 31, 70])
@pytest.mark.parametrize("written_by", ["gguf", "random"])
def test_rows_match_ggufs_dequantization(rows, written_by):
    if written_by == "gguf":
        blocks = quantized_blocks(96, 512, rows)
    else:
        blocks = gguf_blocks.random_blocks(96, 512, "MXFP4", rows)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
    check(linear(x, blocks), x, gguf_weight(blocks))


@pytest.mark.parametrize(("num_rows", "num_cols"), [(16, 32), (48, 96), (80, 576), (2880, 2880)])
def test_shapes(num_rows, num_cols):
    blocks = gguf_blocks.random_blocks(num_rows, num_cols, "MXFP4", num_cols)
    x = torch.randn(2, 3, num_cols, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    x[0, 1, :32] = 0  # a block of zeros quantizes to dx = 0
    bias = torch.randn(num_rows, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    check(linear(x, blocks, bias), x, gguf_weight(blocks), bias)


def test_each_row_is_computed_as_if_alone():
    blocks = gguf_blocks.random_blocks(64, 1024, "MXFP4", 5)
    x = torch.randn(20, 1024, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    together = linear(x, blocks)
    for row in (0, 7, 8, 19):
        assert torch.equal(linear(x[row : row + 1], blocks)[0], together[row])


@pytest.mark.parametrize("code", [0x77, 0xFF, 0x7F])
def test_the_largest_integer_sums_stay_exact(code):
    """Every code at level 12 (0x77), -12 (0xFF) or both, and x all +-1 so that every int8 of xq is +-127: the
    AVX2 path adds eight quads' int16 pairs (up to 8 * 2 * 12 * 127) before widening, where an overflow would
    wrap."""
    blocks = gguf_blocks.random_blocks(32, 512, "MXFP4", 11)
    blocks.view(-1, 17)[:, 1:] = code
    x = torch.ones(3, 512, dtype=torch.bfloat16)
    x[1] = -1
    x[2, 1::2] = -1
    check(linear(x, blocks), x, gguf_weight(blocks))


def test_the_ops_keep_mxfp4_packed():
    assert ops.can_keep_blocks("MXFP4", "cpu", torch.bfloat16, 2880, 2880)
    assert ops.can_keep_blocks("MXFP4", "cpu", torch.bfloat16, 2880, 5760)  # a gate and up projection
    assert not ops.can_keep_blocks("MXFP4", "cpu", torch.float32, 2880, 2880)  # float32 goes through the twin
    assert not ops.can_keep_blocks("MXFP4", "cpu", torch.bfloat16, 48, 64)  # not whole blocks
    assert not ops.can_keep_blocks("MXFP4", "cpu", torch.bfloat16, 64, 40)  # not whole groups of 16 rows
    blocks = gguf_blocks.random_blocks(48, 96, "MXFP4", 6)
    tiles, type_name = ops.pack_blocks(blocks, "MXFP4")
    assert type_name == "MXFP4x16" and tiles.numel() == blocks.numel()
    assert ops.block_num_rows(tiles, type_name) == 48
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    bias = torch.randn(48, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    got = ops.linear_blocks(x, tiles, type_name, bias)
    assert torch.equal(got, cpu_blocks.linear(x, tiles, type_name, bias))
    check(got, x, gguf_weight(blocks), bias)
    x32 = x.float()  # no float32 kernel: the twin, on the file's blocks or the tiles alike
    assert torch.equal(ops.linear_blocks(x32, tiles, type_name), gguf_blocks.linear(x32, blocks, "MXFP4"))
    assert torch.equal(ops.linear_blocks(x32, blocks, "MXFP4"), gguf_blocks.linear(x32, blocks, "MXFP4"))


def test_block_rows_and_an_experts_slice():
    """Lookups of single rows (ops.block_rows), and one expert's weight out of a stack of experts' rows: its
    groups of 16 rows are a contiguous slice of the stack's tiles."""
    num_experts, num_out, num_cols = 4, 32, 96
    blocks = gguf_blocks.random_blocks(num_experts * num_out, num_cols, "MXFP4", 8)
    tiles, type_name = ops.pack_blocks(blocks, "MXFP4")
    ids = torch.tensor([0, 127, 33, 33, 64])
    rows, row_type = ops.block_rows(tiles, type_name, ids)
    assert row_type == "MXFP4" and torch.equal(rows, blocks[ids])
    assert torch.equal(ops.dequantize_blocks(rows, row_type, num_cols), gguf_weight(blocks)[ids])
    x = torch.randn(3, num_cols, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    per_expert = num_out // 16
    for expert in range(num_experts):
        own = tiles[expert * per_expert : (expert + 1) * per_expert]
        alone = linear(x, blocks[expert * num_out : (expert + 1) * num_out])
        assert torch.equal(ops.linear_blocks(x, own, type_name), alone)


def test_a_gguf_file_with_mxfp4_loads_packed(tmp_path):
    from engine.gguf import tensors
    from engine.models.linear import Linear

    blocks = quantized_blocks(48, 96, 9)
    writer = gguf.GGUFWriter(tmp_path / "experts.gguf", "gpt-oss")
    writer.add_tensor("blk.0.ffn_down.weight", blocks.numpy(), raw_dtype=MXFP4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (t,) = gguf.GGUFReader(tmp_path / "experts.gguf").tensors
    assert t.tensor_type == MXFP4 and tensors.can_dequantize(t.tensor_type)
    tensors.check_types(tmp_path, [t], gguf)
    weight = tensors.block_weight(t, torch.bfloat16)
    assert weight.shape == (48, 96) and torch.equal(weight.parts[0][0], blocks)
    packed = tensors.packed(weight, t)
    assert [type_name for _, type_name in packed.parts] == ["MXFP4x16"]
    layer = Linear(96, 48, bias=False)
    layer.load_blocks(packed)
    assert layer.block_types == ["MXFP4x16"]
    x = torch.randn(2, 96, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    check(layer(x), x, gguf_weight(blocks))
    assert torch.equal(tensors.dequantize(t, gguf), gguf_weight(blocks))


# ------------------------------------------------------------------------------------ the other CPU paths

KERNEL_TESTS = "test_rows_match_ggufs_dequantization or test_shapes or test_each_row_is_computed_as_if_alone"
on_x86 = pytest.mark.skipif(shutil.which("cc") is None or platform.machine() != "x86_64", reason="needs cc on x86-64")


def child(arch: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TANDEM_CPU_KERNEL_ARCH": arch}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=600, env=env, cwd=HERE.parents[2]
    )


@on_x86
@pytest.mark.parametrize("arch", ["x86-64-v3", "x86-64"])
def test_other_paths_match_their_twin(arch):
    """The AVX2 8-bit path and the portable loop, each built for a lesser CPU on this one, in a child process."""
    done = child(arch, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", KERNEL_TESTS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout  # the kernels were built and ran


OUTPUTS = """
import sys, torch
from kernels.cpu import blocks
from kernels.torch_ref import gguf_blocks
x = torch.randn(13, 512, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
x[2, 64:96] = 0
tiles, kernel_type = blocks.pack(gguf_blocks.random_blocks(48, 512, "MXFP4", 9), "MXFP4")
torch.save((blocks.path(kernel_type), blocks.linear(x, tiles, kernel_type)), sys.argv[1])
"""


@on_x86
@pytest.mark.skipif("avx512_vnni" not in Path("/proc/cpuinfo").read_text(), reason="needs an AVX512-VNNI CPU")
def test_avx2_path_gives_the_avx512_paths_outputs_to_the_bit(tmp_path):
    outputs = {}
    for arch in ("native", "x86-64-v3"):
        done = child(arch, "-c", OUTPUTS, str(tmp_path / arch))
        assert done.returncode == 0, done.stderr[-2000:]
        outputs[arch] = torch.load(tmp_path / arch)
    assert (outputs["native"][0], outputs["x86-64-v3"][0]) == (2, 1)
    assert torch.equal(outputs["native"][1], outputs["x86-64-v3"][1])


@on_x86
def test_the_avx512_path_compiles(tmp_path):
    """Where the CPU has no AVX-512 the path is not run, but it must still build for the CPUs that have it."""
    source = Path(build.__file__).parent / "block32_matmul.c"
    command = ["cc", *build.FLAGS, "-march=icelake-server", "-fopenmp", "-c", "-o", str(tmp_path / "b.o")]
    done = subprocess.run([*command, str(source)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
