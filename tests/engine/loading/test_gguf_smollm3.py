"""llama.cpp's `smollm3` GGUF against the Hugging Face folder it was converted from: a tiny random
SmolLM3ForCausalLM (every fourth layer without rotary, as released) converted by llama.cpp 0.3.36's own
convert_hf_to_gguf.py: float32 logits and greedy tokens of the f32 file (q/k rows in llama.cpp's order undone), the
q8_0 file's planned decode step against the modules, and a file missing a key."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers

from engine.cache import Cache
from engine.errors import CorruptFileError
from engine.models import Batch, Model, decode_plan
from engine.models.smollm3 import SmolLM3ForCausalLM
from kernels.cpu import blocks as cpu_blocks

SHAPE = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
)


@pytest.fixture(scope="module")
def files(converter, known_tokenizer, tmp_path_factory) -> SimpleNamespace:
    folder = tmp_path_factory.mktemp("smollm3")
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(known_tokenizer), bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.save_pretrained(folder)
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(8)
    hf = transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(vocab_size=len(tok), **SHAPE, **ids)).eval()
    with torch.no_grad():  # norms are ones at init: make them count
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
    hf.save_pretrained(folder)
    for outtype in ("f32", "q8_0"):
        converter(folder, folder / f"{outtype}.gguf", mmproj=False, outtype=outtype)
    return SimpleNamespace(hf=hf, f32=folder / "f32.gguf", q8_0=folder / "q8_0.gguf")


def _prompt(n: int, seed: int, vocab: int) -> torch.Tensor:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def test_the_f32_file_is_transformers(files):
    model = Model.load(files.f32, dtype=torch.float32)
    assert isinstance(model, SmolLM3ForCausalLM) and model.config.tie_word_embeddings
    assert [layer.self_attn.rotary for layer in model.model.layers] == [True, True, True, False]
    assert model.config.rope_theta == files.hf.config.rope_parameters["rope_theta"]
    prompt = _prompt(27, 1, model.config.vocab_size)
    cache = Cache(model, max_seq_len=64, page_size=16)
    batch = Batch.build(cache, [[2, 0, 3, 1]], [0], [len(prompt)], logits="all")
    with torch.no_grad():
        ref = files.hf(prompt[None]).logits[0]
        torch.testing.assert_close(model(prompt, batch.positions(), batch), ref, atol=1e-4, rtol=1e-4)
        expected = files.hf.generate(
            prompt[None], max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    cache = Cache(model, max_seq_len=64, page_size=16)
    out, past, inputs = [], 0, prompt
    for _ in range(12):
        batch = Batch.build(cache, [[1, 3, 0, 2]], [past], [len(inputs)])
        inputs = model(inputs, batch.positions(), batch).argmax(-1)
        past = batch.seq_lens_host[0]
        out.append(int(inputs[0]))
    assert out == expected[0, len(prompt) :].tolist()


@pytest.mark.skipif(
    not cpu_blocks.supports("Q8_0", "cpu", torch.bfloat16, 64, 16), reason="needs a C compiler for the block kernels"
)
def test_a_planned_decode_step_of_the_q8_0_file_equals_the_modules(files, monkeypatch):
    """The recorded step leaves the last layer's q and k unturned, as the modules do."""
    model = Model.load(files.q8_0)
    assert model.model.layers[0].self_attn.qkv_proj.block_types
    assert decoded_alike(model, [_prompt(n, n, model.config.vocab_size).tolist() for n in (30, 7)], monkeypatch)


def decoded_alike(model, prompts: list[list[int]], monkeypatch) -> bool:
    """Three decode steps after `prompts` give the same bits through a recorded plan and through the modules."""
    outs, caches, rows = [], [], len(prompts)
    tables = [[rows * p + i for p in range(4)] for i in range(rows)]
    for planned in (True, False):
        caches.append(cache := Cache(model, max_seq_len=16 * 4 * rows, page_size=16))
        batch = Batch.build(cache, tables, [0] * rows, [len(p) for p in prompts])
        with torch.inference_mode(), monkeypatch.context() as m:
            if not planned:
                m.setattr(decode_plan, "covers", lambda batch, inputs: False)
            model(torch.tensor([t for p in prompts for t in p]), batch.positions(), batch)
            steps = []
            for step in range(3):
                batch = Batch.build(cache, tables, [len(p) + step for p in prompts], [1] * rows)
                steps.append(model(torch.tensor([5 + step] * rows), batch.positions(), batch))
        outs.append(torch.stack(steps))
    assert decode_plan.plans_for(model, caches[0]).get(rows) is not None, "no plan was recorded"
    return torch.equal(outs[0], outs[1])


def test_a_file_without_a_key_is_refused_naming_it(tmp_path: Path):
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "smollm3")
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_tensor("token_embd.weight", np.zeros((10, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CorruptFileError, match="smollm3.feed_forward_length"):
        Model.load(tmp_path / "bad.gguf", dtype=torch.float32)
