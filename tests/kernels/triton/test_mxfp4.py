"""MXFP4 in the Triton GGUF-block matmul (kernels/triton/gguf_unpack.py), on a GPU where there is one, else in
triton's interpreter: every exponent and code unpacked to gguf's own values, to the bit. (The products and
shapes every type goes through, MXFP4 among them, are tests/kernels/triton/test_gguf_matmul.py's.)

x is the identity, so each output is one weight times 1 plus zeros: exact in float32 whatever the order of the
sums, and so equal to the weight itself. Exponents 2 .. 252: below 2 the scale is subnormal (which a GPU may
flush to zero), above 252 a level of 12 overflows float32.
"""

from __future__ import annotations

import pytest
import torch

from kernels.triton import launch  # does not import triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    launch.use_interpreter()  # before triton is imported: it picks the interpreter at import
pytest.importorskip("triton", reason="triton is not installed: the Triton kernels are tested only where it is")

import gguf  # noqa: E402

from kernels.torch_ref import gguf_blocks  # noqa: E402
from kernels.triton import candidates as triton_kernels  # noqa: E402
from kernels.triton import gguf_matmul  # noqa: E402


@pytest.mark.parametrize("rows", [1, 4, 256], ids=["gemv-1", "gemv-4", "dot"])
def test_every_exponent_and_code_unpacks_to_ggufs_values(rows):
    generator = torch.Generator().manual_seed(rows)
    blocks = torch.randint(0, 256, (32 * 8, 17), dtype=torch.uint8, generator=generator)  # 32 rows of 8 blocks
    blocks[:, 0] = torch.arange(blocks.shape[0]) % 251 + 2
    blocks = blocks.reshape(32, 8 * 17)
    weight = torch.from_numpy(gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType.MXFP4))
    assert torch.isfinite(weight).all()
    x = torch.eye(256)[:rows]  # rows of x pick columns of the weight
    got = gguf_matmul.linear(x.to(DEVICE), blocks.to(DEVICE), "MXFP4").cpu()
    assert torch.equal(got, weight[:, :rows].T)


def test_the_dispatch_candidate_takes_mxfp4():
    assert triton_kernels.blocks_supported("MXFP4", "cuda", torch.bfloat16, 2880, 2880) == triton_kernels.is_available()
    assert not triton_kernels.blocks_supported("MXFP4", "cuda", torch.bfloat16, 48, 16)  # not whole blocks
    x = torch.randn(2, 64, dtype=torch.bfloat16, device=DEVICE)
    blocks = gguf_blocks.random_blocks(16, 64, "MXFP4", 1).to(DEVICE)
    assert (triton_kernels.linear_blocks(x, blocks, "MXFP4") is not None) == (DEVICE == "cuda")
    assert triton_kernels.linear_blocks(x, blocks, "MXFP4x16") is None  # a CPU layout
