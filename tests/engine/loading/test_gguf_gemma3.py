"""llama.cpp's `gemma3` text GGUF against the Hugging Face folder it was converted from: a tiny random
Gemma3ForCausalLM, converted by llama.cpp 0.3.36's own convert_hf_to_gguf.py, loaded by Tandem: its layer kinds,
window, rotary bases and scale, then the logits of prompts longer than the window against transformers (float32
and bfloat16) and greedy tokens. Also the metadata rules the file leaves to llama.cpp's runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from engine.cache import Cache
from engine.config.gguf import gemma3_text_keys
from engine.gguf.checkpoint import load_gguf
from engine.models import Batch, Model
from engine.models.gemma3 import Gemma3ForCausalLM

WINDOW = 4
# llama.cpp reads no layer pattern from a gemma3 file (its converter writes none): five sliding layers, then a
# full one. It has no query_pre_attn_scalar either: head_dim, as in every released Gemma 3 below 27B.
BASE = dict(
    hidden_size=80,  # sqrt(80) is not exact in bfloat16, so the embedding scale's rounding is visible
    intermediate_size=96,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,  # heads * head_dim != hidden_size
    query_pre_attn_scalar=24,
    sliding_window=WINDOW,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
    },
    max_position_embeddings=512,
    initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
)
CASES = {
    "tied-softcap": dict(tie_word_embeddings=True, final_logit_softcapping=3.0),
    "untied": dict(tie_word_embeddings=False),
}


def _build(name: str, folder: Path, tokenizer_json: Path, **shape) -> transformers.Gemma3ForCausalLM:
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_json), bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.save_pretrained(folder)
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = transformers.Gemma3TextConfig(vocab_size=len(tok), **{**BASE, **shape}, **CASES[name], **ids)
    assert config.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    torch.manual_seed(11)
    hf = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # the norms start at zero, i.e. a scale of exactly 1: make (1 + weight) matter
        for param_name, p in hf.named_parameters():
            if "norm" in param_name:
                p.normal_(0, 0.3)
    hf.save_pretrained(folder)
    return hf


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, converter, known_tokenizer, tmp_path_factory):
    """(case, transformers model, Tandem's model of the converted text.gguf, its path)."""
    folder = tmp_path_factory.mktemp(request.param)
    hf = _build(request.param, folder, known_tokenizer)
    converter(folder, folder / "text.gguf", mmproj=False)
    return request.param, hf, Model.load(folder / "text.gguf", dtype=torch.float32), folder / "text.gguf"


def _prompt(n: int, seed: int, vocab: int) -> torch.Tensor:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    cache = Cache(model, max_seq_len=64, page_size=4)
    batch = Batch.build(cache, [[3, 0, 5, 1, 7, 2]], [0], [len(ids)], logits="all")
    return model(ids, batch.positions(), batch)


def test_the_file_reads_as_the_folders_gemma3(pair):
    name, hf, ours, path = pair
    assert isinstance(ours, Gemma3ForCausalLM) and ours.config.vocab_size == hf.config.vocab_size
    assert [layer.is_sliding for layer in ours.model.layers] == [
        t == "sliding_attention" for t in hf.config.layer_types
    ]
    assert [layer.self_attn.sliding_window for layer in ours.model.layers] == [WINDOW] * 5 + [None]
    assert ours.model.layers[0].self_attn.scale == 24**-0.5
    assert ours.settings.final_logit_softcapping == hf.config.final_logit_softcapping
    folder = Model.load(path.parent, dtype=torch.float32)
    for rope in ("rope", "local_rope"):  # bases 5000 (linear x2) and 100
        torch.testing.assert_close(getattr(ours, rope).inv_freq, getattr(folder, rope).inv_freq, rtol=0, atol=0)
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == hf.config.tie_word_embeddings, name


def test_norm_weights_lose_the_converters_plus_one(pair):
    _, hf, _, path = pair
    _, tensors = load_gguf(path)
    reference = hf.state_dict()
    for key in (
        "model.norm.weight",
        "model.layers.5.pre_feedforward_layernorm.weight",
        "model.layers.0.self_attn.q_norm.weight",
    ):
        torch.testing.assert_close(tensors[key], reference[key], rtol=0, atol=1e-7)


def test_logits_of_prompts_longer_than_the_window_match_transformers(pair):
    name, hf, ours, _ = pair
    for seed, n in ((1, 13), (2, 21)):
        ids = _prompt(n, seed, hf.config.vocab_size)
        with torch.no_grad():
            ref = hf(input_ids=ids[None]).logits[0]
        torch.testing.assert_close(_logits(ours, ids), ref, atol=1e-4, rtol=1e-4, msg=f"{name}: {n} tokens")


def test_bfloat16_logits_match_transformers_in_bfloat16(pair):
    name, hf, _, path = pair
    ours = Model.load(path, dtype=torch.bfloat16)
    ref_model = transformers.Gemma3ForCausalLM.from_pretrained(path.parent, dtype=torch.bfloat16).eval()
    ids = _prompt(17, 5, ours.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(ours.embed(ids), ref_model.model.embed_tokens(ids)), name  # the scale rounds alike
        ref = ref_model(input_ids=ids[None]).logits[0].float()
        exact = hf(input_ids=ids[None]).logits[0]
    got = _logits(ours, ids)
    # Both bfloat16 runs are measured against the float32 logits: ours must be about as close as transformers'
    # own. (A fixed tolerance of 0.05 against transformers' bfloat16 logits held on AVX-512 CPUs, whose kernels
    # round as torch's do; on an AVX2 CPU the two runs were 0.118 apart, each about 0.15 from float32.)
    ours_error, their_error = (got - exact).abs().max(), (ref - exact).abs().max()
    assert ours_error <= 1.5 * their_error + 1e-3, (name, ours_error, their_error)
    # The folder in bfloat16 computes the same: the norms' round trip through +1 is exact to float32 precision.
    folder = _logits(Model.load(path.parent, dtype=torch.bfloat16), ids)
    torch.testing.assert_close(got, folder, atol=1e-3, rtol=0, msg=name)


def test_greedy_tokens_match_transformers(pair):
    name, hf, ours, _ = pair
    steps, prompt = 24, _prompt(9, 4, hf.config.vocab_size)
    cache = Cache(ours, max_seq_len=64, page_size=4)
    table, past, inputs, generated = [[4, 9, 1, 12, 0, 6, 10, 2, 14]], 0, prompt, []
    for _ in range(steps):
        batch = Batch.build(cache, table, [past], [len(inputs)])
        inputs = ours(inputs, batch.positions(), batch).argmax(-1)
        past = batch.seq_lens_host[0]
        generated.append(int(inputs))
    with torch.no_grad():
        ref = hf.generate(input_ids=prompt[None], max_new_tokens=steps, do_sample=False, eos_token_id=None)
    assert generated == ref[0, len(prompt) :].tolist(), name


def test_a_q8_0_files_embeddings_stay_in_blocks_and_the_tied_head_reads_them(converter, known_tokenizer, tmp_path):
    """In bfloat16 on a CPU a quantized table stays in its blocks (rows of 256 values, a row count that is a
    multiple of 16), as for Llama: the lookup expands only the rows it reads and the tied head shares them."""
    _build("tied-softcap", tmp_path, known_tokenizer, hidden_size=256)
    converter(tmp_path, tmp_path / "q8_0.gguf", mmproj=False, outtype="q8_0")
    packed = Model.load(tmp_path / "q8_0.gguf", dtype=torch.bfloat16)
    expanded = Model.load(tmp_path / "q8_0.gguf", dtype=torch.bfloat16, quantized=None)
    table_type = packed.model.embed_tokens.block_type
    assert table_type.startswith("Q8_0") and packed.lm_head.block_types == [table_type]  # Q8_0, or repacked
    assert packed.lm_head.blocks0.data_ptr() == packed.model.embed_tokens.blocks.data_ptr()  # one table
    ids = _prompt(11, 6, packed.config.vocab_size)
    assert torch.equal(packed.embed(ids), expanded.embed(ids))
    ours, theirs = _logits(packed, ids), _logits(expanded, ids)
    # The block kernels round activations to 8 bits, and bfloat16 alone moves these random logits by 0.14 of 3
    # from float32: a tenth of the largest logit, and each row's choice the other's best within that.
    atol = 0.1 * theirs.abs().max().item()
    torch.testing.assert_close(ours, theirs, atol=atol, rtol=0)
    chosen = theirs.gather(-1, ours.argmax(-1, keepdim=True)).squeeze(-1)
    assert torch.all(chosen >= theirs.amax(-1) - atol)


def _meta(**keys) -> dict:
    base = {"block_count": 12, "embedding_length": 80, "attention.head_count": 4, "attention.key_length": 24}
    return {f"gemma3.{k}": v for k, v in {**base, "attention.sliding_window": 512, **keys}.items()}


@pytest.mark.parametrize(
    "keys, sliding",
    [
        ({}, [True] * 5 + [False] + [True] * 5 + [False]),  # llama.cpp's default pattern of 6
        ({"attention.sliding_window_pattern": 3}, [True, True, False] * 4),
        ({"attention.sliding_window_pattern": [True, False] * 6}, [True, False] * 6),  # one flag per layer
        ({"attention.sliding_window": 0}, [False] * 12),  # no window: every layer is global
    ],
)
def test_the_layer_pattern_follows_llama_cpps_rules(keys, sliding):
    layer_types = gemma3_text_keys(_meta(**keys))["layer_types"]
    assert layer_types == ["sliding_attention" if s else "full_attention" for s in sliding]


def test_the_query_scale_and_rope_bases_the_file_leaves_out():
    small = gemma3_text_keys(_meta())
    assert small["query_pre_attn_scalar"] == 24 and small["rope_local_base_freq"] == 10000.0
    assert small["final_logit_softcapping"] is None
    # Gemma 3 27B (62 layers): hidden / heads, its config's query_pre_attn_scalar of 168
    large = gemma3_text_keys(_meta(**{"block_count": 62, "embedding_length": 5376, "attention.head_count": 32}))
    assert large["query_pre_attn_scalar"] == 168
