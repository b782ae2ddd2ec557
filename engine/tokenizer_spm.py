"""Build a `tokenizers.Tokenizer` from a sentencepiece `tokenizer.model`, without protobuf or sentencepiece.

A `tokenizer.model` is a serialized `ModelProto`. We read the few fields a tokenizer needs straight
from the protobuf wire format, then rebuild the pipeline the way `transformers` converts a Llama-style
sentencepiece model (so encodings match it token for token):

    pieces (id order) -> BPE vocab + merges (merge rank = rank of the merged piece)
    text -> Metaspace pre-tokenizer ("▁" for spaces, "▁" prepended to the first segment only)
    ids  -> Replace("▁", " ") -> ByteFallback (<0xNN> pieces) -> Fuse -> Strip one leading space

Unigram models (rare among chat models) become a `tokenizers` Unigram model with the same pre-tokenizer.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import TokenizerLoadError

log = logging.getLogger(__name__)

# SentencePiece.Type values in sentencepiece_model.proto
PIECE_NORMAL, PIECE_UNKNOWN, PIECE_CONTROL, PIECE_USER_DEFINED, PIECE_UNUSED, PIECE_BYTE = 1, 2, 3, 4, 5, 6
MODEL_UNIGRAM, MODEL_BPE = 1, 2


@dataclass
class SpmModel:
    """The parts of a sentencepiece ModelProto that a tokenizer needs (defaults are the proto's)."""

    pieces: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    types: list[int] = field(default_factory=list)
    model_type: int = MODEL_UNIGRAM
    byte_fallback: bool = False
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = -1
    add_dummy_prefix: bool = True

    def piece_or_none(self, idx: int) -> str | None:
        return self.pieces[idx] if 0 <= idx < len(self.pieces) else None


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes):
    """Yield (field_number, wire_type, value) for one protobuf message; value is int or bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated message")
        yield number, wire, value


def _int32(value: int) -> int:
    # negative int32 values are written as 64-bit two's complement varints
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def parse_spm_model(data: bytes) -> SpmModel:
    """Parse a serialized sentencepiece ModelProto. Raises ValueError on malformed bytes."""
    model = SpmModel()
    for number, wire, value in _fields(data):
        if number == 1 and wire == 2:  # repeated SentencePiece pieces
            piece, score, kind = None, 0.0, PIECE_NORMAL
            for n, w, v in _fields(value):
                if n == 1 and w == 2:
                    piece = v.decode("utf-8")
                elif n == 2 and w == 5:
                    score = struct.unpack("<f", v)[0]
                elif n == 3 and w == 0:
                    kind = v
            if piece is None:
                raise ValueError(f"piece {len(model.pieces)} has no text")
            model.pieces.append(piece)
            model.scores.append(score)
            model.types.append(kind)
        elif number == 2 and wire == 2:  # TrainerSpec
            for n, w, v in _fields(value):
                if w != 0:
                    continue
                if n == 3:
                    model.model_type = v
                elif n == 35:
                    model.byte_fallback = bool(v)
                elif n in (40, 41, 42, 43):
                    setattr(model, {40: "unk_id", 41: "bos_id", 42: "eos_id", 43: "pad_id"}[n], _int32(v))
        elif number == 3 and wire == 2:  # NormalizerSpec
            for n, w, v in _fields(value):
                if n == 3 and w == 0:
                    model.add_dummy_prefix = bool(v)
    if not model.pieces:
        raise ValueError("the model has no pieces")
    return model


def read_spm_model(path: Path) -> SpmModel:
    """Read and parse `path`; raise TokenizerLoadError naming the file when it is not a sentencepiece model."""
    try:
        return parse_spm_model(path.read_bytes())
    except (ValueError, UnicodeDecodeError, struct.error) as e:
        raise TokenizerLoadError(
            f"{path} is not a readable sentencepiece model ({e}). It may be truncated or a different "
            "file under the same name; download the model's tokenizer files again."
        ) from None


def merges_from_vocab(vocab: dict[str, int], scores: dict[str, float] | None = None) -> list[tuple[str, str]]:
    """BPE merges implied by a sentencepiece vocabulary (which stores no merges).

    Every way to cut a piece into two pieces that are both in the vocabulary is a merge. Merges are
    ordered by the merged piece's priority: its id (lower first), or its score (higher first) when
    `scores` is given, as sentencepiece's BPE applies them. Ties are broken the way `transformers`
    breaks them, so both build identical tokenizers.
    """
    found: list[tuple[tuple, str, str]] = []
    for piece, idx in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                if scores is None:
                    key = (idx, cut)
                else:
                    key = (-scores[piece], -cut, cut - len(piece))
                found.append((key, left, right))
    found.sort(key=lambda m: m[0])
    return [(left, right) for _, left, right in found]


def spm_pipeline(tokenizer, add_prefix_space: bool, legacy: bool = False) -> None:
    """Set the Llama-style sentencepiece pre-tokenizer and decoder on a `tokenizers.Tokenizer`.

    `legacy` (tokenizer_config.json's flag) prepends "▁" to the text after every special token too,
    not only to the start of the text.
    """
    from tokenizers import decoders, pre_tokenizers

    scheme = ("always" if legacy else "first") if add_prefix_space else "never"
    tokenizer.normalizer = None
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix_space:
        # the prepended "▁" of the first segment is not part of the text
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tokenizer.decoder = decoders.Sequence(steps)


def added_tokens_for(pieces: list[str], types: list[int], special_ids: set[int]) -> list:
    """AddedTokens for control/unknown pieces (special) and user-defined pieces (matched whole, not special)."""
    from tokenizers import AddedToken

    out = []
    for idx, (piece, kind) in enumerate(zip(pieces, types, strict=True)):
        if kind in (PIECE_CONTROL, PIECE_UNKNOWN) or idx in special_ids:
            out.append(AddedToken(piece, special=True, normalized=False))
        elif kind == PIECE_USER_DEFINED:
            out.append(AddedToken(piece, special=False, normalized=False))
    return out


def register_added_tokens(backend, tokens: list) -> None:
    """Add AddedTokens to `backend`, keeping each one's special flag (add_special_tokens forces it on)."""
    special = [t for t in tokens if t.special]
    plain = [t for t in tokens if not t.special]
    if special:
        backend.add_special_tokens(special)
    if plain:
        backend.add_tokens(plain)


def build_spm_tokenizer(model: SpmModel, add_prefix_space: bool | None = None, legacy: bool = False):
    """A `tokenizers.Tokenizer` equivalent to the sentencepiece model (see the module docstring).

    `add_prefix_space` overrides the model's own add_dummy_prefix; it and `legacy` come from
    tokenizer_config.json when it sets them.
    """
    from tokenizers import Tokenizer
    from tokenizers.models import BPE, Unigram

    unk_piece = model.piece_or_none(model.unk_id)
    has_bytes = PIECE_BYTE in model.types
    if model.model_type == MODEL_BPE:
        vocab = {piece: idx for idx, piece in enumerate(model.pieces)}
        backend = Tokenizer(
            BPE(
                vocab=vocab,
                merges=merges_from_vocab(vocab),
                unk_token=unk_piece,
                fuse_unk=True,
                byte_fallback=model.byte_fallback or has_bytes,
            )
        )
    elif model.model_type == MODEL_UNIGRAM:
        log.info("sentencepiece unigram model: building a Unigram tokenizer")
        unk_id = model.unk_id if unk_piece is not None else None
        backend = Tokenizer(
            Unigram(list(zip(model.pieces, model.scores, strict=True)), unk_id=unk_id, byte_fallback=has_bytes)
        )
    else:
        raise TokenizerLoadError(
            f"sentencepiece model type {model.model_type} (word/char) is not supported; only BPE and "
            "unigram models are. Use the model's tokenizer.json instead if it has one."
        )
    spm_pipeline(backend, model.add_dummy_prefix if add_prefix_space is None else add_prefix_space, legacy)
    named = {i for i in (model.unk_id, model.bos_id, model.eos_id, model.pad_id) if model.piece_or_none(i)}
    register_added_tokens(backend, added_tokens_for(model.pieces, model.types, named))
    return backend
