"""Where a model keeps its chat template: a Hugging Face folder's chat_template.jinja, chat_template.json or
tokenizer_config.json, or a GGUF file's `tokenizer.chat_template` metadata."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from engine.errors import CorruptFileError, MissingFileError, ModelLoadError

log = logging.getLogger(__name__)


def find_chat_template(path: str | Path) -> str | None:
    """Return the chat template shipped with a model, or None when it has none.

    `path` is a Hugging Face model folder (looked up in `chat_template.jinja`, then `chat_template.json`,
    then the "chat_template" key of `tokenizer_config.json`) or a `.gguf` file (metadata key
    `tokenizer.chat_template`). Where a model lists several named templates, the one named "default" is
    used. Raises MissingFileError for a path that does not exist, CorruptFileError for unreadable files.
    """
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"{path} does not exist. Give a model folder or a .gguf file.")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{path} is neither a model folder nor a .gguf file; give one of those.")
        return _from_gguf(path)

    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        template = nonblank(_read_text(jinja_file))
        if template is not None:
            return template
    for name in ("chat_template.json", "tokenizer_config.json"):
        config_file = path / name
        if config_file.is_file():
            template = pick_template(_read_json(config_file).get("chat_template"), config_file)
            if template is not None:
                return template
    return None


def _from_gguf(path: Path) -> str | None:
    # Imported here so that templates of HF folders never load the gguf package.
    from engine.gguf.file import GGUFFile

    value = GGUFFile.open(path).metadata.get("tokenizer.chat_template")
    if value is not None and not isinstance(value, str):
        raise CorruptFileError(f"{path}: tokenizer.chat_template is a {type(value).__name__}, not text.")
    return nonblank(value)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CorruptFileError(f"{path} cannot be read as UTF-8 text ({e}); download the model again.") from None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise CorruptFileError(f"{path} is not valid JSON ({e}); download the model again.") from None
    if not isinstance(data, dict):
        raise CorruptFileError(f"{path} should hold a JSON object, not a {type(data).__name__}.")
    return data


def pick_template(value: Any, origin: Path | str) -> str | None:
    """A template from a config value: a string, a {name: template} dict or a [{name, template}] list."""
    if value is None or isinstance(value, str):
        return nonblank(value)
    if isinstance(value, list):
        named: dict[str, Any] = {}
        for entry in value:
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str) and "template" in entry):
                raise CorruptFileError(
                    f"{origin}: a chat_template list entry should be {{'name': ..., 'template': ...}}, "
                    f"got {entry!r:.80}."
                )
            named[entry["name"]] = entry["template"]
        value = named
    if isinstance(value, dict):
        if not value:
            return None
        name = "default" if "default" in value else next(iter(value))
        if name != "default":
            log.warning("%s has no chat template named 'default'; using %r", origin, name)
        template = value[name]
        if template is not None and not isinstance(template, str):
            raise CorruptFileError(f"{origin}: chat template {name!r} is a {type(template).__name__}, not text.")
        return nonblank(template)
    raise CorruptFileError(f"{origin}: chat_template is a {type(value).__name__}; expected text or a list.")


def nonblank(template: str | None) -> str | None:
    # An empty template renders nothing at all, which is never what a model meant; treat it as missing.
    return template if template is not None and template.strip() else None
