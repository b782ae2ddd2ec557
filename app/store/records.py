"""Plain dataclasses the store hands out; ids are ints, times are Unix seconds (float)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Chat:
    """One saved conversation. ``kind`` is "chat" or "compare"; ``settings`` holds sampler settings."""

    id: int
    title: str
    kind: str
    system_prompt: str
    settings: dict[str, Any]
    model: str | None
    created_at: float
    updated_at: float


@dataclass
class Message:
    """One turn. ``images`` are attachment shas (see ``Store.attachment_path``); ``column`` is a compare
    run's column (0..3) or None in a plain chat; ``complete`` is False while an answer streams or when
    it was stopped or cut off by a crash; ``parent_id`` is the message it follows, None for a first message
    (messages with the same parent are versions of one another, see app/store/branches.py)."""

    id: int
    chat_id: int
    role: str
    text: str
    images: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    column: int | None = None
    complete: bool = True
    created_at: float = 0.0
    parent_id: int | None = None


@dataclass
class Preset:
    """Named sampler settings: SamplerSettings field names -> values, optionally "seed"/"max_new_tokens"."""

    name: str
    settings: dict[str, Any]
    builtin: bool


@dataclass
class ModelEntry:
    """A model the user added: a folder or GGUF path (or hub id), its display name and where it came from."""

    path: str
    name: str
    kind: str
    added_at: float


def chat_from_row(row: sqlite3.Row) -> Chat:
    """A :class:`Chat` from a ``SELECT * FROM chats`` row."""
    return Chat(
        id=row["id"],
        title=row["title"],
        kind=row["kind"],
        system_prompt=row["system_prompt"],
        settings=json.loads(row["settings"]),
        model=row["model"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )
