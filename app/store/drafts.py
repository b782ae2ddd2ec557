"""Drafts: the message a chat's input holds before it is sent (its text and attached images), one per chat.

Saved as the user types and when the app closes, so a quit or a crash loses no typed message; read back when
the chat opens; cleared when it is sent. Images are attachments (app/store/attachments.py) linked from
``draft_attachments`` (schema version 4, app/store/migrations.py), so the open-time sweep and chat deletes
keep every file a draft still shows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.store.db import Database
from app.store.errors import NotFoundError


@dataclass(frozen=True)
class Draft:
    """A chat's unsent message: its text, and its images as (attachment sha, file name) in strip order."""

    chat_id: int
    text: str
    images: list[tuple[str, str]] = field(default_factory=list)
    updated_at: float = 0.0

    @property
    def is_empty(self) -> bool:
        return not self.text and not self.images


def _has_drafts(conn: sqlite3.Connection) -> bool:
    # A file before schema version 4 (tools and tests stop migrations early) has no draft tables.
    query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'draft_attachments'"
    return conn.execute(query).fetchone() is not None


def linked_shas_sql(conn: sqlite3.Connection) -> str:
    """A query for every sha a message or a draft links."""
    if _has_drafts(conn):
        return "SELECT sha FROM message_attachments UNION ALL SELECT sha FROM draft_attachments"
    return "SELECT sha FROM message_attachments"


def is_linked(conn: sqlite3.Connection, sha: str) -> bool:
    """Whether a message or a draft still shows attachment ``sha``."""
    if conn.execute("SELECT 1 FROM message_attachments WHERE sha = ? LIMIT 1", (sha,)).fetchone():
        return True
    return _has_drafts(conn) and bool(
        conn.execute("SELECT 1 FROM draft_attachments WHERE sha = ? LIMIT 1", (sha,)).fetchone()
    )


class Drafts:
    """The drafts tables: at most one unsent message per chat."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def get(self, chat_id: int) -> Draft | None:
        """Chat ``chat_id``'s unsent message, or None when it has none."""
        row = self._db.row("SELECT text, updated_at FROM drafts WHERE chat_id = ?", (chat_id,))
        if row is None:
            return None
        images = self._db.rows(
            "SELECT sha, name FROM draft_attachments WHERE chat_id = ? ORDER BY position", (chat_id,)
        )
        return Draft(chat_id, row[0], [(r[0], r[1]) for r in images], row[1])

    def save(self, chat_id: int, text: str, images: Sequence[tuple[str, str]] = ()) -> None:
        """Keep ``text`` and ``images`` ((sha from add_attachment, file name) pairs) as the chat's unsent message,
        replacing the one before; an empty draft is cleared. KeyError for an unknown chat or attachment."""
        if not isinstance(text, str):
            raise ValueError(f"a draft's text must be a string, got {type(text).__name__}")
        images = [(str(sha), str(name)) for sha, name in images]
        if not text and not images:
            self.clear(chat_id)
            return
        with self._db.write() as conn:
            if conn.execute("SELECT 1 FROM chats WHERE id = ?", (chat_id,)).fetchone() is None:
                raise NotFoundError(f"no chat with id {chat_id!r} in {self._db.path}")
            for sha, _name in images:
                if conn.execute("SELECT 1 FROM attachments WHERE sha = ?", (sha,)).fetchone() is None:
                    raise NotFoundError(f"no attachment {sha!r}; store its bytes with add_attachment first")
            conn.execute(
                "INSERT INTO drafts (chat_id, text, updated_at) VALUES (?, ?, ?)"
                " ON CONFLICT (chat_id) DO UPDATE SET text = excluded.text, updated_at = excluded.updated_at",
                (chat_id, text, self._db.now()),
            )
            conn.execute("DELETE FROM draft_attachments WHERE chat_id = ?", (chat_id,))
            conn.executemany(
                "INSERT INTO draft_attachments (chat_id, position, sha, name) VALUES (?, ?, ?, ?)",
                [(chat_id, i, sha, name) for i, (sha, name) in enumerate(images)],
            )

    def clear(self, chat_id: int) -> None:
        """Forget the chat's unsent message (it was sent); its images stay until the sweep finds them unused."""
        with self._db.write() as conn:
            conn.execute("DELETE FROM drafts WHERE chat_id = ?", (chat_id,))
