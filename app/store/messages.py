"""Messages: add (saved when sent), update (a streaming answer's text and stats), list, cut from a point."""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from app.store.attachments import chat_shas
from app.store.chats import ChatsMixin
from app.store.db import dict_json
from app.store.errors import NotFoundError
from app.store.records import Message

ROLES = ("system", "user", "assistant", "tool")
MAX_COLUMNS = 4  # a compare run shows up to four columns


def _message_from_row(row: sqlite3.Row, images: list[str]) -> Message:
    return Message(
        id=row["id"],
        chat_id=row["chat_id"],
        role=row["role"],
        text=row["text"],
        images=images,
        stats=json.loads(row["stats"]),
        settings=json.loads(row["settings"]),
        column=row["col"],
        complete=bool(row["complete"]),
        created_at=row["created_at"],
    )


def _check_column(column: int | None) -> int | None:
    if column is None:
        return None
    if isinstance(column, bool) or not isinstance(column, int) or not 0 <= column < MAX_COLUMNS:
        raise ValueError(f"message column must be None or an int in [0, {MAX_COLUMNS - 1}], got {column!r}")
    return column


def _check_flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be True or False, got {value!r}")
    return value


def _check_text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"message text must be a string, got {type(value).__name__}")
    return value


class MessagesMixin(ChatsMixin):
    """Message methods of :class:`app.store.Store`."""

    def add_message(
        self,
        chat_id: int,
        role: str,
        text: str,
        *,
        images: Sequence[str] = (),
        stats: dict[str, Any] | None = None,
        settings: dict[str, Any] | None = None,
        column: int | None = None,
        complete: bool = True,
    ) -> Message:
        """Save a message at the end of a chat and mark the chat updated.

        ``images`` are shas from :meth:`add_attachment`; ``settings`` the sampler settings that
        produced an answer; ``complete=False`` for an answer that is about to stream.
        """
        if role not in ROLES:
            raise ValueError(f"message role must be one of {ROLES}, got {role!r}")
        text = _check_text(text)
        if isinstance(images, str) or not all(isinstance(sha, str) for sha in images):
            raise ValueError(f"message images must be a list of attachment shas, got {images!r}")
        images = list(images)
        stats_json = dict_json(stats, "message stats")
        settings_json = dict_json(settings, "message settings")
        column = _check_column(column)
        complete = _check_flag(complete, "complete")
        with self._db.write() as conn:
            self._touch_chat(conn, chat_id)
            placeholders = ",".join("?" * len(images))
            known = {
                row[0] for row in conn.execute(f"SELECT sha FROM attachments WHERE sha IN ({placeholders})", images)
            }
            missing = [sha for sha in images if sha not in known]
            if missing:
                raise ValueError(f"unknown attachment(s) {missing}; store the bytes with add_attachment first")
            now = self._db.now()
            cursor = conn.execute(
                "INSERT INTO messages (chat_id, role, text, stats, settings, col, complete, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (chat_id, role, text, stats_json, settings_json, column, int(complete), now),
            )
            message_id = cursor.lastrowid
            conn.executemany(
                "INSERT INTO message_attachments (message_id, position, sha) VALUES (?, ?, ?)",
                [(message_id, position, sha) for position, sha in enumerate(images)],
            )
        return Message(
            id=message_id,
            chat_id=chat_id,
            role=role,
            text=text,
            images=images,
            stats=json.loads(stats_json),
            settings=json.loads(settings_json),
            column=column,
            complete=complete,
            created_at=now,
        )

    def update_message(
        self,
        message_id: int,
        *,
        text: str | None = None,
        stats: dict[str, Any] | None = None,
        complete: bool | None = None,
    ) -> None:
        """Change a message's text, stats (replaced whole) or completeness; None leaves a field as it is.
        Committed before returning, so a streaming answer survives a crash as of its last update."""
        columns: dict[str, Any] = {}
        if text is not None:
            columns["text"] = _check_text(text)
        if stats is not None:
            columns["stats"] = dict_json(stats, "message stats")
        if complete is not None:
            columns["complete"] = int(_check_flag(complete, "complete"))
        with self._db.write() as conn:
            row = conn.execute("SELECT chat_id FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"no message with id {message_id!r} in {self._db.path}")
            if columns:
                assignments = ", ".join(f"{name} = ?" for name in columns)  # names from this module only
                conn.execute(f"UPDATE messages SET {assignments} WHERE id = ?", (*columns.values(), message_id))
                self._touch_chat(conn, row[0])

    def messages(self, chat_id: int) -> list[Message]:
        """A chat's messages in the order they were added; KeyError for an unknown chat."""
        if self._db.row("SELECT 1 FROM chats WHERE id = ?", (chat_id,)) is None:
            raise self._no_chat(chat_id)
        images: dict[int, list[str]] = defaultdict(list)
        for row in self._db.rows(
            "SELECT a.message_id, a.sha FROM message_attachments AS a JOIN messages AS m ON m.id = a.message_id"
            " WHERE m.chat_id = ? ORDER BY a.message_id, a.position",
            (chat_id,),
        ):
            images[row[0]].append(row[1])
        rows = self._db.rows("SELECT * FROM messages WHERE chat_id = ? ORDER BY id", (chat_id,))
        return [_message_from_row(row, images.get(row["id"], [])) for row in rows]

    def delete_messages_from(self, chat_id: int, message_id: int) -> None:
        """Delete ``message_id`` and every later message of the chat (edit-and-resend, regenerate);
        attachment files no other message uses are removed."""
        with self._db.write() as conn:
            row = conn.execute("SELECT chat_id FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None or row[0] != chat_id:
                self._touch_chat(conn, chat_id)  # an unknown chat is reported as such
                raise NotFoundError(f"no message with id {message_id!r} in chat {chat_id!r} ({self._db.path})")
            shas = chat_shas(conn, chat_id, from_message_id=message_id)
            conn.execute("DELETE FROM messages WHERE chat_id = ? AND id >= ?", (chat_id, message_id))
            self._touch_chat(conn, chat_id)
            unused = self._drop_unused_attachments(conn, shas)
        self._remove_files(unused)
