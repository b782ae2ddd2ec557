"""Build a `tokenizers.Tokenizer` from the vocabulary a GGUF file embeds (llama.cpp's metadata keys).

Two kinds are supported, named by `tokenizer.ggml.model`:

- `gpt2`: byte-level BPE. Tokens and merges are stored; how text is split before BPE is not, only
  a name for it in `tokenizer.ggml.pre`. `PRE_TOKENIZER_SPLITS` maps those names to the split regexes
  of the original tokenizer.json files (the ones llama.cpp uses too), applied one after the other.
- `llama`: sentencepiece (BPE with byte fallback). Pieces and scores are stored; merges are implied
  by the scores, and the pipeline is the Llama one from engine.tokenizer.spm.

Token types (`tokenizer.ggml.token_type`): control (3) and unknown (2) tokens become special added
tokens, user-defined (4) tokens added tokens that are always matched whole, as llama.cpp does.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.errors import TokenizerLoadError
from engine.tokenizer.spm import (
    PIECE_BYTE,
    PIECE_CONTROL,
    PIECE_NORMAL,
    PIECE_UNKNOWN,
    PIECE_USER_DEFINED,
    added_tokens_for,
    merges_from_vocab,
    register_added_tokens,
    spm_pipeline,
)

if TYPE_CHECKING:
    from engine.gguf.file import GGUFFile

log = logging.getLogger(__name__)

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*|\p{{N}}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTION}"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTION}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK_V3 = (
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)


def _names(names: str, splits: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    return dict.fromkeys(names.split(), splits)


# tokenizer.ggml.pre -> split regexes, applied in order (each splits the pieces the previous one left)
PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    **_names(
        "default gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert mpt "
        "olmo jais trillion granite-docling exaone4 jina-v1-en jina-v2-code roberta-bpe",
        (_GPT2,),
    ),
    **_names(
        "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano dbrx smaug-bpe "
        "glm4 chatglm-bpe",
        (_LLAMA3,),
    ),
    **_names("qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open", (_QWEN2,)),
    **_names("qwen35", (_QWEN35,)),
    **_names("starcoder refact command-r smollm codeshell exaone minerva-7b mellum2", (r"\p{N}", _GPT2)),
    **_names("tekken", (_TEKKEN,)),
    **_names("gpt-4o llama4 kanana2 talkie minimax-m2", (_GPT4O,)),
    **_names("deepseek-v3 hunyuan-dense joyai-llm hy_v4", _DEEPSEEK_V3),
    **_names("deepseek-coder", (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}")),
    **_names("falcon", (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
    **_names("bloom poro-chat gpt3-finnish", (r" ?[^(\s|.,!?…。，、।۔،)]+",)),
}

# Pre-tokenizers whose vocabularies hold whole words that their merges would not build (llama.cpp and
# the original tokenizer.json look a pre-token up in the vocabulary before merging).
IGNORE_MERGES = frozenset(
    "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano tekken".split()
)
# llama.cpp adds BOS by default for these byte-level vocabularies (and for every sentencepiece one)
ADD_BOS_DEFAULT = IGNORE_MERGES | {"chameleon"}


@dataclass
class GGUFVocab:
    """A tokenizer backend built from GGUF metadata, with the special token ids the file names."""

    backend: Any  # tokenizers.Tokenizer
    kind: str  # "gpt2" or "llama"
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    unk_token_id: int | None = None
    pad_token_id: int | None = None
    add_bos_token: bool = False
    add_eos_token: bool = False
    extra_eos_token_ids: set[int] = field(default_factory=set)
    chat_template: str | None = None


def _field(gguf: GGUFFile, key: str) -> Any:
    """One metadata value (None when absent)."""
    return gguf.metadata.get(key)


def _token_id(gguf: GGUFFile, key: str, num_tokens: int) -> int | None:
    value = _field(gguf, key)
    if value is None:
        return None
    if not 0 <= int(value) < num_tokens:
        log.warning("%s: %s = %s is outside the vocabulary (%d tokens); ignored", gguf.path, key, value, num_tokens)
        return None
    return int(value)


def _byte_level_pre_tokenizer(pre: str | None, path: Any):
    from tokenizers import Regex, pre_tokenizers

    splits = PRE_TOKENIZER_SPLITS.get(pre or "default")
    if splits is None:
        log.warning(
            "%s names pre-tokenizer %r, which Tandem does not know; splitting text like GPT-2. "
            "Encodings may differ slightly from the model's own tokenizer.",
            path,
            pre,
        )
        splits = (_GPT2,)
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


def _byte_level_backend(tokens: list[str], types: list[int], merges: list[str] | None, pre: str | None, path):
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import BPE
    from tokenizers.pre_tokenizers import ByteLevel

    if merges is None:
        raise TokenizerLoadError(
            f"{path} has a byte-level (gpt2) vocabulary but no tokenizer.ggml.merges; the file is incomplete. "
            "Convert the model again or use its Hugging Face folder."
        )
    alphabet = set(ByteLevel.alphabet())
    byte_to_char = byte_to_char_table()
    vocab: dict[str, int] = {}
    for idx, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind == PIECE_NORMAL and not set(token) <= alphabet:
            # a normal token must be spelled in the byte alphabet for BPE to reach it
            token = "".join(byte_to_char[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, idx)
    # llama.cpp splits a merge at the first space after its first character (a token may start with one)
    pairs = []
    for merge in merges:
        cut = merge.find(" ", 1)
        if cut > 0:
            pairs.append((merge[:cut], merge[cut + 1 :]))
    backend = Tokenizer(
        BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False, ignore_merges=pre in IGNORE_MERGES)
    )
    backend.pre_tokenizer = _byte_level_pre_tokenizer(pre, path)
    backend.decoder = decoders.ByteLevel()
    return backend


def _spm_backend(tokens: list[str], scores: list[float] | None, types: list[int], unk: int | None, prefix: bool):
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    vocab: dict[str, int] = {}
    for idx, token in enumerate(tokens):
        vocab.setdefault(token, idx)
    score_of = dict(zip(tokens, scores, strict=True)) if scores is not None else None
    backend = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges_from_vocab(vocab, score_of),
            unk_token=tokens[unk] if unk is not None else None,
            fuse_unk=True,
            byte_fallback=PIECE_BYTE in types,
        )
    )
    spm_pipeline(backend, prefix)
    return backend


def build_gguf_vocab(gguf: GGUFFile) -> GGUFVocab:
    """Build the tokenizer a GGUF file describes. Raises TokenizerLoadError when it has none we can build."""
    path = gguf.path
    kind = _field(gguf, "tokenizer.ggml.model")
    tokens = _field(gguf, "tokenizer.ggml.tokens")
    if kind is None or not tokens:
        raise TokenizerLoadError(
            f"{path} has no tokenizer vocabulary (tokenizer.ggml.model / tokenizer.ggml.tokens are missing). "
            "Put the model's tokenizer.json or tokenizer.model next to it, or use a GGUF that includes one."
        )
    if kind not in ("gpt2", "llama"):
        raise TokenizerLoadError(
            f"{path} uses tokenizer kind {kind!r}; Tandem reads only 'gpt2' (byte-level BPE) and 'llama' "
            "(sentencepiece) vocabularies from GGUF files. Use the model's Hugging Face folder instead."
        )
    num = len(tokens)
    types = _field(gguf, "tokenizer.ggml.token_type") or [PIECE_NORMAL] * num
    scores = _field(gguf, "tokenizer.ggml.scores")
    if len(types) != num or (scores is not None and len(scores) != num):
        raise TokenizerLoadError(
            f"{path} is inconsistent: {num} tokens but {len(types)} token types"
            f"{'' if scores is None else f' and {len(scores)} scores'}. The file is damaged; download it again."
        )
    pre = _field(gguf, "tokenizer.ggml.pre")
    ids = {
        name: _token_id(gguf, f"tokenizer.ggml.{name}_token_id", num)
        for name in ("bos", "eos", "unknown", "padding", "eot", "eom")
    }
    if kind == "llama":
        # llama.cpp's defaults for sentencepiece vocabularies when the file does not say
        ids["bos"] = ids["bos"] if ids["bos"] is not None else (1 if num > 1 else None)
        ids["eos"] = ids["eos"] if ids["eos"] is not None else (2 if num > 2 else None)
        ids["unknown"] = ids["unknown"] if ids["unknown"] is not None else 0
        prefix = _field(gguf, "tokenizer.ggml.add_space_prefix")
        backend = _spm_backend(
            tokens,
            scores,
            types,
            ids["unknown"],
            True if prefix is None else bool(prefix),
        )
        add_bos_default = True
    else:
        backend = _byte_level_backend(tokens, types, _field(gguf, "tokenizer.ggml.merges"), pre, path)
        add_bos_default = pre in ADD_BOS_DEFAULT
    named = {
        i for i in (ids["bos"], ids["eos"], ids["unknown"], ids["padding"], ids["eot"], ids["eom"]) if i is not None
    }
    kinds = [t if t in (PIECE_CONTROL, PIECE_UNKNOWN, PIECE_USER_DEFINED) else PIECE_NORMAL for t in types]
    register_added_tokens(backend, added_tokens_for(tokens, kinds, named))
    # read here rather than through engine.chat_template.find_chat_template, which would open and
    # parse the whole file a second time (seconds for a large vocabulary)
    template = _field(gguf, "tokenizer.chat_template")
    add_bos = _field(gguf, "tokenizer.ggml.add_bos_token")
    add_eos = _field(gguf, "tokenizer.ggml.add_eos_token")
    return GGUFVocab(
        backend=backend,
        kind=kind,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        unk_token_id=ids["unknown"],
        pad_token_id=ids["padding"],
        add_bos_token=add_bos_default if add_bos is None else bool(add_bos),
        add_eos_token=bool(add_eos) if add_eos is not None else False,
        extra_eos_token_ids={i for i in (ids["eot"], ids["eom"]) if i is not None},
        chat_template=template if isinstance(template, str) and template.strip() else None,
    )


@functools.cache
def byte_to_char_table() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the alphabet byte-level vocabularies are spelled in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table
