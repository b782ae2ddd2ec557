"""llama.cpp's `gpt-oss` GGUF against the Hugging Face folder it was converted from: a tiny random
GptOssForCausalLM converted by llama.cpp 0.3.36's own convert_hf_to_gguf.py, once from float experts (F32 in the
file) and once from MXFP4 `_blocks`/`_scales` experts (MXFP4 in the file, as the released gpt-oss GGUFs): float32
logits and greedy tokens against transformers, the MXFP4 experts kept in their blocks in bfloat16, and files
missing a gpt-oss key."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from engine.cache import Cache
from engine.errors import CorruptFileError
from engine.models import Batch, Model
from engine.models.gpt_oss import GptOssForCausalLM
from kernels import ops

BASE = dict(
    hidden_size=64,
    intermediate_size=32,  # each expert's: whole MXFP4 blocks, whole groups of 16 rows
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_local_experts=8,
    num_experts_per_tok=2,
    sliding_window=8,
    max_position_embeddings=512,
    rope_parameters=dict(
        rope_type="yarn",
        factor=4.0,
        beta_fast=32.0,
        beta_slow=1.0,
        truncate=False,
        original_max_position_embeddings=64,
        rope_theta=150000.0,
    ),
    initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
)


@pytest.fixture(scope="module")
def files(converter, known_tokenizer, tmp_path_factory) -> SimpleNamespace:
    """The float folder and its f32 GGUF; the MXFP4 folder, its GGUF, and transformers' model holding its own
    dequantization of the MXFP4 experts."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    folder = tmp_path_factory.mktemp("gpt-oss")
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(known_tokenizer), bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.save_pretrained(folder)
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(5)
    hf = transformers.GptOssForCausalLM(transformers.GptOssConfig(vocab_size=len(tok), **BASE, **ids)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("_bias", "router.bias")):
                p.normal_(0, 0.15)
    hf.save_pretrained(folder)
    converter(folder, folder / "f32.gguf", mmproj=False)

    packed = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    tok.save_pretrained(packed)
    state = load_file(folder / "model.safetensors")
    reference = transformers.GptOssForCausalLM(hf.config).eval()
    reference.load_state_dict(hf.state_dict())
    g = torch.Generator().manual_seed(6)
    for i in range(hf.config.num_hidden_layers):
        experts = reference.model.layers[i].mlp.experts
        for proj, (rows, cols) in (("gate_up_proj", (64, 64)), ("down_proj", (64, 32))):
            blocks = torch.randint(0, 256, (8, rows, cols // 32, 16), generator=g).to(torch.uint8)
            scales = torch.randint(122, 127, (8, rows, cols // 32), generator=g).to(torch.uint8)
            name = f"model.layers.{i}.mlp.experts.{proj}"
            del state[name]
            state[f"{name}_blocks"], state[f"{name}_scales"] = blocks, scales
            with torch.no_grad():
                getattr(experts, proj).copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
    save_file(state, packed / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["router", "self_attn"]}
    (packed / "config.json").write_text(json.dumps(config))
    converter(packed, packed / "mxfp4.gguf", mmproj=False)
    return SimpleNamespace(hf=hf, f32=folder / "f32.gguf", reference=reference, mxfp4=packed / "mxfp4.gguf")


def _prompt(n: int, seed: int, vocab: int) -> torch.Tensor:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def _logits(model, prompt: torch.Tensor) -> torch.Tensor:
    cache = Cache(model, max_seq_len=64, page_size=16)
    batch = Batch.build(cache, [[1, 3, 0, 2]], [0], [len(prompt)], logits="all")
    return model(prompt, batch.positions(), batch)


def _greedy(model, prompt: torch.Tensor, steps: int) -> list[int]:
    cache = Cache(model, max_seq_len=96, page_size=16)
    out, past, inputs = [], 0, prompt
    for _ in range(steps):
        batch = Batch.build(cache, [[4, 1, 5, 0, 2, 3]], [past], [len(inputs)])
        inputs = model(inputs, batch.positions(), batch).argmax(-1)
        past = batch.seq_lens_host[0]
        out.append(int(inputs[0]))
    return out


def test_the_float_file_is_transformers(files):
    model = Model.load(files.f32, dtype=torch.float32)
    assert isinstance(model, GptOssForCausalLM)
    assert [layer.self_attn.sliding_window for layer in model.model.layers] == [8, None, 8, None]
    prompt = _prompt(29, 1, model.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(_logits(model, prompt), files.hf(prompt[None]).logits[0], atol=1e-4, rtol=1e-4)
        ref = files.hf.generate(prompt[None], max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert _greedy(model, prompt, 12) == ref[0, len(prompt) :].tolist()


def test_the_mxfp4_file_is_transformers_dequantizing_its_folder(files):
    """The converter repacks the folder's blocks into ggml's MXFP4 (gate and up split): our float32 logits are
    those of transformers' model on its own dequantization of the folder."""
    import gguf

    reader = gguf.GGUFReader(files.mxfp4)
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == "MXFP4" and types["blk.0.ffn_down_exps.weight"] == "MXFP4"
    model = Model.load(files.mxfp4, dtype=torch.float32)
    prompt = _prompt(25, 2, model.config.vocab_size)
    with torch.no_grad():
        ref = files.reference(prompt[None]).logits[0]
        torch.testing.assert_close(_logits(model, prompt), ref, atol=1e-4, rtol=1e-4)


def test_the_mxfp4_experts_stay_in_their_blocks_in_bfloat16(files):
    model = Model.load(files.mxfp4, dtype=torch.bfloat16)
    if not ops.can_keep_blocks("MXFP4", "cpu", torch.bfloat16, 64, 32):
        pytest.skip("no C kernel for MXFP4 blocks on this machine")
    experts = model.model.layers[0].mlp
    assert experts.experts_gate_up.block_types == ["MXFP4x16"] and experts.experts_down.block_types == ["MXFP4x16"]
    prompt = _prompt(25, 2, model.config.vocab_size)
    exact = _logits(Model.load(files.mxfp4, dtype=torch.float32), prompt)
    # the yardstick: the same bfloat16 model with its experts expanded to bfloat16 floats
    expanded = _logits(Model.load(files.mxfp4, dtype=torch.bfloat16, quantized=None), prompt)
    got = _logits(model, prompt)
    # Error sizes, not argmax agreement: a tiny random model's logits are full of bfloat16 near-ties.
    assert (got - exact).abs().mean() < 2 * (expanded - exact).abs().mean()


@pytest.mark.parametrize("missing", ["expert_count", "expert_used_count", "expert_feed_forward_length"])
def test_a_file_without_a_gpt_oss_key_is_refused_naming_it(tmp_path: Path, missing):
    import gguf

    keys = {"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 32, "attention.sliding_window": 8}
    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "gpt-oss")
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(32)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    for key, value in keys.items():
        if key != missing:
            writer.add_uint32(f"gpt-oss.{key}", value)
    writer.add_tensor("token_embd.weight", np.zeros((10, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CorruptFileError, match=f"gpt-oss.{missing}"):
        Model.load(tmp_path / "bad.gguf", dtype=torch.float32)
