"""The decode bound's inputs and rows (engine/bench/bound.py, engine/bench/table.py): the active bytes of a tiny
Qwen3-MoE counted by hand (dense weights whole, experts at top_k / num_experts, an untied embedding table not at
all, a tied one once as the head), a measured bandwidth, and the rows the table builds from figures."""

from __future__ import annotations

import pytest
import torch
import transformers

from engine.bench import bound
from engine.bench.table import _bound_rows, _model_memory_rows
from engine.models import Model
from engine.models.embedding import Embedding
from engine.models.moe import Experts

CONFIG = dict(
    vocab_size=97, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=8, num_experts_per_tok=2,
    max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)  # fmt: skip


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


@pytest.mark.parametrize("tied", [False, True])
def test_active_bytes_count_routed_experts_and_the_head_once(tmp_path, tied):
    torch.manual_seed(0)
    hf = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**CONFIG, tie_word_embeddings=tied))
    hf.save_pretrained(tmp_path)
    model = Model.load(tmp_path, dtype=torch.float32)
    expected = 0
    for module in model.modules():
        own = _bytes([*module.parameters(recurse=False), *module.buffers(recurse=False)])
        if isinstance(module, Experts):
            expected += own * 2 // 8
        elif not isinstance(module, Embedding) and not (tied and module is model.lm_head):
            expected += own
    if tied:  # the head reads the embedding table in full
        expected += _bytes([model.model.embed_tokens.weight])
    assert bound.active_bytes(model) == expected
    # a routed expert is a quarter of the experts here: the bound must not count them whole
    experts = sum(_bytes(m.buffers()) for m in model.modules() if isinstance(m, Experts))
    assert bound.active_bytes(model) < expected - experts // 4 + experts


def test_read_bandwidth_is_a_rate(monkeypatch):
    monkeypatch.setattr(bound, "_STREAM_MIB", 8)
    assert 0 < bound.read_bandwidth_gbs() < 10_000


def test_the_bound_row_gives_each_sides_share():
    ours = {"active_bytes": 100 * 2**20, "read_gbs": 10.0, "single_decode_tps": 50.0}
    (row,) = _bound_rows(ours, {"single_decode_tps": 25.0})
    limit = 10e9 / (100 * 2**20)  # 95.4 tok/s
    assert row["ours"] == f"{limit:.1f}" and "100 MiB" in row["metric"] and "10.0 GB/s" in row["metric"]
    assert row["result"] == f"ours {50 / limit * 100:.0f}%, llama.cpp {25 / limit * 100:.0f}%"
    assert _bound_rows({"single_decode_tps": 50.0}, None) == []  # a side that did not measure it: no row


@pytest.mark.parametrize(("ours_mib", "verdict"), [(1100.0, "PASS (1.05x)"), (1300.0, "MISS (1.24x)")])
def test_the_memory_row_compares_what_each_side_added(ours_mib, verdict):
    ours = {"rss_after_import_mib": 100.0, "rss_after_single_mib": 100.0 + ours_mib}
    cpp = {"rss_after_import_mib": 50.0, "rss_after_single_mib": 1100.0}
    (row,) = _model_memory_rows(ours, cpp)
    assert row["result"] == verdict and row["llama.cpp"] == "1,050 MiB"
    assert _model_memory_rows(ours, None) == []
