"""A mixture-of-experts layer whose experts stay in GGUF blocks, multiplied by the Triton GGUF-block matmul (on a
GPU where there is one, else in triton's interpreter): each expert's matmul reads its own rows of the layer's
blocks (a view), and the layer's output is the same layer's with the experts dequantized by gguf to floats.

Tried: Q4_K (a K-quant) and MXFP4 (gpt-oss) experts, 6 experts of which each token takes 2, 7 tokens (so some
experts get several rows, some one, some none), and a decode step of one token."""

from __future__ import annotations

import pytest
import torch

from kernels.triton import launch  # does not import triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    launch.use_interpreter()  # before triton is imported: it picks the interpreter at import
pytest.importorskip("triton", reason="triton is not installed: the Triton kernels are tested only where it is")

import gguf  # noqa: E402

from engine.models.moe import SparseMoE  # noqa: E402
from kernels import ops  # noqa: E402
from kernels.torch_ref import gguf_blocks  # noqa: E402
from kernels.triton import gguf_matmul  # noqa: E402

EXPERTS, TOP_K, HIDDEN, WIDTH = 6, 2, 256, 256  # K-quant rows are 256 values: both are some rows' lengths


def _layer(type_name: str, seed: int) -> tuple[SparseMoE, SparseMoE]:
    """The same layer twice: experts in `type_name` blocks, and dequantized (gguf's own) to float32."""
    torch.manual_seed(seed)
    in_blocks = SparseMoE(HIDDEN, EXPERTS, TOP_K, WIDTH, norm_topk_prob=True)
    in_floats = SparseMoE(HIDDEN, EXPERTS, TOP_K, WIDTH, norm_topk_prob=True)
    in_floats.gate.weight.data = in_blocks.gate.weight.data = torch.randn(EXPERTS, HIDDEN)
    for name, (rows, cols) in (("experts_gate_up", (2 * WIDTH, HIDDEN)), ("experts_down", (HIDDEN, WIDTH))):
        blocks = gguf_blocks.random_blocks(EXPERTS * rows, cols, type_name, seed)
        values = gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType[type_name])
        kept = getattr(in_blocks, name)
        kept.weight = None
        kept.register_buffer("blocks0", blocks.to(DEVICE))
        kept.block_types = [type_name]
        getattr(in_floats, name).weight = torch.from_numpy(values).float().reshape(EXPERTS, rows, cols).to(DEVICE)
    return in_blocks.to(DEVICE), in_floats.to(DEVICE)


@pytest.mark.parametrize("type_name", ["Q4_K", "MXFP4"])
@pytest.mark.parametrize("tokens", [7, 1], ids=["prompt", "decode"])
def test_experts_in_blocks_give_the_dequantized_layers_output(type_name, tokens, monkeypatch):
    called = []

    def triton_linear(x, blocks, name, bias=None):
        called.append(blocks.shape[0])
        return gguf_matmul.linear(x, blocks, name, bias)

    monkeypatch.setattr(ops, "linear_blocks", triton_linear)
    in_blocks, in_floats = _layer(type_name, seed=tokens)
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    want = in_floats(x)
    got = in_blocks(x)
    # each call read one expert's rows: 2 * WIDTH of gate and up, then HIDDEN of down
    assert called and set(called) == {2 * WIDTH, HIDDEN} and len(called) <= 2 * min(EXPERTS, TOP_K * tokens)
    # float32 sums in another order over 256-long rows of large random values (the outputs reach hundreds)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5 * want.abs().max().item())
