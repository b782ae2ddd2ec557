"""load_gguf against transformers' own GGUF loader, against the original weights, and on bad files."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
import torch

from engine.errors import (
    CorruptFileError,
    MissingFileError,
    ModelLoadError,
    TensorMismatchError,
    UnsupportedArchitectureError,
)
from engine.gguf.checkpoint import load_gguf

LLAMA_ODD = dict(
    hidden_size=48, intermediate_size=72, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1
)
LLAMA_WIDE_HEADS = dict(
    hidden_size=48,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
)
LLAMA_BLOCK32 = dict(
    hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1
)
LLAMA_BLOCK256 = dict(
    hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2
)
QWEN2 = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
# transformers' GGUF reader ignores qwen3's attention.key_length and keeps Qwen3Config's head_dim of 128
QWEN3 = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=128,
)
QWEN3_BLOCK256 = dict(QWEN3, hidden_size=256, intermediate_size=256, num_hidden_layers=1)

LEGACY_QUANTS = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")  # gguf.quants can write these
K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")  # gguf.quants can only read these: random blocks

CASES = [
    pytest.param("LlamaForCausalLM", LLAMA_ODD, "F32", id="llama-F32"),
    pytest.param("LlamaForCausalLM", LLAMA_ODD, "F16", id="llama-F16"),
    pytest.param("LlamaForCausalLM", LLAMA_ODD, "BF16", id="llama-BF16"),
    pytest.param("LlamaForCausalLM", dict(LLAMA_ODD, attention_bias=True), "F32", id="llama-F32-bias"),
    pytest.param("LlamaForCausalLM", dict(LLAMA_ODD, tie_word_embeddings=True), "F32", id="llama-F32-tied"),
    pytest.param("LlamaForCausalLM", LLAMA_WIDE_HEADS, "F32", id="llama-F32-head_dim"),
    *[pytest.param("LlamaForCausalLM", LLAMA_BLOCK32, q, id=f"llama-{q}") for q in LEGACY_QUANTS],
    *[pytest.param("LlamaForCausalLM", LLAMA_BLOCK256, q, id=f"llama-{q}") for q in K_QUANTS],
    pytest.param("Qwen2ForCausalLM", QWEN2, "F32", id="qwen2-F32"),
    pytest.param("Qwen2ForCausalLM", dict(QWEN2, tie_word_embeddings=True), "Q8_0", id="qwen2-Q8_0-tied"),
    pytest.param("Qwen3ForCausalLM", QWEN3, "F32", id="qwen3-F32"),
    pytest.param("Qwen3ForCausalLM", dict(QWEN3, tie_word_embeddings=True), "Q4_1", id="qwen3-Q4_1-tied"),
    pytest.param("Qwen3ForCausalLM", QWEN3_BLOCK256, "Q6_K", id="qwen3-Q6_K"),
]


def assert_config_matches(config, hf_config):
    eos = hf_config.eos_token_id
    assert config.architecture == hf_config.architectures[0]
    assert config.vocab_size == hf_config.vocab_size
    assert config.hidden_size == hf_config.hidden_size
    assert config.intermediate_size == hf_config.intermediate_size
    assert config.num_hidden_layers == hf_config.num_hidden_layers
    assert config.num_attention_heads == hf_config.num_attention_heads
    assert config.num_key_value_heads == hf_config.num_key_value_heads
    assert config.head_dim == getattr(hf_config, "head_dim", hf_config.hidden_size // hf_config.num_attention_heads)
    assert config.rms_norm_eps == hf_config.rms_norm_eps
    assert config.rope_theta == hf_config.rope_parameters["rope_theta"]
    assert config.rope_scaling is None
    assert config.max_position_embeddings == hf_config.max_position_embeddings
    assert config.tie_word_embeddings == hf_config.tie_word_embeddings
    assert (config.bos_token_id, config.eos_token_ids[0], config.pad_token_id) == (
        hf_config.bos_token_id,
        eos[0] if isinstance(eos, list) else eos,
        hf_config.pad_token_id,
    )


def assert_same_state_dict(ours, reference, tied, beyond_reference=frozenset()):
    """`beyond_reference`: tensors we load that transformers' GGUF loader drops."""
    expected_keys = set(reference) - ({"lm_head.weight"} if tied else set())
    assert set(ours) == expected_keys | set(beyond_reference)
    for name, tensor in ours.items():
        if name in beyond_reference:
            continue
        assert tensor.dtype == torch.float32, name
        assert torch.equal(tensor, reference[name]), f"{name} differs from transformers"


def round_trip(weights: np.ndarray, qtype: str) -> torch.Tensor:
    """What a lossy type makes of HF-layout weights: quantization works along rows, so permuting
    rows before quantizing (as the converter does) gives the same values, permuted."""
    import gguf

    qt = gguf.GGMLQuantizationType[qtype]
    if weights.ndim <= 1:
        return torch.from_numpy(weights)
    if qtype == "F16":
        return torch.from_numpy(weights.astype(np.float16).astype(np.float32))
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(weights, qt), qt))


@pytest.mark.parametrize("arch, hf_kwargs, qtype", CASES)
def test_matches_transformers(gguf_kit, read_hf_gguf, arch, hf_kwargs, qtype):
    model = gguf_kit.model(arch, **hf_kwargs)
    written = gguf_kit.write(model, qtype)

    config, ours = load_gguf(written.path)
    theirs = read_hf_gguf(written.path)
    hf_config, reference = theirs.config, theirs.state_dict()

    assert_config_matches(config, hf_config)
    assert config.attention_bias == (arch == "Qwen2ForCausalLM" or hf_kwargs.get("attention_bias", False))
    assert config.qk_norm == (arch == "Qwen3ForCausalLM")
    # transformers builds a llama config from GGUF without attention_bias, so it drops the q/k/v/o biases
    # (checked below against the original weights instead, un-permutation of the q/k biases included).
    biases = {n for n in ours if n.endswith("_proj.bias")} if arch == "LlamaForCausalLM" else set()
    assert_same_state_dict(ours, reference, tied=config.tie_word_embeddings, beyond_reference=biases)

    if qtype.endswith("_K"):
        return  # random blocks: checked against an independent dequantizer below
    # The original weights come back: exactly for F32 (proving the q/k un-permutation), and as
    # the same lossy round trip done in Hugging Face layout for the other types.
    original = model.state_dict()
    for name, tensor in ours.items():
        source = original[name].numpy()
        expected = torch.from_numpy(source) if qtype == "F32" else round_trip(source, qtype)
        assert torch.equal(tensor, expected), f"{name} is not the {qtype} version of the original"


# llama.cpp's names, spelled out here independently of the loader
K_QUANT_NAMES = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output.weight", "lm_head.weight"),
    ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
    ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight"),
    ("blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight"),
    ("blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight"),
    ("blk.0.ffn_gate.weight", "model.layers.0.mlp.gate_proj.weight"),
    ("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight"),
    ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"),
]


@pytest.mark.parametrize("qtype", K_QUANTS)
def test_k_quants_match_an_independent_dequantizer(gguf_kit, qtype):
    """K-quant blocks (which gguf cannot write) decoded by transformers' torch dequantizer, not gguf's."""
    import gguf
    from transformers.integrations.gguf.dequant import dequantize as torch_dequantize

    model = gguf_kit.model("LlamaForCausalLM", **LLAMA_BLOCK256)
    written = gguf_kit.write(model, qtype)
    config, ours = load_gguf(written.path)

    qt = gguf.GGMLQuantizationType[qtype]
    for gguf_name, hf_name in K_QUANT_NAMES:
        blocks = torch.from_numpy(written.written[gguf_name].copy()).reshape(-1)
        reference = torch_dequantize(blocks, int(qt)).reshape(ours[hf_name].shape)
        value = ours[hf_name].numpy()
        if gguf_name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight"):
            heads = config.num_attention_heads if "attn_q" in gguf_name else config.num_key_value_heads
            value = gguf_kit.permute(value, heads)  # back to the file's row order
        assert torch.isfinite(reference).all()
        torch.testing.assert_close(torch.from_numpy(value), reference, rtol=1e-6, atol=1e-6, msg=gguf_name)


def test_starter_matches_transformers(starter_gguf, starter_hf_model):
    config, ours = load_gguf(starter_gguf)
    hf_config, reference = starter_hf_model.config, starter_hf_model.state_dict()

    assert config.architecture == "LlamaForCausalLM"
    assert_config_matches(config, hf_config)
    assert_same_state_dict(ours, reference, tied=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dtype_and_device(gguf_kit, dtype):
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rope_freqs = np.linspace(1.0, 8.0, LLAMA_ODD["hidden_size"] // LLAMA_ODD["num_attention_heads"] // 2)
    written = gguf_kit.write(
        gguf_kit.model("LlamaForCausalLM", **LLAMA_ODD),
        "F16",
        extra_tensors={"rope_freqs.weight": rope_freqs.astype(np.float32)},
    )
    _, full = load_gguf(written.path)
    for device in devices:
        _, cast = load_gguf(written.path, dtype=dtype, device=device)
        assert set(cast) == set(full)
        for name, tensor in cast.items():
            assert tensor.device.type == device
            if name == "rope_freq_factors":
                assert tensor.dtype == torch.float32
                assert torch.equal(tensor.cpu(), full[name])
            else:
                assert tensor.dtype == dtype, name
                assert torch.equal(tensor.cpu(), full[name].to(dtype)), name


def test_progress_reports_each_tensor_up_to_one(gguf_kit):
    written = gguf_kit.write(gguf_kit.model("Qwen2ForCausalLM", **QWEN2), "Q8_0")
    fractions: list[float] = []
    _, state_dict = load_gguf(written.path, progress=fractions.append)
    assert len(fractions) == len(state_dict) + 1
    assert fractions[0] == 0.0 and fractions[-1] == 1.0
    assert all(a < b for a, b in pairwise(fractions))


def test_rope_freq_factors_and_linear_scaling(gguf_kit):
    head_dim = LLAMA_ODD["hidden_size"] // LLAMA_ODD["num_attention_heads"]
    factors = np.array([1.0, 1.0, 1.5, 2.5, 4.0, 6.0, 8.0, 8.0], dtype=np.float32)[: head_dim // 2]
    written = gguf_kit.write(
        gguf_kit.model("LlamaForCausalLM", **LLAMA_ODD),
        extra_tensors={"rope_freqs.weight": factors},
        extra_metadata={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0},
    )
    config, state_dict = load_gguf(written.path, dtype=torch.bfloat16)
    assert state_dict["rope_freq_factors"].dtype == torch.float32
    assert torch.equal(state_dict["rope_freq_factors"], torch.from_numpy(factors))
    assert config.rope_scaling is not None
    assert (config.rope_scaling.rope_type, config.rope_scaling.factor) == ("linear", 4.0)


def test_unknown_tensors_are_skipped_with_a_warning(gguf_kit, caplog):
    written = gguf_kit.write(
        gguf_kit.model("LlamaForCausalLM", **LLAMA_ODD),
        extra_tensors={"blk.0.attn_sinks.weight": np.ones(3, np.float32)},
    )
    _, state_dict = load_gguf(written.path)
    assert not any("sinks" in name for name in state_dict)
    assert "blk.0.attn_sinks.weight" in caplog.text


# ---- bad inputs -------------------------------------------------------------------------------


def test_missing_path(tmp_path):
    with pytest.raises(MissingFileError, match="nope.gguf"):
        load_gguf(tmp_path / "nope.gguf")


CUTS = [
    "empty",
    "in magic",
    "in version",
    "in counts",
    "in first key",
    "in token list",
    "in tensor infos",
    "before data",
    "in first tensor",
    "in last tensor",
]


def _cut_point(path, where: str) -> int:
    """An offset inside one part of a GGUF file: header, metadata, tensor infos or tensor data."""
    import gguf

    reader = gguf.GGUFReader(path)
    last = max(reader.tensors, key=lambda t: t.data_offset)
    offsets = {
        "empty": 0,
        "in magic": 2,
        "in version": 6,
        "in counts": 17,
        "in first key": reader.fields["general.architecture"].offset + 5,
        "in token list": reader.fields["tokenizer.ggml.tokens"].offset + 40,
        "in tensor infos": min(t.field.offset for t in reader.tensors) + 12,
        "before data": reader.data_offset - 1,
        "in first tensor": reader.data_offset + 3,
        "in last tensor": last.data_offset + last.n_bytes - 1,
    }
    return offsets[where]


@pytest.mark.parametrize("where", CUTS)
def test_truncated_file_fails_cleanly(gguf_kit, tmp_path, where):
    source = gguf_kit.write(gguf_kit.model("LlamaForCausalLM", **LLAMA_BLOCK32), "Q4_1").path
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(source.read_bytes()[: _cut_point(source, where)])
    with pytest.raises(CorruptFileError, match="truncated.gguf"):
        load_gguf(truncated)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(lambda rng: rng.bytes(4096), id="random-bytes"),
        pytest.param(lambda rng: b"GGUF" + np.uint32(3).tobytes() + rng.bytes(4096), id="gguf-magic-then-random"),
        pytest.param(lambda rng: b"GGUF" + np.uint32(3).tobytes() + bytes(16), id="header-only-no-arch"),
        pytest.param(lambda rng: b'{"architectures": ["LlamaForCausalLM"]}', id="json"),
    ],
)
def test_garbage_file(tmp_path, content):
    path = tmp_path / "garbage.gguf"
    path.write_bytes(content(np.random.default_rng(0)))
    with pytest.raises(CorruptFileError, match="garbage.gguf"):
        load_gguf(path)


def test_metadata_string_that_is_not_utf8(gguf_kit):
    model = gguf_kit.model("LlamaForCausalLM", **LLAMA_ODD)
    path = gguf_kit.write(model, extra_metadata={"general.description": "@@@@@@@@"}).path
    path.write_bytes(path.read_bytes().replace(b"@@@@@@@@", b"\xff\xfe\xff\xfe\xff\xfe\xff\xfe"))
    with pytest.raises(CorruptFileError, match="unreadable metadata"):
        load_gguf(path)


def test_unsupported_architecture(tmp_path):
    import gguf

    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_embedding_length(32)
    writer.add_tensor("token_embd.weight", np.zeros((10, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedArchitectureError, match="'gpt2'") as err:
        load_gguf(path)
    assert all(arch in str(err.value) for arch in ("llama", "qwen2", "qwen3"))


def test_missing_tensor(gguf_kit):
    written = gguf_kit.write(
        gguf_kit.model("Qwen2ForCausalLM", **QWEN2), skip=("blk.1.ffn_up.weight", "blk.0.attn_k.bias")
    )
    with pytest.raises(TensorMismatchError, match="missing 2 tensor") as err:
        load_gguf(written.path)
    message = str(err.value)
    assert "blk.1.ffn_up.weight" in message and "model.layers.1.mlp.up_proj.weight" in message
    assert "blk.0.attn_k.bias" in message and written.path.name in message


def test_missing_lm_head_is_tied_not_an_error(gguf_kit):
    written = gguf_kit.write(gguf_kit.model("LlamaForCausalLM", **LLAMA_ODD), skip=("output.weight",))
    config, state_dict = load_gguf(written.path)
    assert config.tie_word_embeddings and "lm_head.weight" not in state_dict


def test_wrong_shape(gguf_kit):
    wrong = np.zeros((24, LLAMA_ODD["hidden_size"]), np.float32)  # 1 kv head of 16 rows expected
    written = gguf_kit.write(gguf_kit.model("LlamaForCausalLM", **LLAMA_ODD), replace={"blk.1.attn_v.weight": wrong})
    with pytest.raises(TensorMismatchError, match=r"blk\.1\.attn_v\.weight") as err:
        load_gguf(written.path)
    assert "[24, 48]" in str(err.value) and "[16, 48]" in str(err.value)


def test_type_that_cannot_be_dequantized(gguf_kit):
    written = gguf_kit.write(
        gguf_kit.model("LlamaForCausalLM", **LLAMA_BLOCK32), raw_types={"blk.0.ffn_up.weight": "Q8_1"}
    )
    with pytest.raises(ModelLoadError, match=r"blk\.0\.ffn_up\.weight is stored as Q8_1"):
        load_gguf(written.path)


def test_missing_metadata_key(gguf_kit):
    written = gguf_kit.write(gguf_kit.model("LlamaForCausalLM", **LLAMA_ODD), drop_metadata=("llama.embedding_length",))
    with pytest.raises(CorruptFileError, match="llama.embedding_length"):
        load_gguf(written.path)


def test_unsupported_rope_scaling(gguf_kit):
    written = gguf_kit.write(
        gguf_kit.model("Qwen3ForCausalLM", **QWEN3), extra_metadata={"qwen3.rope.scaling.type": "longrope"}
    )
    with pytest.raises(ModelLoadError, match="'longrope' rope scaling"):
        load_gguf(written.path)


def test_big_endian_file_is_refused(gguf_kit):
    written = gguf_kit.write(gguf_kit.model("LlamaForCausalLM", **LLAMA_ODD), endianess="BIG")
    with pytest.raises(ModelLoadError, match="big-endian"):
        load_gguf(written.path)
