"""The benchmark model writer (tools/make_bench_model.py), on tiny models with the starter's vocabulary."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

# tools/ is not a package: load the writer by its path.
_SPEC = importlib.util.spec_from_file_location(
    "make_bench_model", Path(__file__).resolve().parents[2] / "tools" / "make_bench_model.py"
)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench  # its dataclasses look their module up there
_SPEC.loader.exec_module(bench)

TYPES = ("Q4_K_M", "Q4_0", "Q8_0")
TINY = {"hidden": 256, "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "ffn_hidden": 512, "context_length": 2048}
WEIGHTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def expected_types(type_name: str) -> dict[str, str]:
    """Every tensor of a 2-layer file and its ggml type; no output.weight (tied embeddings)."""
    # llama.cpp's Q4_K_M with 2 layers: use_more_bits picks layer 1 (>= 7n/8) only; the tied head is Q6_K.
    q6_k = {"token_embd.weight", "blk.1.attn_v.weight", "blk.1.ffn_down.weight"}
    names = ["token_embd.weight", "output_norm.weight"]
    names += [f"blk.{i}.{short}.weight" for i in range(2) for short in ("attn_norm", "ffn_norm", *WEIGHTS)]
    out = {}
    for name in names:
        if name.endswith("norm.weight"):
            out[name] = "F32"
        elif type_name == "Q4_K_M":
            out[name] = "Q6_K" if name in q6_k else "Q4_K"
        else:
            out[name] = type_name
    return out


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory, starter_gguf) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bench")
    return {
        type_name: bench.write_bench_model(
            folder / f"bench-tiny-{type_name}.gguf", type_name, num_layers=2, tokenizer_gguf=starter_gguf, **TINY
        )
        for type_name in TYPES
    }


@pytest.fixture(scope="module")
def starter(starter_gguf) -> dict:
    """The starter's tokenizer.* metadata and its ids for "Hello world"."""
    from engine import Tokenizer
    from engine.gguf.file import GGUFFile

    metadata = GGUFFile.open(starter_gguf).metadata
    return {
        "tokenizer": {k: v for k, v in metadata.items() if k.startswith("tokenizer.")},
        "hello_ids": Tokenizer.load(starter_gguf).encode("Hello world"),
    }


def test_use_more_bits_layers_of_a_16_layer_model():
    assert [i for i in range(16) if bench.use_more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]


def test_full_size_q4_k_m_plan():
    plans = {p.name: p for p in bench.plan_tensors("Q4_K_M", 16, 49152, 2048, 32, 8, 64, 8192)}
    assert plans["token_embd.weight"].shape == (49152, 2048) and plans["token_embd.weight"].type_name == "Q6_K"
    assert plans["blk.0.attn_k.weight"].shape == (512, 2048)
    assert plans["blk.3.ffn_down.weight"].shape == (2048, 8192) and plans["blk.3.ffn_down.weight"].type_name == "Q4_K"
    assert plans["blk.4.ffn_down.weight"].type_name == plans["blk.4.attn_v.weight"].type_name == "Q6_K"
    assert len(plans) == 1 + 16 * 9 + 1


def test_unknown_type_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown type"):
        bench.write_bench_model(tmp_path / "x.gguf", "Q5_K_M")
    with pytest.raises(SystemExit):
        bench.main([str(tmp_path), "--types", "Q4_K_M,Q3_K"])


@pytest.mark.parametrize("type_name", TYPES)
def test_bench_file_loads_generates_and_has_the_starters_tokenizer(tiny_files, starter, type_name):
    from gguf.quants import dequantize

    from engine import Cache, DynamicGenerator, DynamicJob, Model, SamplerSettings
    from engine.gguf.file import GGUFFile

    # Opened once through the engine's cache, which Model.load then reuses: parsing the vocabulary takes seconds.
    file = GGUFFile.open(tiny_files[type_name])
    assert {t.name: t.tensor_type.name for t in file.tensors} == expected_types(type_name)
    meta = file.metadata
    assert meta["general.architecture"] == "llama"
    assert meta["general.file_type"] == {"Q4_K_M": 15, "Q4_0": 2, "Q8_0": 7}[type_name]
    assert (meta["llama.block_count"], meta["llama.embedding_length"], meta["llama.feed_forward_length"]) == (
        2,
        256,
        512,
    )
    assert (meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]) == (4, 2)
    assert meta["llama.rope.freq_base"] == 500000.0
    for key, value in starter["tokenizer"].items():
        assert meta[key] == value, key
    assert meta["llama.vocab_size"] == len(meta["tokenizer.ggml.tokens"]) == 49152
    # random blocks dequantize to finite weights of about the RMS of a trained Llama's
    for t in file.tensors:
        if t.tensor_type.name != "F32":
            weights = dequantize(t.data[:64], t.tensor_type).astype(np.float64)
            assert np.isfinite(weights).all(), t.name
            assert 0.01 < np.sqrt(np.mean(weights**2)) < 0.04, t.name

    model = Model.load(tiny_files[type_name], dtype=torch.float32)
    ids = model.tokenizer.encode("Hello world")
    assert torch.equal(ids, starter["hello_ids"])
    generator = DynamicGenerator(model, Cache(model, max_seq_len=256, page_size=256), model.tokenizer)
    generator.enqueue(DynamicJob(ids, max_new_tokens=5, gen_settings=SamplerSettings.greedy(), return_logits=True))
    results = []
    while generator.num_remaining_jobs():
        results += generator.iterate()
    logits = torch.cat([r["logits"] for r in results if "logits" in r], dim=1)  # [1, 5, vocab]
    assert logits.shape == (1, 5, 49152)
    assert torch.isfinite(logits).all()
    assert results[-1]["eos"] and results[-1]["new_tokens"] == 5


TINY_MOE = {"hidden": 256, "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "num_experts": 8, "experts_used": 2,
            "expert_ffn": 256, "context_length": 2048}  # fmt: skip


def test_a_qwen3moe_file_has_llama_cpps_names_shapes_and_keys(tmp_path, starter_gguf):
    import gguf

    path = bench.write_bench_model(
        tmp_path / "moe.gguf", "Q4_K_M", 2, shape="qwen3moe", moe=TINY_MOE, tokenizer_gguf=starter_gguf
    )
    reader = gguf.GGUFReader(path, "r")
    assert reader.fields["general.architecture"].contents() == "qwen3moe"
    assert reader.fields["qwen3moe.expert_count"].contents() == 8
    assert reader.fields["qwen3moe.expert_used_count"].contents() == 2
    assert reader.fields["qwen3moe.expert_feed_forward_length"].contents() == 256
    tensors = {t.name: t for t in reader.tensors}
    # ggml lists dimensions innermost first: [cols, rows, experts]
    assert [int(n) for n in tensors["blk.0.ffn_gate_exps.weight"].shape] == [256, 256, 8]
    assert [int(n) for n in tensors["blk.1.ffn_down_exps.weight"].shape] == [256, 256, 8]
    assert tensors["blk.0.ffn_gate_inp.weight"].tensor_type.name == "F32"
    assert tensors["blk.1.ffn_down_exps.weight"].tensor_type.name == "Q6_K"  # use_more_bits, as llama.cpp
    assert tensors["blk.0.ffn_up_exps.weight"].tensor_type.name == "Q4_K"
    assert {"output.weight", "blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"} <= tensors.keys()


def test_llama_cpp_runs_the_qwen3moe_file(tmp_path, starter_gguf):
    llama_cpp = pytest.importorskip("llama_cpp")
    path = bench.write_bench_model(
        tmp_path / "moe.gguf", "Q4_0", 2, shape="qwen3moe", moe=TINY_MOE, tokenizer_gguf=starter_gguf
    )
    model = llama_cpp.Llama(str(path), n_ctx=128, n_threads=1, verbose=False)
    assert model.n_vocab() == 49152
    out = model("Hello", max_tokens=3, temperature=0.0)
    assert out["usage"]["completion_tokens"] >= 1


TINY_OSS = {"hidden": 256, "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "num_experts": 4, "experts_used": 2,
            "expert_ffn": 256, "sliding_window": 8}  # fmt: skip


def test_a_gpt_oss_file_has_mxfp4_experts_with_biases_and_sinks(tmp_path, starter_gguf):
    import gguf

    path = bench.write_bench_model(
        tmp_path / "oss.gguf", "MXFP4", 2, shape="gpt-oss", moe=TINY_OSS, tokenizer_gguf=starter_gguf
    )
    reader = gguf.GGUFReader(path, "r")
    assert reader.fields["general.architecture"].contents() == "gpt-oss"
    assert reader.fields["gpt-oss.attention.sliding_window"].contents() == 8
    assert reader.fields["gpt-oss.rope.scaling.type"].contents() == "yarn"
    tensors = {t.name: t for t in reader.tensors}
    assert tensors["blk.0.ffn_up_exps.weight"].tensor_type.name == "MXFP4"
    assert [int(n) for n in tensors["blk.1.ffn_down_exps.bias"].shape] == [256, 4]
    assert tensors["blk.0.attn_q.weight"].tensor_type.name == "Q8_0"
    assert {"blk.0.attn_sinks.weight", "blk.1.ffn_gate_inp.bias", "blk.0.post_attention_norm.weight"} <= tensors.keys()
    with pytest.raises(ValueError, match="MXFP4"):
        bench.write_bench_model(
            tmp_path / "x.gguf", "Q4_0", 1, shape="gpt-oss", moe=TINY_OSS, tokenizer_gguf=starter_gguf
        )


@pytest.mark.parametrize("shape, type_name, spec", [("qwen3moe", "Q8_0", TINY_MOE), ("gpt-oss", "MXFP4", TINY_OSS)])
def test_tandem_follows_llama_cpps_greedy_tokens_on_the_moe_files(tmp_path, starter_gguf, shape, type_name, spec):
    """llama.cpp's own greedy continuation, read back by Tandem in float32: at every position where Tandem's top
    two logits are apart (not a near-tie), llama.cpp's token is Tandem's first choice."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from engine import Model
    from engine.cache import Cache
    from engine.models import Batch

    path = bench.write_bench_model(
        tmp_path / "m.gguf", type_name, 2, shape=shape, moe=spec, tokenizer_gguf=starter_gguf
    )
    theirs = llama_cpp.Llama(str(path), n_ctx=128, n_threads=1, verbose=False)
    prompt = theirs.tokenize(b"The river had frozen early that year", add_bos=False)
    out = theirs.generate(prompt, temp=0.0)
    generated = [next(out) for _ in range(8)]
    model = Model.load(path, dtype=torch.float32)
    ids = prompt + generated
    cache = Cache(model, 128, page_size=16, sliding_tokens=128)
    batch = Batch.build(cache, [list(range(8))], [0], [len(ids)], logits="all")
    logits = model(torch.tensor(ids), batch.positions(), batch)[len(prompt) - 1 : -1]
    top2 = logits.topk(2, dim=-1)
    clear = (top2.values[:, 0] - top2.values[:, 1]) > 0.05
    assert clear.any()
    assert torch.equal(top2.indices[clear, 0], torch.tensor(generated)[clear])
