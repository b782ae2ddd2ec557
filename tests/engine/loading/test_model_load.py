"""Model.load on Hugging Face folders: dtypes, progress, and every bad input giving a clear ModelLoadError."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from engine.errors import (
    CorruptFileError,
    MissingFileError,
    ModelLoadError,
    TensorMismatchError,
    UnsupportedArchitectureError,
)
from engine.models import Model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny")
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    return path


@pytest.fixture
def copy(folder, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(folder, dst)
    return dst


def test_default_dtype_on_cpu_is_bfloat16_and_override_works(folder):
    assert Model.load(folder).dtype == torch.bfloat16
    assert Model.load(folder, dtype=torch.float32).dtype == torch.float32
    assert Model.load(folder, dtype="float16").dtype == torch.float16


def test_progress_reaches_one_and_never_goes_back(folder):
    seen: list[float] = []
    Model.load(folder, progress=seen.append)
    assert seen and seen[-1] == pytest.approx(1.0)
    assert seen == sorted(seen)


def test_missing_path(tmp_path):
    with pytest.raises(MissingFileError, match="does not exist"):
        Model.load(tmp_path / "nope")


def test_folder_without_config(copy):
    (copy / "config.json").unlink()
    with pytest.raises(MissingFileError, match="config.json"):
        Model.load(copy)


def test_config_not_json(copy):
    (copy / "config.json").write_text("{ not json")
    with pytest.raises(CorruptFileError, match="config.json"):
        Model.load(copy)


def test_config_missing_key(copy):
    cfg = json.loads((copy / "config.json").read_text())
    del cfg["hidden_size"]
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="hidden_size"):
        Model.load(copy)


def test_unsupported_architecture_is_named_with_the_supported_list(copy):
    cfg = json.loads((copy / "config.json").read_text())
    cfg["architectures"] = ["FancyNetForCausalLM"]
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match="FancyNetForCausalLM.*LlamaForCausalLM"):
        Model.load(copy)


def test_unsupported_rope_scaling_type(copy):
    cfg = json.loads((copy / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "longrope", "factor": 4.0}
    cfg.pop("rope_parameters", None)
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="longrope"):
        Model.load(copy)


@pytest.mark.parametrize("keep", [0, 7, 100, 0.5])
def test_truncated_safetensors(copy, keep):
    weights = copy / "model.safetensors"
    data = weights.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep
    weights.write_bytes(data[:cut])
    with pytest.raises(CorruptFileError, match="model.safetensors"):
        Model.load(copy)


def test_garbage_safetensors(copy):
    (copy / "model.safetensors").write_bytes(b"\x00\xff" * 5000)
    with pytest.raises(CorruptFileError, match="model.safetensors"):
        Model.load(copy)


def test_no_weights_at_all(copy):
    (copy / "model.safetensors").unlink()
    with pytest.raises(MissingFileError, match="no .safetensors"):
        Model.load(copy)


def test_missing_tensor_is_named(copy):
    tensors = load_file(copy / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, copy / "model.safetensors")
    with pytest.raises(TensorMismatchError, match="model.layers.1.mlp.up_proj.weight"):
        Model.load(copy)


def test_wrong_shape_is_named_with_both_shapes(copy):
    tensors = load_file(copy / "model.safetensors")
    tensors["model.layers.0.self_attn.o_proj.weight"] = torch.zeros(32, 31, dtype=torch.bfloat16)
    save_file(tensors, copy / "model.safetensors")
    with pytest.raises(TensorMismatchError, match=r"o_proj.weight.*\(32, 31\).*\(32, 32\)"):
        Model.load(copy)


def test_shard_listed_in_index_but_missing(copy):
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(MissingFileError, match="model-00001-of-00002.safetensors"):
        Model.load(copy)


@pytest.mark.parametrize(
    "name", ["../outside.safetensors", "sub/../../outside.safetensors", "/tmp/outside.safetensors"]
)
def test_an_index_naming_a_file_outside_the_folder_is_refused(copy, name):
    # a real safetensors file beside the folder: the index must not be able to point the loader at it
    outside = copy.parent / "outside.safetensors"
    shutil.copy(copy / "model.safetensors", outside)
    weights = load_file(copy / "model.safetensors")
    index = {"weight_map": {key: name for key in weights}}
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CorruptFileError, match="outside the model folder"):
        Model.load(copy)


def test_an_index_in_a_linked_cache_folder_still_loads(copy, tmp_path):
    # Hugging Face's cache: the snapshot's files are links to blobs elsewhere; names stay inside the folder
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    shutil.move(copy / "model.safetensors", blobs / "abc123")
    (copy / "model-00001-of-00001.safetensors").symlink_to(blobs / "abc123")
    weights = load_file(blobs / "abc123")
    index = {"weight_map": {key: "model-00001-of-00001.safetensors" for key in weights}}
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    assert Model.load(copy) is not None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_hidden_layers", 1e9, "'num_hidden_layers' is 1000000000.0, outside 1..1,024"),
        ("num_attention_heads", 0, "'num_attention_heads' is 0, outside"),
        ("hidden_size", -32, "'hidden_size' is -32, outside"),
        ("intermediate_size", 96.7, "'intermediate_size' must be a whole number, got 96.7"),
        ("vocab_size", "64", "'vocab_size' must be a whole number"),
        ("num_key_value_heads", 3, r"num_attention_heads \(4\) is not a multiple of num_key_value_heads \(3\)"),
        ("eos_token_id", 64, "'eos_token_id' is 64, but token ids run from 0 to 63"),
    ],
)
def test_a_config_value_out_of_bounds_is_named_before_anything_is_built(copy, field, value, message):
    config = json.loads((copy / "config.json").read_text())
    config[field] = value
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=message) as caught:
        Model.load(copy)
    assert str(copy / "config.json") in str(caught.value)  # the file, then the field


@pytest.mark.parametrize("name", ["model.layers.0.mlp.gate_proj.weight", "model.layers.1.self_attn.k_proj.weight"])
def test_a_wrong_shaped_part_of_a_joined_weight_is_named(copy, name):
    tensors = load_file(copy / "model.safetensors")
    tensors[name] = torch.zeros(tensors[name].shape[0], 31, dtype=torch.bfloat16)
    save_file(tensors, copy / "model.safetensors")
    with pytest.raises(TensorMismatchError, match=rf"{name}.*\(\d+, 31\).*\(\.\.\., 32\)"):
        Model.load(copy)


def test_an_integer_embedding_table_is_named(copy):
    tensors = load_file(copy / "model.safetensors")
    tensors["model.embed_tokens.weight"] = torch.zeros(64, 32, dtype=torch.int32)
    save_file(tensors, copy / "model.safetensors")
    with pytest.raises(TensorMismatchError, match="model.embed_tokens.weight.*torch.int32"):
        Model.load(copy)


def test_a_non_gguf_file(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"1234")
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        Model.load(f)
