"""One tokenizer over Hugging Face folders (tokenizer.json or sentencepiece tokenizer.model) and GGUF files.

Every kind becomes a `tokenizers.Tokenizer` backend, so encoding and decoding are one code path:

    folder/tokenizer.json   -> loaded as is (engine.tokenizer.folder)
    folder/tokenizer.model  -> converted by engine.tokenizer.spm (no protobuf needed)
    model.gguf              -> built from the embedded vocabulary by engine.tokenizer.gguf

A folder's tokenizer_config.json / special_tokens_map.json then add the tokens they declare, the way
`transformers` does (engine.tokenizer.folder), so `encode` matches `AutoTokenizer(...)(text, add_special_tokens=False)`.
BOS/EOS are never added by the backend: `encode(add_bos=...)` decides, and `add_bos_token` says what
the model expects.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from engine.errors import MissingFileError, TokenizerLoadError

if TYPE_CHECKING:
    from engine.gguf.file import GGUFFile

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
                from engine.gguf.file import GGUFFile

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
        from engine.tokenizer.gguf import build_gguf_vocab

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
        from engine.tokenizer.folder import build_folder_vocab

        vocab = build_folder_vocab(folder)
        if vocab is None:
            ggufs = sorted(folder.glob("*.gguf"))
            if len(ggufs) == 1:
                return cls.load(ggufs[0])
            raise TokenizerLoadError(
                f"{folder} has no tokenizer: expected tokenizer.json, tokenizer.model or one .gguf file in it. "
                "Download the model's tokenizer files into the folder."
            )
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
            clean_up_tokenization_spaces=vocab.clean_up_tokenization_spaces,
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
        from engine.tokenizer.gguf import byte_to_char_table

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
