"""The block kernels' other paths, each built for a lesser CPU on this one and run against its twin: the same
tests as test_cpu_blocks.py, in a child process so the other build is loaded there and nowhere else.
TANDEM_CPU_KERNEL_ARCH=x86-64-v3 (AVX2 without AVX-512, most laptops) takes the AVX2 8-bit paths of both
kernels (block32_avx2.h, kquant_avx2.h); x86-64 (SSE2 only) takes their plain C loops. On a CPU with
AVX512-VNNI the AVX2 paths must also give the AVX-512 paths' outputs to the bit where they share their arithmetic
(the 32-value types, Q2_K, Q3_K, IQ4_XS), and within rounding where the AVX2 path scales Q4_K, Q5_K and Q6_K's
sub-blocks in int32 (one float multiply-add per super-block, the VNNI path one per sub-block).
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

HERE = Path(__file__).parent
pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None or platform.machine() != "x86_64", reason="needs cc on x86-64"
)


def child(arch: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TANDEM_CPU_KERNEL_ARCH": arch}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=600, env=env, cwd=HERE.parents[2]
    )


@pytest.mark.parametrize("arch", ["x86-64-v3", "x86-64"])
def test_other_paths_match_their_twin(arch):
    tests = ["test_rows_match_ggufs_dequantization", "test_each_row_is_computed_as_if_alone", "test_shapes"]
    done = child(
        arch, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "test_blocks.py"), "-k",
        " or ".join(tests),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout  # the kernels were built and ran


OUTPUTS = """
import sys, torch
sys.path.insert(0, "tests/kernels")
from test_cpu_blocks import TYPES, linear, random_blocks
from kernels.cpu import blocks
x = torch.randn(13, 512, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)  # 2 super-blocks
x[2, 64:96] = 0  # a block of zeros (dx = 0 for the 32-value types)
x[5, 256:] = 0  # a super-block of zeros (dx = 0 for the K-quants)
out = {t: (blocks.path(blocks.kernel_type(t)), linear(x, random_blocks(48, 512, t, 9), t)) for t in TYPES}
torch.save(out, sys.argv[1])
"""


INTEGER_SCALED = ("Q4_K", "Q5_K", "Q6_K")  # kquant_avx2.h's sub-block scales in int32


@pytest.mark.skipif("avx512_vnni" not in Path("/proc/cpuinfo").read_text(), reason="needs an AVX512-VNNI CPU")
def test_avx2_path_gives_the_avx512_paths_outputs_to_the_bit(tmp_path):
    outputs = {}
    for arch in ("native", "x86-64-v3"):
        done = child(arch, "-c", OUTPUTS, str(tmp_path / arch))
        assert done.returncode == 0, done.stderr[-2000:]
        outputs[arch] = torch.load(tmp_path / arch)
    for type_name, (path, native) in outputs["native"].items():
        avx2_path, avx2 = outputs["x86-64-v3"][type_name]
        assert (path, avx2_path) == (2, 1)
        if type_name in INTEGER_SCALED:
            # the same exact int32 sums, added in float in another order: bf16 outputs a rounding step apart
            allowed = 2**-7 * native.float().abs() + 1e-4 * native.float().abs().max()
            assert ((native.float() - avx2.float()).abs() <= allowed).all(), type_name
        else:
            assert torch.equal(native, avx2), type_name
