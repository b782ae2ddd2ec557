"""One tokenizer over Hugging Face folders (tokenizer.json or sentencepiece tokenizer.model) and GGUF files.

Every kind becomes a `tokenizers.Tokenizer` backend, so encoding and decoding are one code path:

    folder/tokenizer.json   -> loaded as is
    folder/tokenizer.model  -> converted by engine.tokenizer_spm (no protobuf needed)
    model.gguf              -> built from the embedded vocabulary by engine.tokenizer_gguf

A folder's tokenizer_config.json / special_tokens_map.json then add the tokens they declare, the way
`transformers` does, so `encode` matches `AutoTokenizer(...)(text, add_special_tokens=False)`.
BOS/EOS are never added by the backend: `encode(add_bos=...)` decides, and `add_bos_token` says what
the model expects.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from engine.errors import MissingFileError, TokenizerLoadError

if TYPE_CHECKING:
    from engine.gguf_file import GGUFFile

log = logging.getLogger(__name__)

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# transformers' clean_up_tokenization_spaces (applied only to non-BPE models, as transformers 5 does)
_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"))
_CLEAN_UP += ((" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


class TextAliasEmbedding(Protocol):
    """What `encode(embeddings=...)` needs from a multimodal embedding: the placeholder string that stands
    for it in the prompt, and the token ids (outside the vocabulary) that replace that string."""

    text_alias: str

    def get_ids(self) -> torch.Tensor | Sequence[int]: ...


class Tokenizer:
    """Text <-> token ids for one model. Build it with `Tokenizer.load(path)`.

    Attributes: `vocab_size` (with added tokens), `bos_token_id` / `eos_token_id` / `pad_token_id` /
    `unk_token_id` (None when the model has none), `bos_token` / `eos_token` (their text),
    `eos_token_ids` (every id that ends a reply: the tokenizer's eos, config.json's and
    generation_config.json's eos ids, GGUF eot/eom), `add_bos_token` (whether the model expects BOS
    first), `special_token_ids`, `chat_template` (Jinja source or None).

    Per-token text for generators: `id_to_piece(i)` is the vocabulary entry as stored ("▁the", "Ġthe",
    "<0x0A>"); `token_bytes[i]` is the exact bytes token i adds to a text when it appears mid-sequence
    (may be part of a UTF-8 character); `token_texts()` is the same as strings.
    """

    def __init__(
        self,
        backend: Any,
        *,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        unk_token_id: int | None = None,
        extra_eos_token_ids: Iterable[int] = (),
        add_bos_token: bool = False,
        add_eos_token: bool = False,
        chat_template: str | None = None,
        clean_up_tokenization_spaces: bool = False,
        source: Path | None = None,
    ):
        self.backend = backend  # tokenizers.Tokenizer; never adds special tokens itself
        self.backend.no_padding()
        self.backend.no_truncation()
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.unk_token_id = unk_token_id
        self.add_bos_token = add_bos_token
        self.add_eos_token = add_eos_token
        self.chat_template = chat_template
        self.source = source
        self.eos_token_ids: set[int] = {
            i for i in (eos_token_id, *extra_eos_token_ids) if i is not None and 0 <= i < self.vocab_size
        }
        self.special_token_ids: set[int] = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        self._clean_up = clean_up_tokenization_spaces
        # the backend's encode_special_tokens switch is shared state: flip it and encode under one lock
        self._encode_lock = threading.Lock()
        self._texts: dict[bool, list[str]] = {}

    # ----------------------------------------------------------------------------------------- loading

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load the tokenizer of a model folder, a tokenizer.json / tokenizer.model file, or a .gguf file.

        Raises MissingFileError when `path` does not exist, TokenizerLoadError when no tokenizer can be
        built from it (no tokenizer files, corrupt files, a GGUF without a vocabulary).
        """
        path = Path(path)
        if not path.exists():
            raise MissingFileError(f"{path} does not exist. Give a model folder or a .gguf file.")
        if path.is_file():
            if path.suffix.lower() == ".gguf":
                from engine.gguf_file import GGUFFile

                return cls.from_gguf(GGUFFile.open(path))
            if path.name in ("tokenizer.json", "tokenizer.model"):
                path = path.parent
            else:
                raise TokenizerLoadError(
                    f"{path} is not a tokenizer file. Give the model folder, its tokenizer.json or "
                    "tokenizer.model, or a .gguf file."
                )
        return cls._from_folder(path)

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> Tokenizer:
        """Build the tokenizer embedded in an opened GGUF file (shares the model loader's GGUFFile)."""
        from engine.tokenizer_gguf import build_gguf_vocab

        vocab = build_gguf_vocab(gguf)
        return cls(
            vocab.backend,
            bos_token_id=vocab.bos_token_id,
            eos_token_id=vocab.eos_token_id,
            pad_token_id=vocab.pad_token_id,
            unk_token_id=vocab.unk_token_id,
            extra_eos_token_ids=vocab.extra_eos_token_ids,
            add_bos_token=vocab.add_bos_token,
            add_eos_token=vocab.add_eos_token,
            chat_template=vocab.chat_template,
            source=gguf.path,
        )

    @classmethod
    def _from_folder(cls, folder: Path) -> Tokenizer:
        json_file, spm_file = folder / "tokenizer.json", folder / "tokenizer.model"
        config = _read_json(folder / "tokenizer_config.json")
        if json_file.is_file():
            backend = _read_tokenizer_json(json_file)
            is_spm = False
        elif spm_file.is_file():
            from engine.tokenizer_spm import build_spm_tokenizer, read_spm_model

            prefix = config.get("add_prefix_space")
            backend = build_spm_tokenizer(
                read_spm_model(spm_file), None if prefix is None else bool(prefix), bool(config.get("legacy", False))
            )
            is_spm = True
        else:
            ggufs = sorted(folder.glob("*.gguf"))
            if len(ggufs) == 1:
                return cls.load(ggufs[0])
            raise TokenizerLoadError(
                f"{folder} has no tokenizer: expected tokenizer.json, tokenizer.model or one .gguf file in it. "
                "Download the model's tokenizer files into the folder."
            )
        special_map = _read_json(folder / "special_tokens_map.json")
        named = _register_declared_tokens(backend, config, special_map)
        ids = {key: backend.token_to_id(text) if text is not None else None for key, text in named.items()}

        prefix_ids, suffix_ids = _post_processor_affixes(backend)
        add_bos = config.get("add_bos_token")
        if add_bos is None:
            # sentencepiece (Llama) tokenizers add BOS unless told otherwise; tokenizer.json ones say so
            # through their post-processor
            add_bos = is_spm or (ids["bos"] is not None and ids["bos"] in prefix_ids)
        add_eos = config.get("add_eos_token")
        if add_eos is None:
            add_eos = ids["eos"] is not None and ids["eos"] in suffix_ids

        extra_eos = set()
        for name in ("config.json", "generation_config.json"):
            value = _read_json(folder / name).get("eos_token_id")
            extra_eos.update(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, int))

        clean_up = bool(config.get("clean_up_tokenization_spaces", False))
        is_bpe = type(backend.model).__name__ == "BPE"
        return cls(
            backend,
            bos_token_id=ids["bos"],
            eos_token_id=ids["eos"],
            pad_token_id=ids["pad"],
            unk_token_id=ids["unk"],
            extra_eos_token_ids=extra_eos,
            add_bos_token=bool(add_bos),
            add_eos_token=bool(add_eos),
            chat_template=_chat_template(folder),
            clean_up_tokenization_spaces=clean_up and not is_bpe,
            source=folder,
        )

    # ---------------------------------------------------------------------------------------- encoding

    def encode(
        self,
        text: str,
        add_bos: bool = False,
        add_eos: bool = False,
        encode_special_tokens: bool = False,
        embeddings: Sequence[TextAliasEmbedding] | None = None,
    ) -> torch.Tensor:
        """Token ids of `text` as a LongTensor of shape [1, n].

        encode_special_tokens=True turns special-token strings in the text ("<|im_start|>") into their
        ids, as a rendered chat template needs; False tokenizes them as plain text, as user-typed text
        needs. Added tokens that are not special are always matched whole. `embeddings`: each one's
        `text_alias` in the text is replaced by its token ids (`get_ids()`).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, not {type(text).__name__}")
        if embeddings:
            ids = self._encode_with_aliases(text, embeddings, encode_special_tokens)
        else:
            ids = self.encode_ids(text, encode_special_tokens)
        if add_bos and self.bos_token_id is not None:
            ids.insert(0, self.bos_token_id)
        if add_eos and self.eos_token_id is not None:
            ids.append(self.eos_token_id)
        return torch.tensor([ids], dtype=torch.long)  # [1, num_tokens]

    def encode_ids(self, text: str, encode_special_tokens: bool = False) -> list[int]:
        """Token ids of `text` as a list, without BOS/EOS (see `encode`)."""
        with self._encode_lock:
            # the backend's flag means the opposite: "encode special tokens as plain text"
            self.backend.encode_special_tokens = not encode_special_tokens
            return self.backend.encode(text, add_special_tokens=False).ids

    def _encode_with_aliases(
        self, text: str, embeddings: Sequence[TextAliasEmbedding], encode_special_tokens: bool
    ) -> list[int]:
        by_alias = {e.text_alias: e for e in embeddings}
        pattern = re.compile("|".join(re.escape(a) for a in sorted(by_alias, key=len, reverse=True)))
        ids: list[int] = []
        pos = 0
        for match in pattern.finditer(text):
            ids += self.encode_ids(text[pos : match.start()], encode_special_tokens)
            alias_ids = by_alias[match.group()].get_ids()
            ids += alias_ids.flatten().tolist() if isinstance(alias_ids, torch.Tensor) else list(alias_ids)
            pos = match.end()
        return ids + self.encode_ids(text[pos:], encode_special_tokens)

    # ---------------------------------------------------------------------------------------- decoding

    def decode(self, ids: torch.Tensor | Sequence[int], decode_special_tokens: bool = False) -> str:
        """Text of token ids (a 1-D tensor, a [1, n] tensor or a list of ints).

        Special tokens are left out unless `decode_special_tokens`; ids outside the vocabulary (image
        token ids) are always left out.
        """
        keep = [i for i in _id_list(ids) if 0 <= i < self.vocab_size]
        if not decode_special_tokens:
            keep = [i for i in keep if i not in self.special_token_ids]
        text = self.backend.decode(keep, skip_special_tokens=False)
        if self._clean_up:
            for old, new in _CLEAN_UP:
                text = text.replace(old, new)
        return text

    # ------------------------------------------------------------------------------- per-token access

    @property
    def bos_token(self) -> str | None:
        return self.id_to_piece(self.bos_token_id) if self.bos_token_id is not None else None

    @property
    def eos_token(self) -> str | None:
        return self.id_to_piece(self.eos_token_id) if self.eos_token_id is not None else None

    def id_to_piece(self, token_id: int) -> str | None:
        """The vocabulary entry of `token_id` as stored ("▁the", "Ġthe", "<0x0A>", "<|im_end|>")."""
        return self.backend.id_to_token(int(token_id))

    def piece_to_id(self, piece: str) -> int | None:
        """The id of a vocabulary entry, or None when there is no such entry."""
        return self.backend.token_to_id(piece)

    @cached_property
    def token_bytes(self) -> list[bytes]:
        """For every id, the bytes the token adds to a decoded text in the middle of a sequence.

        Byte-fallback tokens give their single byte and byte-level tokens their raw bytes, so an entry
        can be part of a UTF-8 character; sentencepiece "▁" is a space (the start-of-text space that
        `decode` strips is not). Added/special tokens give their text. Built once, on first use.
        """
        from engine.tokenizer_gguf import byte_to_char_table

        style, byte_fallback = _decoder_style(self.backend)
        char_to_byte = {c: b for b, c in byte_to_char_table().items()}
        added = self.backend.get_added_tokens_decoder()
        out: list[bytes] = []
        for i in range(self.vocab_size):
            piece = added[i].content if i in added else self.backend.id_to_token(i)
            if piece is None:
                out.append(b"")
            elif i in added:
                out.append(piece.encode("utf-8"))
            elif style == "byte_level" and all(c in char_to_byte for c in piece):
                out.append(bytes(char_to_byte[c] for c in piece))
            elif style == "metaspace":
                byte = _BYTE_PIECE.fullmatch(piece) if byte_fallback else None
                out.append(bytes([int(byte.group(1), 16)]) if byte else piece.replace("▁", " ").encode("utf-8"))
            else:
                out.append(self.backend.decode([i], skip_special_tokens=False).encode("utf-8"))
        return out

    def token_texts(self, decode_special_tokens: bool = False) -> list[str]:
        """`token_bytes` as strings (an incomplete UTF-8 character becomes U+FFFD); special tokens are ""
        unless `decode_special_tokens`. Cached; for stop-string and banned-string matching."""
        texts = self._texts.get(decode_special_tokens)
        if texts is None:
            texts = [b.decode("utf-8", errors="replace") for b in self.token_bytes]
            if not decode_special_tokens:
                for i in self.special_token_ids:
                    texts[i] = ""
            self._texts[decode_special_tokens] = texts
        return texts

    def __repr__(self) -> str:
        return f"Tokenizer({self.source}, vocab_size={self.vocab_size}, bos={self.bos_token!r}, eos={self.eos_token!r})"


# -------------------------------------------------------------------------------------------- helpers


def _id_list(ids: torch.Tensor | Sequence[int]) -> list[int]:
    if isinstance(ids, torch.Tensor):
        if ids.dim() == 2:
            if ids.shape[0] != 1:
                raise ValueError(f"decode takes one sequence; got a batch of shape {tuple(ids.shape)}")
            ids = ids[0]
        elif ids.dim() != 1:
            raise ValueError(f"decode takes a 1-D or [1, n] tensor; got shape {tuple(ids.shape)}")
        return ids.tolist()
    return [int(i) for i in ids]


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerLoadError(f"{path} is not valid JSON ({e}); download the model's files again.") from None
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{path} should hold a JSON object, not a {type(data).__name__}.")
    return data


def _read_tokenizer_json(path: Path):
    from tokenizers import Tokenizer as Backend

    try:
        return Backend.from_file(str(path))
    except Exception as e:  # the Rust side raises bare Exceptions for every kind of bad content
        raise TokenizerLoadError(
            f"{path} could not be read as a Hugging Face tokenizer ({e}). It may be truncated or corrupt; "
            "download it again."
        ) from None


def _chat_template(path: Path) -> str | None:
    try:
        from engine.chat_template import find_chat_template
    except ImportError:  # built alongside this module; a tokenizer without a template still works
        log.debug("engine.chat_template is not available; %s loads without a chat template", path)
        return None
    return find_chat_template(path)


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _register_declared_tokens(backend, config: dict, special_map: dict) -> dict[str, str | None]:
    """Add tokens that tokenizer_config.json / special_tokens_map.json declare and the backend lacks.

    Returns the text of the bos/eos/unk/pad tokens. Like transformers, declared special tokens become
    special added tokens (matched whole in text, skipped when decoding without special tokens).
    """
    from tokenizers import AddedToken

    from engine.tokenizer_spm import register_added_tokens

    existing = {t.content for t in backend.get_added_tokens_decoder().values()}
    new: list = []

    def want(content: str, special: bool, spec: dict | None = None) -> None:
        if content in existing:
            return
        spec = spec or {}
        new.append(
            AddedToken(
                content,
                single_word=bool(spec.get("single_word", False)),
                lstrip=bool(spec.get("lstrip", False)),
                rstrip=bool(spec.get("rstrip", False)),
                normalized=bool(spec.get("normalized", not special)),
                special=special,
            )
        )
        existing.add(content)

    declared = config.get("added_tokens_decoder") or {}
    for _, spec in sorted(declared.items(), key=lambda kv: int(kv[0])):
        if isinstance(spec, dict) and isinstance(spec.get("content"), str):
            want(spec["content"], bool(spec.get("special", False)), spec)
    named: dict[str, str | None] = {}
    for key in ("bos", "eos", "unk", "pad"):
        named[key] = _token_text(config.get(f"{key}_token", special_map.get(f"{key}_token")))
        if named[key] is not None:
            want(named[key], True)
    for key in ("additional_special_tokens", "extra_special_tokens"):
        extra = config.get(key, special_map.get(key)) or []
        for value in extra.values() if isinstance(extra, dict) else extra:
            if (text := _token_text(value)) is not None:
                want(text, True)
    register_added_tokens(backend, new)
    return named


def _post_processor_affixes(backend) -> tuple[set[int], set[int]]:
    """Ids a tokenizer.json post-processor puts before and after a single sequence (BOS/EOS)."""
    if backend.post_processor is None:
        return set(), set()
    state = json.loads(backend.post_processor.__getstate__())
    templates = [state] if state.get("type") != "Sequence" else state.get("processors", [])
    before: set[int] = set()
    after: set[int] = set()
    for proc in templates:
        if proc.get("type") != "TemplateProcessing":
            continue
        single, specials = proc.get("single", []), proc.get("special_tokens", {})
        seq_at = next((n for n, item in enumerate(single) if "Sequence" in item), len(single))
        for n, item in enumerate(single):
            if "SpecialToken" in item:
                token_ids = specials.get(item["SpecialToken"]["id"], {}).get("ids", [])
                (before if n < seq_at else after).update(token_ids)
    return before, after


def _decoder_style(backend) -> tuple[str, bool]:
    """("byte_level" | "metaspace" | "other", has byte fallback) from the backend's decoder."""
    if backend.decoder is None:
        return "other", False
    state = json.loads(backend.decoder.__getstate__())
    steps = state.get("decoders", []) if state.get("type") == "Sequence" else [state]
    kinds = {step.get("type") for step in steps}
    if "ByteLevel" in kinds:
        return "byte_level", False
    spaces = any(s.get("type") == "Replace" and s.get("pattern", {}).get("String") == "▁" for s in steps)
    if "Metaspace" in kinds or spaces:
        return "metaspace", "ByteFallback" in kinds
    return "other", False
