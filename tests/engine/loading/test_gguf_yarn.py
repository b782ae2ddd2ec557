"""yarn rope scaling in GGUF files: tiny Llama and Qwen3 folders with yarn `rope_parameters`, converted by llama.cpp
0.3.36's own convert_hf_to_gguf.py, load with the folder's rope (the same scaling, logits within 1e-4 of the
folder's past the original context); and the yarn keys other families' files carry, read as transformers reads the
config they came from."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import transformers

from engine.cache import Cache
from engine.config.gguf import _rope_scaling
from engine.errors import CorruptFileError, ModelLoadError
from engine.gguf.checkpoint import load_gguf
from engine.models import Batch, Model

ORIGINAL = 32  # the original context, which the prompt runs well past
CASES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"factor": 4.0}),
    "qwen3": (
        transformers.Qwen3Config,
        transformers.Qwen3ForCausalLM,
        {"factor": 8.0, "beta_fast": 16.0, "beta_slow": 2.0, "attention_factor": 1.25},
    ),
}


def _build(name: str, folder: Path, tokenizer_json: Path):
    config_cls, model_cls, yarn = CASES[name]
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_json), bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.save_pretrained(folder)
    config = config_cls(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=int(ORIGINAL * yarn["factor"]),
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 100.0,
            "original_max_position_embeddings": ORIGINAL,
            **yarn,
        },
        initializer_range=0.15,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(5)
    model_cls(config).eval().save_pretrained(folder)


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, converter, known_tokenizer, tmp_path_factory):
    """(case, Tandem's model of the folder, of the converted text.gguf)."""
    folder = tmp_path_factory.mktemp(request.param)
    _build(request.param, folder, known_tokenizer)
    converter(folder, folder / "text.gguf", mmproj=False)
    return request.param, Model.load(folder, dtype=torch.float32), Model.load(folder / "text.gguf", dtype=torch.float32)


def test_the_file_has_the_folders_rope(pair):
    name, folder, file = pair
    assert folder.config.rope_scaling.rope_type == "yarn"
    assert file.config.rope_scaling == folder.config.rope_scaling, name
    torch.testing.assert_close(file.rope.inv_freq, folder.rope.inv_freq, rtol=0, atol=0)
    assert file.rope.attention_factor == folder.rope.attention_factor


def test_logits_past_the_original_context_match_the_folders(pair):
    name, folder, file = pair
    ids = torch.randint(3, folder.config.vocab_size, (100,), generator=torch.Generator().manual_seed(2))
    logits = []
    for model in (folder, file):
        cache = Cache(model, max_seq_len=128, page_size=16)
        batch = Batch.build(cache, [list(range(cache.num_pages))], [0], [len(ids)], logits="all")
        logits.append(model(ids, batch.positions(), batch))
    torch.testing.assert_close(logits[1], logits[0], atol=1e-4, rtol=1e-4, msg=name)


def _llama_with(gguf_kit, metadata: dict):
    model = gguf_kit.model(
        "LlamaForCausalLM", hidden_size=48, intermediate_size=72, num_hidden_layers=1, num_attention_heads=3
    )
    return gguf_kit.write(model, extra_metadata=metadata).path


def test_a_log_multiplier_is_mscale_all_dim(gguf_kit):
    # Ministral 3's configs say mscale = mscale_all_dim = 1: no magnitude change at all.
    yarn = {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 16.0}
    config, _ = load_gguf(_llama_with(gguf_kit, {**yarn, "llama.rope.scaling.yarn_log_multiplier": 1.0}))
    assert config.rope_scaling.attention_factor == 1.0
    config, _ = load_gguf(_llama_with(gguf_kit, yarn))
    assert config.rope_scaling.attention_factor == pytest.approx(0.1 * math.log(16.0) + 1)
    assert config.rope_scaling.original_max_position_embeddings == config.max_position_embeddings


def test_yarn_without_a_factor_names_the_key(gguf_kit):
    with pytest.raises(CorruptFileError, match="llama.rope.scaling.factor"):
        load_gguf(_llama_with(gguf_kit, {"llama.rope.scaling.type": "yarn"}))


def test_position_scaled_queries_are_refused(gguf_kit):
    with pytest.raises(ModelLoadError, match="temperature_scale"):
        load_gguf(_llama_with(gguf_kit, {"llama.attention.temperature_scale": 0.1}))


def test_gpt_oss_yarn_is_untruncated():
    metadata = {"gpt-oss.rope.scaling.type": "yarn", "gpt-oss.rope.scaling.factor": 32.0}
    scaling = _rope_scaling(
        Path("x.gguf"), "gpt-oss", lambda key, default=None: metadata.get(f"gpt-oss.{key}", default)
    )
    assert scaling == {"rope_type": "yarn", "factor": 32.0, "truncate": False}
