"""Build a `tokenizers.Tokenizer` from a sentencepiece `tokenizer.model`.

A `tokenizer.model` is a serialized `ModelProto`: sentencepiece's own schema reads it, and we rebuild
the pipeline the way `transformers` converts a Llama-style sentencepiece model (so encodings match it token for token):

    pieces (id order) -> BPE vocab + merges (merge rank = rank of the merged piece)
    text -> Metaspace pre-tokenizer ("▁" for spaces, "▁" prepended to the first segment only)
    ids  -> Replace("▁", " ") -> ByteFallback (<0xNN> pieces) -> Fuse -> Strip one leading space

Unigram models (rare among chat models) become a `tokenizers` Unigram model with the same pre-tokenizer.
"""

from __future__ import annotations

import logging
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


def parse_spm_model(data: bytes) -> SpmModel:
    """Parse a serialized sentencepiece ModelProto with sentencepiece's own schema. ValueError on bad bytes."""
    from google.protobuf.message import DecodeError
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(data)
    except DecodeError as e:
        raise ValueError(str(e) or "malformed protobuf") from None
    if not proto.pieces:
        raise ValueError("the model has no pieces")
    trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
    return SpmModel(
        pieces=[p.piece for p in proto.pieces],
        scores=[p.score for p in proto.pieces],
        types=[p.type for p in proto.pieces],
        model_type=trainer.model_type,
        byte_fallback=trainer.byte_fallback,
        unk_id=trainer.unk_id,
        bos_id=trainer.bos_id,
        eos_id=trainer.eos_id,
        pad_id=trainer.pad_id,
        add_dummy_prefix=normalizer.add_dummy_prefix,
    )


def read_spm_model(path: Path) -> SpmModel:
    """Read and parse `path`; raise TokenizerLoadError naming the file when it is not a sentencepiece model."""
    try:
        return parse_spm_model(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
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
