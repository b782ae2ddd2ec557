"""llama.cpp's `phi3` GGUF against the Hugging Face folder it was converted from: tiny random Phi3ForCausalLM
models converted by llama.cpp 0.3.36's own convert_hf_to_gguf.py. A Phi-4-mini-like one (partial rotary, LongRoPE
whose divisors the file holds as two tensors, tied embeddings): float32 logits and greedy tokens within and past
its original context, its q8_0 file's planned decode step against the modules; a phi-4-like one with a sliding
window; and files missing what LongRoPE needs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers

from engine.cache import Cache
from engine.errors import CorruptFileError
from engine.models import Batch, Model, decode_plan
from engine.models.phi3 import Phi3ForCausalLM
from engine.models.rope import LongRopeTable
from kernels.cpu import blocks as cpu_blocks

ORIGINAL = 32
SHAPE = dict(
    hidden_size=128,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # heads of 32
    initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
)


def _folder(tmp_path_factory, known_tokenizer, name: str, seed: int, **config):
    """A saved random Phi3ForCausalLM with SmolLM2's tokenizer, named a GPT2Tokenizer as Phi-4's is (the
    converter reads a phi3 vocabulary as GPT-2's only then)."""
    folder = tmp_path_factory.mktemp(name)
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(known_tokenizer), bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.save_pretrained(folder)
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tok_config, "tokenizer_class": "GPT2Tokenizer"}))
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    hf = transformers.Phi3ForCausalLM(transformers.Phi3Config(vocab_size=len(tok), **SHAPE, **ids, **config)).eval()
    with torch.no_grad():  # norms are ones at init: make them count
        for name_, p in hf.named_parameters():
            if name_.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
    hf.save_pretrained(folder)
    return folder, hf


@pytest.fixture(scope="module")
def files(converter, known_tokenizer, tmp_path_factory) -> SimpleNamespace:
    g = torch.Generator().manual_seed(2)
    longrope = dict(
        type="longrope",
        short_factor=(1 + 0.5 * torch.rand(12, generator=g)).tolist(),
        long_factor=(1 + 7 * torch.rand(12, generator=g)).tolist(),
    )
    mini_config = dict(
        partial_rotary_factor=0.75,
        max_position_embeddings=256,
        original_max_position_embeddings=ORIGINAL,
        rope_scaling=longrope,
        tie_word_embeddings=True,
    )
    mini, hf = _folder(tmp_path_factory, known_tokenizer, "phi4-mini", 5, **mini_config)
    for outtype in ("f32", "q8_0"):
        converter(mini, mini / f"{outtype}.gguf", mmproj=False, outtype=outtype)
    window, hf_window = _folder(tmp_path_factory, known_tokenizer, "phi3-window", 6, sliding_window=8)
    converter(window, window / "f32.gguf", mmproj=False)
    return SimpleNamespace(
        hf=hf, f32=mini / "f32.gguf", q8_0=mini / "q8_0.gguf", hf_window=hf_window, window=window / "f32.gguf"
    )


def _prompt(n: int, seed: int, vocab: int) -> torch.Tensor:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def _logits(model, prompt: torch.Tensor, pages: int = 5) -> torch.Tensor:
    cache = Cache(model, max_seq_len=16 * pages, page_size=16)
    batch = Batch.build(cache, [list(range(pages))[::-1]], [0], [len(prompt)], logits="all")
    return model(prompt, batch.positions(), batch)


def _greedy(model, prompt: torch.Tensor, steps: int, pages: int = 5) -> list[int]:
    cache = Cache(model, max_seq_len=16 * pages, page_size=16)
    out, past, inputs = [], 0, prompt
    for _ in range(steps):
        batch = Batch.build(cache, [list(range(pages))], [past], [len(inputs)])
        inputs = model(inputs, batch.positions(), batch).argmax(-1)
        past = batch.seq_lens_host[0]
        out.append(int(inputs[0]))
    return out


def _hf_greedy(hf, prompt: torch.Tensor, steps: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(prompt[None], max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


def test_the_file_holds_the_folders_rope(files):
    model = Model.load(files.f32, dtype=torch.float32)
    assert isinstance(model, Phi3ForCausalLM) and model.config.rotary_dim == 24
    assert model.config.tie_word_embeddings and all(
        layer.self_attn.sliding_window is None for layer in model.model.layers
    )
    assert isinstance(model.rope, LongRopeTable) and model.rope.original == ORIGINAL
    assert model.rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(8) / math.log(32)))
    short, long = (torch.tensor(files.hf.config.rope_parameters[key]) for key in ("short_factor", "long_factor"))
    base = 10000.0 ** (torch.arange(0, 24, 2) / 24)
    torch.testing.assert_close(model.rope.inv_freq, 1 / (short * base))
    torch.testing.assert_close(model.rope.long.inv_freq, 1 / (long * base))


@pytest.mark.parametrize("size, pages", [(20, 2), (32, 2), (33, 5), (70, 5)])
def test_the_f32_file_is_transformers(files, size, pages):
    """Within the original context in a cache of 32 tokens (the short divisors), past it in a longer one."""
    model = Model.load(files.f32, dtype=torch.float32)
    prompt = _prompt(size, size, model.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(
            _logits(model, prompt, pages), files.hf(prompt[None]).logits[0], atol=1e-4, rtol=1e-4
        )
    steps = 32 - size if pages == 2 else 10
    if steps:
        assert _greedy(model, prompt, steps, pages) == _hf_greedy(files.hf, prompt, steps)


def test_the_sliding_window_file_is_transformers(files):
    model = Model.load(files.window, dtype=torch.float32)
    assert [layer.self_attn.sliding_window for layer in model.model.layers] == [8, 8]
    assert model.config.rotary_dim == 32 and not isinstance(model.rope, LongRopeTable)
    prompt = _prompt(29, 1, model.config.vocab_size)
    with torch.no_grad():
        ref = files.hf_window(prompt[None]).logits[0]
        torch.testing.assert_close(_logits(model, prompt), ref, atol=1e-4, rtol=1e-4)
    assert _greedy(model, prompt, 12) == _hf_greedy(files.hf_window, prompt, 12)


@pytest.mark.skipif(
    not cpu_blocks.supports("Q8_0", "cpu", torch.bfloat16, 128, 16), reason="needs a C compiler for the block kernels"
)
def test_a_planned_decode_step_of_the_q8_0_file_equals_the_modules(files, monkeypatch):
    """The recorded step turns 24 of each head's 32 dimensions with the long divisors, as the modules do."""
    model = Model.load(files.q8_0)
    assert model.model.layers[0].self_attn.qkv_proj.block_types
    assert decoded_alike(model, [_prompt(n, n, model.config.vocab_size).tolist() for n in (40, 9, 33)], monkeypatch)


def decoded_alike(model, prompts: list[list[int]], monkeypatch) -> bool:
    """Three decode steps after `prompts` give the same bits through a recorded plan and through the modules."""
    outs, caches = [], []
    rows = len(prompts)
    for planned in (True, False):
        cache = Cache(model, max_seq_len=16 * 4 * rows, page_size=16)
        caches.append(cache)
        tables = [[rows * p + i for p in range(4)] for i in range(rows)]
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


def _write_phi3(path: Path, skip_key: str | None = None, skip_tensor: str | None = None) -> None:
    """A one-layer phi3 file with LongRoPE divisors for a rotary of 8, less one key or tensor."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "phi3")
    keys = {"block_count": 1, "embedding_length": 64, "feed_forward_length": 32, "attention.head_count": 4}
    keys |= {"attention.head_count_kv": 2, "context_length": 256, "rope.dimension_count": 8}
    keys |= {"rope.scaling.original_context_length": 32}
    for key, value in keys.items():
        if key != skip_key:
            writer.add_uint32(f"phi3.{key}", value)
    tensors = {"token_embd.weight": np.zeros((10, 64), dtype=np.float32)}
    tensors |= {f"rope_factors_{kind}.weight": np.ones(4, dtype=np.float32) for kind in ("long", "short")}
    for name, data in tensors.items():
        if name != skip_tensor:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(
    "skip, message",
    [
        (dict(skip_key="rope.scaling.original_context_length"), "phi3.rope.scaling.original_context_length"),
        (dict(skip_tensor="rope_factors_short.weight"), "but not rope_factors_short.weight"),
        (dict(skip_key="embedding_length"), "phi3.embedding_length"),
    ],
    ids=["no original context", "one set of divisors", "no embedding length"],
)
def test_a_file_without_what_its_rope_needs_is_refused_naming_it(tmp_path, skip, message):
    _write_phi3(tmp_path / "bad.gguf", **skip)
    with pytest.raises(CorruptFileError, match=message):
        Model.load(tmp_path / "bad.gguf", dtype=torch.float32)
