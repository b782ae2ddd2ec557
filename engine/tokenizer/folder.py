"""A Hugging Face model folder's tokenizer: tokenizer.json (or a sentencepiece tokenizer.model, converted by
engine.tokenizer.spm) with the tokens tokenizer_config.json and special_tokens_map.json declare added the way
`transformers` does, whether the model wants BOS/EOS, every id that ends a reply, and its chat template."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import TokenizerLoadError

log = logging.getLogger(__name__)


@dataclass
class FolderVocab:
    """A tokenizer backend read from a model folder, with what its config files say about it (the folder's
    counterpart of engine.tokenizer.gguf.GGUFVocab)."""

    backend: Any  # tokenizers.Tokenizer
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    unk_token_id: int | None = None
    extra_eos_token_ids: set[int] = field(default_factory=set)
    add_bos_token: bool = False
    add_eos_token: bool = False
    chat_template: str | None = None
    clean_up_tokenization_spaces: bool = False


def build_folder_vocab(folder: Path) -> FolderVocab | None:
    """The tokenizer of a Hugging Face model folder, or None when it has neither tokenizer.json nor
    tokenizer.model. Raises TokenizerLoadError for files that cannot be read."""
    json_file, spm_file = folder / "tokenizer.json", folder / "tokenizer.model"
    config = _read_json(folder / "tokenizer_config.json")
    if json_file.is_file():
        backend = _read_tokenizer_json(json_file)
        is_spm = False
    elif spm_file.is_file():
        from engine.tokenizer.spm import build_spm_tokenizer, read_spm_model

        prefix = config.get("add_prefix_space")
        backend = build_spm_tokenizer(
            read_spm_model(spm_file), None if prefix is None else bool(prefix), bool(config.get("legacy", False))
        )
        is_spm = True
    else:
        return None
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
    return FolderVocab(
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
    )


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

    from engine.tokenizer.spm import register_added_tokens

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
