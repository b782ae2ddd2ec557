"""find_chat_template: where a model folder or a GGUF file keeps its chat template, and bad files named."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine.chat_template import find_chat_template
from engine.errors import CorruptFileError, MissingFileError, ModelLoadError


def _config(folder: Path, **entries) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", **entries}), encoding="utf-8")
    return folder


def test_find_precedence_jinja_then_json_then_config(tmp_path):
    folder = _config(tmp_path / "m", chat_template="from config")
    assert find_chat_template(folder) == "from config"
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": "from json"}))
    assert find_chat_template(folder) == "from json"
    (folder / "chat_template.jinja").write_text("from jinja")
    assert find_chat_template(str(folder)) == "from jinja"
    # An empty .jinja file is no template: the next source is used.
    (folder / "chat_template.jinja").write_text("")
    assert find_chat_template(folder) == "from json"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([{"name": "rag", "template": "R"}, {"name": "default", "template": "D"}], "D"),
        ([{"name": "tool_use", "template": "T"}, {"name": "rag", "template": "R"}], "T"),  # no default: first
        ({"rag": "R", "default": "D"}, "D"),
        ([], None),
        ("", None),
        (None, None),
    ],
)
def test_find_named_templates(tmp_path, value, expected):
    assert find_chat_template(_config(tmp_path / "m", chat_template=value)) == expected


def test_find_returns_none_without_template(tmp_path):
    assert find_chat_template(tmp_path) is None  # empty folder
    assert find_chat_template(_config(tmp_path / "m")) is None  # config without the key


def _gguf(path: Path, template: str | None) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    if template is not None:
        writer.add_chat_template(template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_find_in_gguf(tmp_path):
    assert find_chat_template(_gguf(tmp_path / "a.gguf", "{{ 'gguf template' }}")) == "{{ 'gguf template' }}"
    assert find_chat_template(_gguf(tmp_path / "b.gguf", None)) is None


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda d: d / "absent", MissingFileError),
        (lambda d: d / "absent.gguf", MissingFileError),
        (lambda d: _write(d / "weights.bin", "x"), ModelLoadError),
        (lambda d: _write(d / "bad.gguf", "not a gguf at all"), CorruptFileError),
        (lambda d: _write(d / "tokenizer_config.json", "{not json"), CorruptFileError),
        (lambda d: _write(d / "tokenizer_config.json", "[1, 2]"), CorruptFileError),
        (lambda d: _write(d / "tokenizer_config.json", '{"chat_template": 5}'), CorruptFileError),
        (
            lambda d: _write(d / "tokenizer_config.json", '{"chat_template": [{"template": "T"}]}'),
            CorruptFileError,
        ),
        (lambda d: _write(d / "chat_template.json", '{"chat_template": {"default": 3}}'), CorruptFileError),
        (lambda d: _write_bytes(d / "chat_template.jinja", b"\xff\xfe\xfa"), CorruptFileError),
    ],
)
def test_find_reports_bad_files(tmp_path, make, error):
    target = make(tmp_path)
    path = tmp_path if target.name.endswith((".json", ".jinja")) else target
    with pytest.raises(error, match=re.escape(str(tmp_path))):
        find_chat_template(path)


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
