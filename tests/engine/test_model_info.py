"""Model cards read from headers alone (engine/model_info.py), against GGUF files and folders written here.

GGUF files: tools/make_bench_model.py's writer at a tiny shape (2 layers, hidden 256, the starter's vocabulary)
for the three file types it writes, and a hand-written file without `general.file_type`. Folders: the tiny
random Llama and LLaVA of tests/conftest.py. Bad inputs tried: a missing path, a .txt file, a .gguf of garbage,
a folder without config.json, a safetensors file whose header is cut short.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.errors import CorruptFileError, MissingFileError, ModelLoadError
from engine.model_info import read_model_info

# tools/ is not a package: load the writer by its path.
_SPEC = importlib.util.spec_from_file_location(
    "make_bench_model", Path(__file__).resolve().parents[2] / "tools" / "make_bench_model.py"
)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench  # its dataclasses look their module up there
_SPEC.loader.exec_module(bench)

TYPES = ("Q4_K_M", "Q4_0", "Q8_0")
SHAPE = {"hidden": 256, "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "ffn_hidden": 512}
CONTEXT = 131072
VOCAB = 49152  # the starter's tokenizer


@pytest.fixture(scope="module")
def bench_files(tmp_path_factory, starter_gguf) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("cards")
    return {
        t: bench.write_bench_model(
            folder / f"bench-tiny-{t}.gguf", t, 2, tokenizer_gguf=starter_gguf, context_length=CONTEXT, **SHAPE
        )
        for t in TYPES
    }


def expected_parameters(num_layers: int = 2) -> int:
    hidden, ffn = SHAPE["hidden"], SHAPE["ffn_hidden"]
    q_dim, kv_dim = SHAPE["num_heads"] * SHAPE["head_dim"], SHAPE["num_kv_heads"] * SHAPE["head_dim"]
    per_layer = hidden * q_dim + 2 * hidden * kv_dim + q_dim * hidden + 3 * hidden * ffn + 2 * hidden
    return VOCAB * hidden + num_layers * per_layer + hidden  # embeddings (tied head), layers, final norm


@pytest.mark.parametrize("type_name", TYPES)
def test_a_gguf_card_counts_its_tensors_and_names_its_type(bench_files, type_name):
    import gguf

    path = bench_files[type_name]
    info = read_model_info(path)
    tensors = gguf.GGUFReader(path, "r").tensors
    assert info.num_parameters == sum(int(t.n_elements) for t in tensors) == expected_parameters()
    assert info.quantization == type_name  # from general.file_type
    assert (info.format, info.architecture, info.engine_architecture) == ("gguf", "llama", "LlamaForCausalLM")
    assert info.supported and not info.can_see_images
    assert info.context_length == CONTEXT and info.size_bytes == path.stat().st_size
    assert (info.num_layers, info.num_kv_heads, info.head_dim) == (2, 2, 64)
    assert info.name == path.stem and info.path == path

    # Weights resident: the blocks as stored plus the F32 norms at the compute dtype, so a little under the
    # file size (the header and the vocabulary in it are not weights).
    floats = sum(int(t.n_elements) for t in tensors if t.tensor_type.name == "F32")
    assert info.packed_bytes == sum(int(t.n_bytes) for t in tensors if t.tensor_type.name != "F32")
    assert info.num_float_parameters == floats
    assert info.weights_bytes(2) == info.packed_bytes + 2 * floats < info.size_bytes
    assert info.weights_bytes(4, keeps_blocks=False) == 4 * info.num_parameters  # dequantized (float32)


def test_a_card_names_the_file_as_given_and_is_read_again_when_it_changes(bench_files, tmp_path):
    link = tmp_path / "my-model.gguf"
    link.symlink_to(bench_files["Q4_0"])
    info = read_model_info(link)
    assert info.name == "my-model" and info.path == link and info.quantization == "Q4_0"
    link.unlink()
    link.symlink_to(bench_files["Q8_0"])  # another file under the same name
    assert read_model_info(link).quantization == "Q8_0"


def write_plain_gguf(path: Path, architecture: str = "llama", shape_keys: bool = True) -> dict[str, int]:
    """A GGUF without general.file_type: Q8_0 projections, one F16 projection, F32 norms. Returns the elements
    per type."""
    import gguf

    hidden, vocab = 64, 40
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), architecture)
    if shape_keys:
        writer.add_block_count(1)
        writer.add_context_length(4096)
        writer.add_embedding_length(hidden)
        writer.add_feed_forward_length(128)
        writer.add_head_count(4)
        writer.add_head_count_kv(1)
        writer.add_vocab_size(vocab)
    tensors = {
        "token_embd.weight": ("Q8_0", (vocab, hidden)),
        "blk.0.attn_norm.weight": ("F32", (hidden,)),
        "blk.0.attn_q.weight": ("Q8_0", (hidden, hidden)),
        "blk.0.attn_k.weight": ("F16", (16, hidden)),
        "blk.0.ffn_up.weight": ("Q8_0", (128, hidden)),
        "output_norm.weight": ("F32", (hidden,)),
    }
    counts: dict[str, int] = {}
    for name, (kind, shape) in tensors.items():
        values = rng.normal(0, 0.1, size=shape).astype(np.float32)
        if kind == "Q8_0":
            writer.add_tensor(name, gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0), raw_dtype=8)
        else:
            writer.add_tensor(name, values.astype(np.float16 if kind == "F16" else np.float32))
        counts[kind] = counts.get(kind, 0) + math.prod(shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return counts


def test_a_gguf_without_a_file_type_is_named_by_its_dominant_tensor_type(tmp_path):
    counts = write_plain_gguf(tmp_path / "plain.gguf")
    info = read_model_info(tmp_path / "plain.gguf")
    assert info.quantization == "Q8_0" and counts["Q8_0"] > counts["F16"] + counts["F32"]
    assert info.num_parameters == sum(counts.values())
    assert info.num_float_parameters == counts["F16"] + counts["F32"]
    assert info.context_length == 4096 and (info.num_layers, info.num_kv_heads, info.head_dim) == (1, 1, 16)


def test_an_unsupported_gguf_architecture_still_gets_a_card(tmp_path):
    write_plain_gguf(tmp_path / "other.gguf", architecture="mamba", shape_keys=False)
    info = read_model_info(tmp_path / "other.gguf")
    assert info.architecture == "mamba" and info.engine_architecture is None and not info.supported
    assert info.num_parameters > 0 and not info.has_kv_shape and info.context_length is None


def safetensors_elements(folder: Path) -> int:
    from safetensors import safe_open

    total = 0
    for shard in folder.glob("*.safetensors"):
        with safe_open(shard, framework="pt") as f:
            total += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    return total


def test_a_folder_card_reads_config_and_safetensors_headers(tiny_folder, tiny_hf):
    info = read_model_info(tiny_folder)
    assert info.num_parameters == safetensors_elements(tiny_folder) == tiny_hf.num_parameters()
    assert (info.format, info.architecture, info.supported) == ("huggingface", "LlamaForCausalLM", True)
    assert info.quantization == "float32" and info.checkpoint_dtype == "float32"
    assert info.context_length == 1024 and (info.num_layers, info.num_kv_heads, info.head_dim) == (2, 2, 16)
    assert info.size_bytes == (tiny_folder / "model.safetensors").stat().st_size
    assert info.weights_bytes(2) == 2 * info.num_parameters  # every tensor takes the compute dtype
    assert not info.can_see_images


def test_a_vision_folder_counts_its_tower_and_sees_images(tiny_llava_folder):
    info = read_model_info(tiny_llava_folder)
    assert info.can_see_images and info.architecture == "LlavaForConditionalGeneration"
    assert info.num_parameters == safetensors_elements(tiny_llava_folder)
    assert info.context_length == 1024 and info.num_layers == 2  # the language model's, from text_config


def test_what_is_not_a_model_says_so(tmp_path, tiny_folder):
    with pytest.raises(MissingFileError, match="gone.gguf"):
        read_model_info(tmp_path / "gone.gguf")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        read_model_info(tmp_path / "notes.txt")
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(CorruptFileError, match="junk.gguf"):
        read_model_info(tmp_path / "junk.gguf")
    with pytest.raises(ModelLoadError, match="no config.json"):
        read_model_info(tmp_path)
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "config.json").write_bytes((tiny_folder / "config.json").read_bytes())
    (cut / "model.safetensors").write_bytes((tiny_folder / "model.safetensors").read_bytes()[:200])
    with pytest.raises(CorruptFileError, match="model.safetensors"):
        read_model_info(cut)


def test_the_cli_prints_the_card_and_the_memory_at_a_context(bench_files, capsys):
    from engine.__main__ import main

    assert main(["info", str(bench_files["Q4_0"]), "--context", "4096"]) == 0
    out = capsys.readouterr().out
    assert f"parameters:   {expected_parameters():,}" in out and "quantization: Q4_0" in out
    assert "context:      131,072 tokens" in out and "at 4,096 tokens" in out


def write_mmproj(path: Path, projector: str = "mlp") -> dict[str, int]:
    """A header-true mmproj (llama.cpp's 'clip' architecture): a Q8_0 and an F16 tower matrix, an F32 bias.
    Returns the elements per type; `bytes` is the Q8_0 matrix's size in blocks."""
    import gguf

    rng = np.random.default_rng(1)
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", projector)
    q8 = rng.normal(0, 0.1, size=(64, 256)).astype(np.float32)
    packed = gguf.quants.quantize(q8, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("v.blk.0.attn_q.weight", packed, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("mm.0.weight", rng.normal(0, 0.1, size=(32, 64)).astype(np.float16))
    writer.add_tensor("mm.0.bias", np.zeros(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"Q8_0": 64 * 256, "F16": 32 * 64, "F32": 32, "bytes": packed.nbytes}


def test_a_text_gguf_with_its_mmproj_beside_it_counts_the_tower(bench_files, tmp_path):
    from engine.memory_fit import memory_need

    text = tmp_path / "model.gguf"
    text.symlink_to(bench_files["Q4_0"])
    alone = read_model_info(text)
    assert not alone.can_see_images
    tower = write_mmproj(tmp_path / "mmproj-model-f16.gguf")
    info = read_model_info(text)
    assert info.can_see_images
    assert info.size_bytes == alone.size_bytes + (tmp_path / "mmproj-model-f16.gguf").stat().st_size
    assert info.num_parameters == alone.num_parameters + tower["Q8_0"] + tower["F16"] + tower["F32"]
    assert info.packed_bytes == alone.packed_bytes + tower["bytes"]
    assert info.num_float_parameters == alone.num_float_parameters + tower["F16"] + tower["F32"]
    grown = memory_need(info, 4096, 2).weights_bytes - memory_need(alone, 4096, 2).weights_bytes
    assert grown == tower["bytes"] + 2 * (tower["F16"] + tower["F32"])

    # A projector Tandem does not pair leaves the card text-only, its size the text file's alone.
    (tmp_path / "mmproj-model-f16.gguf").unlink()
    write_mmproj(tmp_path / "mmproj-other.gguf", projector="resampler")
    assert read_model_info(text) == alone
