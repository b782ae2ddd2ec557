"""engine.tokenizer.tokenizer against transformers' AutoTokenizer on five real tokenizers built or fetched here:

1. a sentencepiece BPE model (byte fallback) trained in a fixture, saved as a Llama-style HF folder;
2. a byte-level BPE tokenizer.json trained with the tokenizers library, with added special tokens;
3. the starter GGUF (byte-level BPE vocabulary, pre-tokenizer "smollm");
4. a sentencepiece-kind GGUF written with gguf.GGUFWriter from model 1;
5. a byte-level (gpt2-kind) GGUF written from tokenizer 2, pre-tokenizer "qwen2".

Each is compared on ~200 strings: encoding with and without special-token parsing, and decoding with
and without special tokens. Then attributes, per-token text, and the bad inputs listed at the end.
"""

from __future__ import annotations

import importlib.util
import json
import random
import threading
from pathlib import Path

import pytest
import torch

from engine.errors import CorruptFileError, MissingFileError, ModelLoadError, TokenizerLoadError
from engine.loading.starter import STARTER_NAME
from engine.tokenizer.tokenizer import Tokenizer

WORDS = (
    "the quick brown fox jumps over a lazy dog while tokenizers stream text token by token "
    "café naïve résumé Zürich straße déjà vu 日本語 東京 中文 字符 테스트 한국어 Привет мир "
    "مرحبا नमस्ते def return class import lambda self None True 0 1 42 3.14 2024 ( ) [ ] { } : ; , . ! ? "
    "+= == != -> => && || // /* */ # @ $ % ^ & * _ - = ' \""
).split()
CONTROL = ("<|im_start|>", "<|im_end|>")
USER_DEFINED = ("<think>", "</think>")
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def _corpus(num_lines: int = 3000) -> list[str]:
    rng = random.Random(0)
    lines = []
    for _ in range(num_lines):
        words = rng.choices(WORDS, k=rng.randint(3, 14))
        sep = rng.choice([" ", " ", " ", "  ", "\t", " \n "])
        lines.append(sep.join(words))
    return lines


def _parity_strings() -> list[str]:
    fixed = [
        "",
        " ",
        "  ",
        "   ",
        "\t",
        "\n",
        "\n\n",
        "\r\n",
        " \n ",
        "\t\t\tindent",
        "hello",
        " hello",
        "  hello",
        "hello ",
        "hello   world",
        "hello\tworld\t\ttabs",
        "line one\nline two\n\nline four\n",
        "The quick brown fox jumps over the lazy dog.",
        "café naïve résumé",
        "e\u0301 combining accent",
        "日本語のテキスト",
        "中文字符测试",
        "테스트 한국어",
        "Привет, мир!",
        "مرحبا بالعالم",
        "नमस्ते दुनिया",
        "emoji 😀 smile",
        "🎉🎉🎉",
        "family 👩‍👩‍👧 zwj",
        "flag 🇯🇵 and skin 👍🏽",
        "math ∑ ∫ √ ≠ ≤ ∞",
        "nbsp\u00a0space and\u3000ideographic",
        "zero\u200bwidth",
        "def f(x):\n    return x ** 2  # square\n",
        "for (int i = 0; i < n; ++i) { sum += a[i]; }",
        "if x != None and y == 'it\\'s':",
        '{"key": [1, 2, 3], "nested": {"a": null}}',
        "12345 67890 3.14159 2024-01-01",
        "I'm sure you'll see they've done it, haven't they?",
        "UPPER lower MiXeD",
        "<s>",
        "</s>",
        "<unk>",
        "<s>hello</s>",
        "hello <s> world </s> end",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "<|im_end|>",
        "<|endoftext|>",
        "text<|endoftext|>more",
        "<|im_start|> spaced <|im_end|>",
        "<think>reasoning</think> answer",
        "<thinking> not a token",
        "<|im_ partial <|im_end",
        "<<s>>",
        "<|tool|> and <|extra|> declared in tokenizer_config.json",
        "a\x00b control",
        "tab\tand\x0bvertical\x0cform",
        "\u00ff\u0100 latin ext",
        "☃ ★ ♥",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math letters",
        "…“quotes”‘single’",
    ]
    pieces = [
        *WORDS,
        "😀",
        "🎉",
        "👩‍👩‍👧",
        "\n",
        "\t",
        "  ",
        "   ",
        *CONTROL,
        *USER_DEFINED,
        "<s>",
        "</s>",
        "<|endoftext|>",
        "<|tool|>",
        "<|extra|>",
    ]
    rng = random.Random(1)
    generated = []
    while len(fixed) + len(generated) < 200:
        parts = rng.choices(pieces, k=rng.randint(1, 12))
        generated.append("".join(p if rng.random() < 0.3 else " " + p for p in parts))
    return fixed + generated


STRINGS = _parity_strings()


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def spm_folder(tmp_path_factory) -> Path:
    import sentencepiece as spm

    folder = tmp_path_factory.mktemp("spm")
    (folder / "corpus.txt").write_text("\n".join(_corpus()), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(folder / "corpus.txt"),
        model_prefix=str(folder / "sp"),
        vocab_size=400,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=0.98,  # leaves rare characters (emoji) to byte fallback
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        split_digits=True,
        control_symbols=list(CONTROL),
        user_defined_symbols=list(USER_DEFINED),
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    (folder / "sp.model").rename(folder / "tokenizer.model")
    (folder / "sp.vocab").unlink()
    (folder / "corpus.txt").unlink()
    config = {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "legacy": False,
        # declared only here (as when a token was added after training): becomes id 400
        "added_tokens_decoder": {
            "400": {"content": "<|tool|>", "special": True, "normalized": False, "lstrip": False, "rstrip": False}
        },
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def bpe_folder(tmp_path_factory) -> Path:
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import BPE

    folder = tmp_path_factory.mktemp("bpe")
    backend = Backend(BPE())
    backend.normalizer = normalizers.NFC()
    split = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|endoftext|>", *CONTROL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_corpus(), trainer)
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in USER_DEFINED])
    backend.save(str(folder / "tokenizer.json"))
    ids = {t: backend.token_to_id(t) for t in ("<|endoftext|>", *CONTROL)}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "additional_special_tokens": ["<|extra|>"],  # not in tokenizer.json: added as a new special token
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "config.json").write_text(json.dumps({"eos_token_id": ids["<|endoftext|>"]}), encoding="utf-8")
    gen = {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]}
    (folder / "generation_config.json").write_text(json.dumps(gen), encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def spm_gguf(spm_folder, tmp_path_factory) -> Path:
    import gguf

    from engine.tokenizer.spm import read_spm_model

    model = read_spm_model(spm_folder / "tokenizer.model")
    path = tmp_path_factory.mktemp("spm_gguf") / "tiny-spm.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(model.pieces)
    writer.add_token_scores(model.scores)
    writer.add_token_types(model.types)
    writer.add_bos_token_id(model.bos_id)
    writer.add_eos_token_id(model.eos_id)
    writer.add_unk_token_id(model.unk_id)
    writer.add_eot_token_id(model.pieces.index("<|im_end|>"))
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def bpe_gguf(bpe_folder, tmp_path_factory) -> Path:
    """The byte-level tokenizer.json of `bpe_folder` as a gpt2-kind GGUF with pre-tokenizer "qwen2"."""
    import gguf

    data = json.loads((bpe_folder / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    tokens = [None] * (len(vocab) + len(USER_DEFINED))
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for token, idx in vocab.items():
        tokens[idx] = token
    for added in data["added_tokens"]:
        tokens[added["id"]] = added["content"]
        types[added["id"]] = gguf.TokenType.CONTROL if added["special"] else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    path = tmp_path_factory.mktemp("bpe_gguf") / "tiny-bpe.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _reference(path: Path):
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    if path.suffix != ".gguf":
        if (path / "tokenizer.model").is_file() and importlib.util.find_spec("google.protobuf") is None:
            pytest.fail("transformers reads tokenizer.model only with the protobuf package: add it to the test extras")
        return AutoTokenizer.from_pretrained(str(path))
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if path.name == STARTER_NAME:
        # transformers' GGUF loader has no split for pre-tokenizer "smollm" and falls back to GPT-2's;
        # SmolLM2's own tokenizer.json (and llama.cpp) isolate every digit first. Compare with that.
        ref.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    return ref


CASES = ("spm_folder", "bpe_folder", "starter_gguf", "spm_gguf", "bpe_gguf")


@pytest.fixture(scope="session")
def load_case(request):
    """Tokenizer.load for a case name, once per session (the starter GGUF takes seconds to parse)."""
    cache: dict[str, Tokenizer] = {}

    def get(case: str) -> Tokenizer:
        if case not in cache:
            cache[case] = Tokenizer.load(request.getfixturevalue(case))
        return cache[case]

    return get


@pytest.fixture(scope="session", params=CASES)
def pair(request, load_case) -> tuple[Tokenizer, object]:
    """(ours, transformers') for one of the five tokenizers."""
    return load_case(request.param), _reference(Path(request.getfixturevalue(request.param)))


def _mismatches(pairs) -> list:
    return [(s, got, want) for s, got, want in pairs if got != want]


# ------------------------------------------------------------------------------------ transformers parity


def test_encode_with_special_tokens_matches_transformers(pair):
    ours, ref = pair
    bad = _mismatches(
        (s, ours.encode(s, encode_special_tokens=True)[0].tolist(), ref(s, add_special_tokens=False)["input_ids"])
        for s in STRINGS
    )
    assert not bad, f"{len(bad)} of {len(STRINGS)} differ, first: {bad[0]}"


def test_encode_plain_text_matches_transformers_split_special_tokens(pair):
    ours, ref = pair
    bad = _mismatches(
        (
            s,
            ours.encode(s)[0].tolist(),
            ref(s, add_special_tokens=False, split_special_tokens=True)["input_ids"],
        )
        for s in STRINGS
    )
    assert not bad, f"{len(bad)} of {len(STRINGS)} differ, first: {bad[0]}"


def test_encode_with_the_models_bos_matches_transformers(pair):
    ours, ref = pair
    assert ours.add_bos_token == ref.add_bos_token
    bad = _mismatches(
        (s, ours.encode(s, add_bos=ours.add_bos_token, encode_special_tokens=True)[0].tolist(), ref(s)["input_ids"])
        for s in STRINGS
    )
    assert not bad, f"{len(bad)} of {len(STRINGS)} differ, first: {bad[0]}"


@pytest.mark.parametrize("decode_special_tokens", [False, True])
def test_decode_matches_transformers(pair, decode_special_tokens):
    ours, ref = pair
    rows = [ref(s, add_special_tokens=True)["input_ids"] for s in STRINGS]
    rows.append(list(range(min(ours.vocab_size, 1000))))  # every kind of token, incl. lone byte tokens
    bad = _mismatches(
        (ids, ours.decode(ids, decode_special_tokens), ref.decode(ids, skip_special_tokens=not decode_special_tokens))
        for ids in rows
    )
    assert not bad, f"{len(bad)} of {len(rows)} differ, first: {bad[0]}"


def test_special_ids_match_transformers(pair):
    ours, ref = pair
    assert ours.vocab_size == len(ref)
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (
        ref.bos_token_id,
        ref.eos_token_id,
        ref.pad_token_id,
    )
    assert (ours.bos_token, ours.eos_token) == (ref.bos_token, ref.eos_token)
    # the tokens transformers skips when decoding without special tokens
    assert ours.special_token_ids == {i for i, t in ref.added_tokens_decoder.items() if t.special}
    assert ours.eos_token_id in ours.eos_token_ids


def test_bos_from_a_tokenizer_json_post_processor(bpe_folder, tmp_path):
    # no add_bos_token in tokenizer_config.json: the post-processor says whether BOS comes first
    from tokenizers import Tokenizer as Backend
    from tokenizers import processors

    backend = Backend.from_file(str(bpe_folder / "tokenizer.json"))
    bos = backend.token_to_id("<|endoftext|>")
    backend.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", pair="<|endoftext|> $A $B", special_tokens=[("<|endoftext|>", bos)]
    )
    backend.save(str(tmp_path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours, ref = Tokenizer.load(tmp_path), _reference(tmp_path)
    assert ours.add_bos_token is True and ours.add_eos_token is False
    for s in STRINGS[:50]:
        assert ours.encode(s, add_bos=True, encode_special_tokens=True)[0].tolist() == ref(s)["input_ids"], s


def test_legacy_sentencepiece_folder_matches_transformers(spm_folder, tmp_path):
    # legacy=True: "▁" is prepended after every special token too, not only at the start of the text
    (tmp_path / "tokenizer.model").write_bytes((spm_folder / "tokenizer.model").read_bytes())
    config = json.loads((spm_folder / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "legacy": True}))
    ours, ref = Tokenizer.load(tmp_path), _reference(tmp_path)
    assert (
        ours.encode("<s>hello", encode_special_tokens=True).tolist()
        != Tokenizer.load(spm_folder).encode("<s>hello", encode_special_tokens=True).tolist()
    )
    for s in STRINGS:
        assert (
            ours.encode(s, encode_special_tokens=True)[0].tolist() == ref(s, add_special_tokens=False)["input_ids"]
        ), s


def test_unigram_tokenizer_json_with_clean_up_matches_transformers(tmp_path):
    # transformers applies clean_up_tokenization_spaces to non-BPE models only; so do we
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, pre_tokenizers, trainers
    from tokenizers.models import Unigram

    backend = Backend(Unigram())
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"], unk_token="<unk>")
    backend.train_from_iterator(_corpus(500), trainer)
    backend.save(str(tmp_path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": True,
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours, ref = Tokenizer.load(tmp_path), _reference(tmp_path)
    texts = [*STRINGS, "a . b , c ! d ? it ' s do n't I 'm we 've they 're"]
    for s in texts:
        ids = ref(s, add_special_tokens=False)["input_ids"]
        assert ours.encode(s, encode_special_tokens=True)[0].tolist() == ids, s
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True), s
    assert ours.decode(ours.encode("a . b")) == "a. b"


def test_gguf_sentencepiece_encodes_like_the_tokenizer_model(load_case):
    from_model, from_gguf = load_case("spm_folder"), load_case("spm_gguf")
    for s in (s for s in STRINGS if "<|tool|>" not in s):  # declared in the folder's config only
        assert (
            from_gguf.encode(s, encode_special_tokens=True).tolist()
            == from_model.encode(s, encode_special_tokens=True).tolist()
        ), s


def test_gguf_byte_level_encodes_like_the_tokenizer_json(load_case):
    import unicodedata

    from_json, from_gguf = load_case("bpe_folder"), load_case("bpe_gguf")
    for s in (unicodedata.normalize("NFC", s) for s in STRINGS if "<|extra|>" not in s):  # NFC: the json's normalizer
        assert (
            from_gguf.encode(s, encode_special_tokens=True).tolist()
            == from_json.encode(s, encode_special_tokens=True).tolist()
        ), s


def test_trained_model_really_uses_byte_fallback(spm_folder):
    tok = Tokenizer.load(spm_folder)
    pieces = [tok.id_to_piece(i) for i in tok.encode("😀")[0].tolist()]
    assert pieces[-4:] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]


# ------------------------------------------------------------------------------------------- attributes


def test_folder_metadata(bpe_folder):
    tok = Tokenizer.load(bpe_folder)
    ids = {t: tok.piece_to_id(t) for t in ("<|endoftext|>", "<|im_end|>", "<think>")}
    assert tok.bos_token_id is None and tok.bos_token is None
    assert tok.eos_token == "<|im_end|>"
    assert tok.eos_token_ids == {ids["<|endoftext|>"], ids["<|im_end|>"]}  # config + generation_config
    assert tok.pad_token_id == ids["<|endoftext|>"]
    assert tok.chat_template == CHAT_TEMPLATE
    assert ids["<think>"] not in tok.special_token_ids
    # a non-special added token is matched whole in either mode
    assert ids["<think>"] in tok.encode("a <think> b")[0].tolist()


def test_gguf_metadata(load_case):
    tok = load_case("spm_gguf")
    assert tok.eos_token_ids == {tok.eos_token_id, tok.piece_to_id("<|im_end|>")}  # eos + eot
    assert tok.chat_template == CHAT_TEMPLATE
    assert tok.add_bos_token is True
    starter = load_case("starter_gguf")
    assert (starter.bos_token, starter.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert starter.add_bos_token is False
    assert "<|im_start|>" in starter.chat_template


def test_starter_splits_digits_like_smollm(load_case):
    # "smollm" isolates every digit before BPE; SmolLM2's own tokenizer does the same
    starter = load_case("starter_gguf")
    pieces = [starter.id_to_piece(i) for i in starter.encode("year 2024")[0].tolist()]
    assert pieces[-4:] == ["2", "0", "2", "4"]


def test_encode_shapes_and_bos_eos(spm_folder):
    tok = Tokenizer.load(spm_folder)
    empty = tok.encode("")
    assert empty.dtype == torch.long and empty.shape == (1, 0)
    ids = tok.encode("hello world", add_bos=True, add_eos=True)
    assert ids.shape[0] == 1 and ids[0, 0] == tok.bos_token_id and ids[0, -1] == tok.eos_token_id
    with pytest.raises(TypeError):
        tok.encode(["not", "a", "string"])


def test_decode_inputs(spm_folder):
    tok = Tokenizer.load(spm_folder)
    ids = tok.encode("hello world 😀")
    text = "hello world 😀"
    assert tok.decode(ids) == tok.decode(ids[0]) == tok.decode(ids[0].tolist()) == text
    # image-token ids lie outside the vocabulary and have no text
    assert tok.decode([tok.vocab_size + 5, *ids[0].tolist(), -1]) == text
    with pytest.raises(ValueError, match="one sequence"):
        tok.decode(torch.cat([ids, ids]))


def test_special_tokens_parsed_only_when_asked(bpe_folder):
    tok = Tokenizer.load(bpe_folder)
    im_start = tok.piece_to_id("<|im_start|>")
    assert tok.encode("<|im_start|>user", encode_special_tokens=True)[0, 0] == im_start
    assert im_start not in tok.encode("<|im_start|>user")[0].tolist()
    assert tok.decode(tok.encode("<|im_start|>user")) == "<|im_start|>user"


def test_encode_with_embeddings(bpe_folder):
    tok = Tokenizer.load(bpe_folder)

    class Image:
        text_alias = "<$img0$>"

        def get_ids(self):
            return torch.arange(tok.vocab_size + 10, tok.vocab_size + 14)

    ids = tok.encode("look: <$img0$> what is it?", embeddings=[Image()])[0].tolist()
    start = ids.index(tok.vocab_size + 10)
    assert ids[start : start + 4] == list(range(tok.vocab_size + 10, tok.vocab_size + 14))
    assert tok.decode(ids[:start]) == "look: " and tok.decode(ids[start + 4 :]) == " what is it?"


def test_concurrent_encodes_keep_their_mode(bpe_folder):
    tok = Tokenizer.load(bpe_folder)
    text = "<|im_start|>user hello<|im_end|>" * 20
    want = {mode: tok.encode(text, encode_special_tokens=mode).tolist() for mode in (False, True)}
    errors = []

    def worker(mode: bool) -> None:
        for _ in range(200):
            if tok.encode(text, encode_special_tokens=mode).tolist() != want[mode]:
                errors.append(mode)

    threads = [threading.Thread(target=worker, args=(i % 2 == 0,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("decode_special_tokens", [False, True])
def test_streaming_detokenizer_reproduces_decode(case, decode_special_tokens, load_case):
    from engine.tokenizer.detokenizer import StreamingDetokenizer

    tok = load_case(case)
    for s in STRINGS:
        ids = tok.encode(s, encode_special_tokens=True)[0].tolist()
        detok = StreamingDetokenizer(tok, decode_special_tokens=decode_special_tokens)
        chunks = [detok.add(i) for i in ids] + [detok.flush()]
        assert "".join(chunks) == tok.decode(ids, decode_special_tokens=decode_special_tokens), s
        assert not any("\ufffd" in c for c in chunks), (s, chunks)


# --------------------------------------------------------------------------------------- per-token text


@pytest.mark.parametrize("case", CASES)
def test_token_bytes_concatenate_to_the_decoded_text(case, load_case):
    tok = load_case(case)
    for s in STRINGS:
        ids = tok.encode(s, encode_special_tokens=True)[0].tolist()
        joined = b"".join(tok.token_bytes[i] for i in ids).decode("utf-8", errors="replace")
        decoded = tok.decode(ids, decode_special_tokens=True)
        # sentencepiece decoding drops the space its "▁" prefix adds at the start of a text
        if ids and (tok.id_to_piece(ids[0]) or "").startswith("▁") and ids[0] not in tok.special_token_ids:
            decoded = " " + decoded
        assert joined == decoded, s


def test_token_texts_and_pieces(spm_folder):
    tok = Tokenizer.load(spm_folder)
    word = next(i for i in range(tok.vocab_size) if tok.id_to_piece(i).startswith("▁") and len(tok.id_to_piece(i)) > 2)
    piece = tok.id_to_piece(word)
    assert tok.piece_to_id(piece) == word
    assert tok.token_texts()[word] == " " + piece[1:]
    assert tok.token_bytes[tok.piece_to_id("<0x0A>")] == b"\n"
    assert tok.token_texts()[tok.eos_token_id] == ""
    assert tok.token_texts(decode_special_tokens=True)[tok.eos_token_id] == "</s>"
    assert len(tok.token_texts()) == tok.vocab_size


# ------------------------------------------------------------------------------------------- bad inputs


def test_missing_path(tmp_path):
    with pytest.raises(MissingFileError, match="does not exist"):
        Tokenizer.load(tmp_path / "nope")


def test_folder_without_tokenizer(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(TokenizerLoadError, match="tokenizer.json"):
        Tokenizer.load(tmp_path)
    with pytest.raises(TokenizerLoadError, match="not a tokenizer file"):
        Tokenizer.load(tmp_path / "config.json")


@pytest.mark.parametrize("content", ["{not json", '{"version": "1.0", "model": {"type": "Nope"}}', ""])
def test_corrupt_tokenizer_json(tmp_path, content):
    (tmp_path / "tokenizer.json").write_text(content)
    with pytest.raises(TokenizerLoadError, match="tokenizer.json"):
        Tokenizer.load(tmp_path)


def test_truncated_tokenizer_json(bpe_folder, tmp_path):
    data = (bpe_folder / "tokenizer.json").read_bytes()
    (tmp_path / "tokenizer.json").write_bytes(data[: len(data) // 2])
    with pytest.raises(TokenizerLoadError, match="download it again"):
        Tokenizer.load(tmp_path)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_tokenizer_model(spm_folder, tmp_path, damage):
    data = (spm_folder / "tokenizer.model").read_bytes()
    bad = b"\xff" * 64 if damage == "garbage" else data[: len(data) // 2]
    (tmp_path / "tokenizer.model").write_bytes(bad)
    with pytest.raises(TokenizerLoadError, match="tokenizer.model"):
        Tokenizer.load(tmp_path)


def test_corrupt_tokenizer_config(bpe_folder, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((bpe_folder / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": ')
    with pytest.raises(TokenizerLoadError, match="tokenizer_config.json"):
        Tokenizer.load(tmp_path)


def _write_gguf(path: Path, **tokenizer) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    if "model" in tokenizer:
        writer.add_tokenizer_model(tokenizer["model"])
    if "tokens" in tokenizer:
        writer.add_token_list(tokenizer["tokens"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_without_vocabulary(tmp_path):
    path = _write_gguf(tmp_path / "novocab.gguf")
    with pytest.raises(TokenizerLoadError, match="no tokenizer vocabulary"):
        Tokenizer.load(path)


def test_gguf_with_unsupported_tokenizer_kind(tmp_path):
    path = _write_gguf(tmp_path / "bert.gguf", model="bert", tokens=["[PAD]", "[UNK]", "hello"])
    with pytest.raises(TokenizerLoadError, match="'bert'"):
        Tokenizer.load(path)


def test_gguf_byte_level_without_merges(tmp_path):
    path = _write_gguf(tmp_path / "nomerges.gguf", model="gpt2", tokens=["a", "b", "ab"])
    with pytest.raises(TokenizerLoadError, match="merges"):
        Tokenizer.load(path)


def test_corrupt_gguf(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF" + b"\x00" * 10)
    with pytest.raises(CorruptFileError):
        Tokenizer.load(path)
    assert issubclass(TokenizerLoadError, ModelLoadError)
