"""GGUF block-quantized weights stay in their blocks, repacked 16 rows at a time (engine/models/linear.py
BlockWeight, embedding.py, kernels/torch_ref/gguf_repack.py).

Tried: a Q4_K llama with a Q6_K v projection beside Q4_K q and k (llama.cpp's Q4_K_M mix, so the fused qkv
holds two types, q and k joined), Q5_K, Q2_K, Q3_K and IQ4_XS beside other K-quants, ggml's six 32-value types, tied and untied heads, a vocabulary whose
odd size is no whole number of 16-row groups (its table expanded), float32 (expanded: the kernels read
bfloat16 x only). Q4_K_M, Q4_0 and Q8_0 files from tools/make_bench_model.py give logits close to the same
file expanded to bfloat16 at load, with the tied head sharing the table's buffer; resident memory after
loading a 105 MB file stays within the file's size + 150 MB.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import Cache, Model
from engine.models.batch import Batch
from kernels.cpu import blocks as cpu_blocks

LLAMA = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
PROMPT = [3, 9, 12, 18, 21, 5, 7]
TINY_BENCH = {
    "hidden": 256,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 64,
    "ffn_hidden": 512,
    "context_length": 2048,
}

# tools/ is not a package: load the benchmark model writer by its path.
_SPEC = importlib.util.spec_from_file_location(
    "make_bench_model", Path(__file__).resolve().parents[3] / "tools" / "make_bench_model.py"
)
bench_model = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench_model  # its dataclasses look their module up there
_SPEC.loader.exec_module(bench_model)

pytestmark = pytest.mark.skipif(
    not cpu_blocks.supports("Q4_K", "cpu", torch.bfloat16, 256, 16), reason="needs a C compiler for the block kernels"
)


def q4_k_m(gguf_kit, tied: bool):
    """Q4_K everywhere, with Q6_K v, down and embeddings (and head, when untied) as llama.cpp's Q4_K_M does."""
    model = gguf_kit.model("LlamaForCausalLM", tie_word_embeddings=tied, **LLAMA)
    raw = {"blk.0.attn_v.weight": "Q6_K", "blk.1.ffn_down.weight": "Q6_K", "token_embd.weight": "Q6_K"}
    if not tied:
        raw["output.weight"] = "Q6_K"
    return gguf_kit.write(model, "Q4_K", raw_types=raw)


def logits(model: Model, ids: list[int]) -> torch.Tensor:
    cache = Cache(model, max_seq_len=64, page_size=16)
    batch = Batch.build(cache, [[0, 1, 2, 3]], [0], [len(ids)], logits=[list(range(len(ids)))])
    with torch.inference_mode():
        return model(torch.tensor(ids, device=model.device), batch.positions(), batch).float().cpu()


@pytest.mark.parametrize("tied", [True, False])
def test_k_quants_stay_in_their_blocks_and_compute_what_the_expanded_weights_do(gguf_kit, tied):
    written = q4_k_m(gguf_kit, tied)
    model = Model.load(written.path)  # bfloat16 on the CPU: the default
    layer = model.model.layers[0]
    # repacked 16 rows at a time; q and k (both Q4_K) joined into one tensor beside v's Q6_K
    assert layer.self_attn.qkv_proj.block_types == ["Q4_Kx16", "Q6_Kx16"]
    assert model.model.layers[1].mlp.down_proj.block_types == ["Q6_Kx16"]
    assert layer.mlp.gate_up_proj.block_types == ["Q4_Kx16"]
    # the tiny vocabulary's odd size is no whole number of 16-row groups: its table (and head) are expanded;
    # a real vocabulary's stay in blocks, the head sharing them (test_logits_match_the_weights_expanded_at_load)
    assert model.model.embed_tokens.blocks is None and not model.lm_head.block_types
    projections = [m for n, m in model.named_modules() if n.endswith("_proj")]
    assert all(m.block_types for m in projections) and not any(hasattr(m, "weight") for m in projections)
    # every projection is held as the file's bytes, repacked: no more than the file's tensors
    file_bytes = sum(a.nbytes for a in written.written.values())
    assert sum(b.numel() for m in projections for b in m.buffers()) <= file_bytes
    expanded = Model.load(written.path, quantized=None)
    assert expanded.dtype == torch.bfloat16 and not expanded.model.layers[0].self_attn.qkv_proj.block_types
    ids = torch.tensor(PROMPT)
    assert torch.equal(model.embed(ids), expanded.embed(ids))


@pytest.mark.parametrize(
    ("kind", "qkv"), [("Q4_K_M", ["Q4_Kx16", "Q6_Kx16"]), ("Q4_0", ["Q4_0x16"]), ("Q8_0", ["Q8_0x16"])]
)
def test_logits_match_the_weights_expanded_at_load(tmp_path, starter_gguf, kind, qkv):
    # A file with a trained model's weight scale (tools/make_bench_model.py), where activations stay O(1), so
    # the kernels' 8-bit activations are a small error, not an amplified one as in a random net.
    path = tmp_path / f"tiny-{kind}.gguf"
    bench_model.write_bench_model(path, kind, num_layers=2, tokenizer_gguf=starter_gguf, **TINY_BENCH)
    ours, theirs = Model.load(path), Model.load(path, quantized=None)
    assert ours.model.layers[1].self_attn.qkv_proj.block_types == qkv
    # the tied head reads the table's repacked blocks: one buffer, no copy; lookups unpack only their rows
    assert ours.lm_head.blocks0.data_ptr() == ours.model.embed_tokens.blocks.data_ptr()
    ids = torch.tensor(PROMPT)
    assert torch.equal(ours.embed(ids), theirs.embed(ids))
    got, want = logits(ours, PROMPT), logits(theirs, PROMPT)
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.05 * want.abs().max().item())
    # each position's choice is the expanded model's or ties with it within that tolerance
    chosen = want.gather(-1, got.argmax(-1, keepdim=True)).squeeze(-1)
    assert torch.all(chosen >= want.amax(-1) - 0.05 * want.abs().max())


def test_float32_expands_k_quants(gguf_kit):
    model = Model.load(q4_k_m(gguf_kit, tied=True).path, dtype=torch.float32)
    assert not model.model.layers[0].self_attn.qkv_proj.block_types and model.model.embed_tokens.blocks is None


MEASURE = """
import sys, torch
from engine import Model
from kernels import ops

def status(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key)) // 1024

ops.prepare_cpu_kernels()
open("/proc/self/clear_refs", "w").write("5")  # restart the peak (VmHWM) from here
before = status("VmRSS:")
model = Model.load(sys.argv[1])
print(before, status("VmRSS:"), status("VmHWM:"))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("qtype", ["Q4_K", "Q4_0"])
def test_resident_memory_after_loading_is_about_the_file(gguf_kit, qtype):
    # Three layers of Llama-3.2-1B's shape in Q4_K_M's mix, or all Q4_0 (repacked at load: a copy, whose
    # source pages must leave the process as it goes): about 105 MB of blocks, 362 MB expanded to bfloat16,
    # so a load that expanded them, or kept both copies, would break the bound below.
    shape = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=3, num_attention_heads=32)
    model = gguf_kit.model("LlamaForCausalLM", tie_word_embeddings=True, **dict(LLAMA, **shape, num_key_value_heads=8))
    raw = {f"blk.{i}.{n}.weight": "Q6_K" for i in (0, 2) for n in ("attn_v", "ffn_down")}
    if qtype == "Q4_K":
        written = gguf_kit.write(model, "Q4_K", raw_types={**raw, "token_embd.weight": "Q6_K"})
    else:
        written = gguf_kit.write(model, "Q4_0")
    del model
    file_mib = written.path.stat().st_size / 2**20
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(written.path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    before, after, peak = (int(v) for v in done.stdout.split())
    # the bound: what the process held before + the file + 150 MB (no KV cache is made here)
    assert after - before <= file_mib + 150, (before, after, file_mib)
    assert peak - before <= file_mib + 150, (before, peak, file_mib)


def test_q5_k_stays_in_its_blocks(gguf_kit):
    # Q5_K_M files: Q5_K beside Q6_K, both read by the kernel
    model = gguf_kit.model("LlamaForCausalLM", tie_word_embeddings=True, **LLAMA)
    written = gguf_kit.write(model, "Q5_K", raw_types={"blk.1.attn_v.weight": "Q6_K"})
    ours = Model.load(written.path)
    assert ours.model.layers[1].self_attn.qkv_proj.block_types == ["Q5_Kx16", "Q6_Kx16"]
    ids = torch.tensor(PROMPT)
    assert torch.equal(ours.embed(ids), Model.load(written.path, quantized=None).embed(ids))
    assert torch.isfinite(logits(ours, PROMPT)).all()


@pytest.mark.parametrize(("qtype", "head"), [("Q2_K", "Q4_K"), ("Q3_K", "Q5_K"), ("IQ4_XS", "Q6_K")])
def test_low_bit_k_quants_stay_in_their_blocks(gguf_kit, qtype, head):
    # Q2_K and Q3_K files (llama.cpp's Q2_K, Q3_K_S/M/L mixes put Q4_K/Q5_K/Q6_K beside them) and IQ4_XS:
    # every projection read by the kernel in its blocks, whatever type each part has
    model = gguf_kit.model("LlamaForCausalLM", tie_word_embeddings=False, **LLAMA)
    written = gguf_kit.write(model, qtype, raw_types={"blk.0.attn_v.weight": head, "blk.1.ffn_down.weight": head})
    ours = Model.load(written.path)
    assert ours.model.layers[0].self_attn.qkv_proj.block_types == [qtype + "x16", head + "x16"]
    assert ours.model.layers[1].mlp.down_proj.block_types == [head + "x16"]
    assert ours.model.layers[0].mlp.down_proj.block_types == [qtype + "x16"]
    expanded = Model.load(written.path, quantized=None)
    ids = torch.tensor(PROMPT)
    assert torch.equal(ours.embed(ids), expanded.embed(ids))
    ours_logits, want = logits(ours, PROMPT).float(), logits(expanded, PROMPT).float()
    assert torch.isfinite(ours_logits).all()
    # x quantized to 8 bits per 256 values (the kernels' path) against exact bfloat16 products: close, not equal
    assert torch.nn.functional.cosine_similarity(ours_logits.flatten(), want.flatten(), dim=0) > 0.99


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL"])
def test_32_value_block_types_stay_in_their_blocks_repacked(gguf_kit, qtype):
    # ggml's 32-value types keep their bytes, repacked 16 rows at a time (the same size); rows of any whole
    # number of blocks (here 256 and 512 values; the starter's 576 in test_int4.py). The tiny vocabulary's odd
    # size is no whole number of 16-row groups, so its table and tied head take the fallback (expanded, or
    # torch's int4 form); the starter's tied head shares the table's tiles (test_int4.py).
    model = gguf_kit.model("LlamaForCausalLM", tie_word_embeddings=True, **LLAMA)
    written = gguf_kit.write(model, qtype)  # IQ4_NL: valid random blocks (gguf cannot quantize to it)
    ours = Model.load(written.path)
    packed = qtype + "x16"
    assert ours.model.layers[0].self_attn.qkv_proj.block_types == [packed]  # q, k and v joined
    assert ours.model.layers[0].mlp.down_proj.block_types == [packed]  # 512 columns
    assert ours.model.embed_tokens.blocks is None and not ours.lm_head.block_types
    expanded = Model.load(written.path, quantized=None)
    ids = torch.tensor(PROMPT)
    assert torch.equal(ours.embed(ids), expanded.embed(ids))
    assert torch.isfinite(logits(ours, PROMPT)).all()  # closeness: test_logits_match_the_weights_expanded_at_load


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("qtype", ["Q4_K", "Q4_0", "Q8_0", "IQ4_XS"])
def test_on_a_gpu_the_projections_keep_the_files_blocks(gguf_kit, qtype):
    # The Triton matmul (kernels/triton/gguf_matmul.py) reads the file's layout: no repacking, no expansion,
    # and the tiny vocabulary's table stays in blocks too (the GPU kernel takes any row count)
    model = gguf_kit.model("LlamaForCausalLM", tie_word_embeddings=True, **LLAMA)
    raw = {"blk.0.attn_v.weight": "Q6_K", "token_embd.weight": "Q6_K"} if qtype == "Q4_K" else {}
    written = gguf_kit.write(model, qtype, raw_types=raw)
    ours = Model.load(written.path, device="cuda")
    assert ours.model.layers[0].self_attn.qkv_proj.block_types == ([qtype, "Q6_K"] if raw else [qtype])
    projections = [m for n, m in ours.named_modules() if n.endswith("_proj")]
    assert all(m.block_types for m in projections) and not any(hasattr(m, "weight") for m in projections)
    assert ours.lm_head.blocks0.data_ptr() == ours.model.embed_tokens.blocks.data_ptr()
    expanded = Model.load(written.path, device="cuda", quantized=None)
    ids = torch.tensor(PROMPT, device="cuda")
    assert torch.equal(ours.embed(ids), expanded.embed(ids))
    # both round each weight to bfloat16 once (the kernel in registers, the expanded model at load), so they
    # differ by float32 summation order only
    got, want = logits(ours, PROMPT), logits(expanded, PROMPT)
    torch.testing.assert_close(got, want, rtol=0.02, atol=0.02 * want.abs().max().item())
