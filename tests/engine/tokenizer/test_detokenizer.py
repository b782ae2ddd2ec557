"""engine.tokenizer.detokenizer.StreamingDetokenizer on a byte-fallback sentencepiece vocabulary, a small byte-level
BPE trained here and the starter GGUF: streamed text equals decode(), never half a character."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.tokenizer.detokenizer import StreamingDetokenizer
from engine.tokenizer.spm import MODEL_BPE, PIECE_BYTE, PIECE_CONTROL, PIECE_NORMAL, SpmModel, build_spm_tokenizer
from engine.tokenizer.tokenizer import Tokenizer

SPM_WORDS = ["▁", "▁h", "▁he", "▁hel", "▁hell", "▁hello", "▁w", "▁wo", "▁wor", "▁worl", "▁world"]
SPM_CHARS = list("helowrdé日本")


@pytest.fixture(scope="module")
def spm_tok() -> Tokenizer:
    """Llama-style vocabulary: a few words, every byte as <0xNN>; anything else falls back to bytes."""
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *SPM_WORDS, *SPM_CHARS]
    types = [2, PIECE_CONTROL, PIECE_CONTROL, *[PIECE_BYTE] * 256, *[PIECE_NORMAL] * (len(SPM_WORDS) + len(SPM_CHARS))]
    model = SpmModel(pieces=pieces, scores=[0.0] * len(pieces), types=types, model_type=MODEL_BPE, byte_fallback=True)
    return Tokenizer(build_spm_tokenizer(model), bos_token_id=1, eos_token_id=2, unk_token_id=0)


@pytest.fixture(scope="module")
def bytelevel_tok() -> Tokenizer:
    """Byte-level BPE with a small vocabulary, so most non-ASCII characters span several tokens."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, pre_tokenizers, trainers
    from tokenizers.models import BPE

    backend = Backend(BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    rng = random.Random(0)
    words = "hello world stream token café 日本語 テキスト emoji 😀 🎉 end".split()
    corpus = [" ".join(rng.choices(words, k=10)) for _ in range(300)]
    trainer = trainers.BpeTrainer(
        vocab_size=290,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer)
    return Tokenizer(backend, eos_token_id=backend.token_to_id("<|endoftext|>"))


@pytest.fixture(scope="module")
def starter_tok(starter_gguf) -> Tokenizer:
    return Tokenizer.load(starter_gguf)


def _stream(tok: Tokenizer, ids: list[int], decode_special_tokens: bool = False) -> list[str]:
    detok = StreamingDetokenizer(tok, decode_special_tokens=decode_special_tokens)
    return [detok.add(i) for i in ids] + [detok.flush()]


def test_emoji_over_byte_fallback_tokens_comes_out_whole(spm_tok):
    ids = spm_tok.encode("hello 😀 world")[0].tolist()
    pieces = [spm_tok.id_to_piece(i) for i in ids]
    assert pieces[1:6] == ["▁", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    chunks = _stream(spm_tok, ids)
    assert chunks == ["hello", " ", "", "", "", "😀", " world", ""]


def test_character_split_over_byte_level_tokens_comes_out_whole(bytelevel_tok):
    text = "x ✅ 日本語 😀"
    ids = bytelevel_tok.encode(text)[0].tolist()
    chunks = _stream(bytelevel_tok, ids)
    assert "".join(chunks) == text
    assert all("\ufffd" not in c for c in chunks)
    check = next(n for n, c in enumerate(chunks) if "✅" in c)
    assert chunks[check - 1] == ""  # "✅" (3 bytes) is not one token in this vocabulary: held, then whole


def test_sentencepiece_spaces(spm_tok):
    ids = spm_tok.encode("hello  world")[0].tolist()
    assert [spm_tok.id_to_piece(i) for i in ids] == ["▁hello", "▁", "▁world"]
    # the start-of-text space is dropped once, as decode() drops it; later spaces are kept
    assert _stream(spm_tok, ids) == ["hello", " ", " world", ""]
    assert _stream(spm_tok, ids[1:]) == ["", " world", ""]
    assert spm_tok.decode(ids[1:]) == " world"


@pytest.mark.parametrize("decode_special_tokens", [False, True])
def test_special_tokens(spm_tok, decode_special_tokens):
    ids = [1, *spm_tok.encode("hello")[0].tolist(), 2, *spm_tok.encode(" world")[0].tolist()]
    chunks = _stream(spm_tok, ids, decode_special_tokens)
    assert "".join(chunks) == spm_tok.decode(ids, decode_special_tokens=decode_special_tokens)
    assert "".join(chunks) == ("<s> hello</s> world" if decode_special_tokens else "hello world")


def test_ids_outside_the_vocabulary_are_skipped(spm_tok):
    ids = spm_tok.encode("hello world")[0].tolist()
    image = [spm_tok.vocab_size + k for k in range(3)]
    chunks = _stream(spm_tok, ids[:1] + image + ids[1:])
    assert "".join(chunks) == "hello world"


def test_flush_emits_an_incomplete_tail_and_starts_afresh(spm_tok):
    head = spm_tok.encode("hello 😀")[0].tolist()[:-2]  # cut the emoji after two of its four bytes
    detok = StreamingDetokenizer(spm_tok)
    shown = "".join(detok.add(i) for i in head)
    assert shown == "hello "
    assert shown + detok.flush() == spm_tok.decode(head)  # the two bytes are invalid on their own
    # a new sequence: its first "▁" is a start-of-text space again
    assert "".join(detok.add(i) for i in spm_tok.encode("world")[0].tolist()) == "world"


def test_each_step_decodes_a_small_window(starter_tok):
    text = "Streaming keeps a short window of context. 日本語のテキスト 😀\n" * 60
    ids = starter_tok.encode(text)[0].tolist()
    decoded = []
    original = starter_tok.decode

    def counting_decode(token_ids, decode_special_tokens=False):
        decoded.append(len(token_ids))
        return original(token_ids, decode_special_tokens)

    starter_tok.decode = counting_decode
    try:
        chunks = _stream(starter_tok, ids)
    finally:
        del starter_tok.decode
    assert "".join(chunks) == starter_tok.decode(ids)
    assert len(ids) > 1000
    assert max(decoded) <= 8  # never the whole sequence


text_strategy = st.text(st.characters(exclude_categories=("Cs",)), max_size=40) | st.lists(
    st.sampled_from(["hello", " ", "  ", "\n", "é", "日本", "😀", "👩‍👩‍👧", "<s>", "</s>", "<|endoftext|>", "\t"]),
    max_size=12,
).map("".join)


@pytest.mark.parametrize("case", ["spm_tok", "bytelevel_tok"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=text_strategy, special=st.booleans())
def test_stream_equals_decode(case, text, special, request):
    tok = request.getfixturevalue(case)
    ids = tok.encode(text, encode_special_tokens=True)[0].tolist()
    chunks = _stream(tok, ids, special)
    assert "".join(chunks) == tok.decode(ids, decode_special_tokens=special)
    if "\ufffd" not in text:
        assert all("\ufffd" not in c for c in chunks), chunks
