"""Chats: create, find (newest first, with search), rename, update, delete."""

from __future__ import annotations

import sqlite3
from typing import Any

from app.store.attachments import Attachments, chat_shas
from app.store.db import Database, dict_json
from app.store.errors import NotFoundError
from app.store.records import Chat, chat_from_row
from app.store.search import ChatSearch, SearchHit, search

CHAT_KINDS = ("chat", "compare")


def _check_title(title: str) -> str:
    if not isinstance(title, str) or not title.strip():
        raise ValueError(f"a chat title must be a non-empty string, got {title!r}")
    return title.strip()


def _check_text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    return value


class Chats:
    """The chats table; a deleted chat's attachments no other message uses go with it."""

    def __init__(self, db: Database, attachments: Attachments) -> None:
        self._db = db
        self._attachments = attachments

    def create(
        self,
        title: str = "New chat",
        system_prompt: str = "",
        settings: dict[str, Any] | None = None,
        kind: str = "chat",
    ) -> Chat:
        """Create and save a chat; ``kind`` is "chat" or "compare"."""
        title = _check_title(title)
        system_prompt = _check_text(system_prompt, "system_prompt")
        settings_json = dict_json(settings, "chat settings")
        if kind not in CHAT_KINDS:
            raise ValueError(f"chat kind must be one of {CHAT_KINDS}, got {kind!r}")
        now = self._db.now()
        with self._db.write() as conn:
            cursor = conn.execute(
                "INSERT INTO chats (title, kind, system_prompt, settings, model, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, NULL, ?, ?)",
                (title, kind, system_prompt, settings_json, now, now),
            )
        return self.get(cursor.lastrowid)

    def get(self, chat_id: int) -> Chat:
        """The chat with this id; KeyError (NotFoundError) if there is none."""
        row = self._db.row("SELECT * FROM chats WHERE id = ?", (chat_id,))
        if row is None:
            raise self.not_found(chat_id)
        return chat_from_row(row)

    def all(self, search: str | None = None) -> list[Chat]:
        """All chats, most recently updated first. ``search`` keeps chats whose title or any message text
        contains it, ignoring case; blank means no filter. See :meth:`search` for snippets and a limit."""
        if search is None or not search.strip():
            rows = self._db.rows("SELECT * FROM chats ORDER BY updated_at DESC, id DESC")
            return [chat_from_row(row) for row in rows]
        return [hit.chat for hit in self.search(search)]

    def search(self, query: str, limit: int | None = None) -> list[SearchHit]:
        """Chats whose title or message text contains ``query`` (ignoring case), most recently updated first,
        each with a snippet of its newest matching message; ``limit`` keeps the chats with the newest matches.
        Runs on this (the GUI) thread: for typing, use :meth:`searcher`, which searches on a worker."""
        return self._db.read(lambda conn: search(conn, query, limit, use_index=self._db.indexed))

    def searcher(self) -> ChatSearch:
        """A searcher with its own read-only connection and worker thread; close() it when done."""
        return ChatSearch(self._db.path)

    def rename(self, chat_id: int, title: str) -> None:
        """Set a chat's title (surrounding whitespace dropped; empty is a ValueError)."""
        title = _check_title(title)
        self._update_columns(chat_id, {"title": title})

    def update(
        self,
        chat_id: int,
        *,
        system_prompt: str | None = None,
        settings: dict[str, Any] | None = None,
        model: str | None = None,
    ) -> None:
        """Change a chat's system prompt, sampler settings or model name; None leaves a field as it is."""
        columns: dict[str, Any] = {}
        if system_prompt is not None:
            columns["system_prompt"] = _check_text(system_prompt, "system_prompt")
        if settings is not None:
            columns["settings"] = dict_json(settings, "chat settings")
        if model is not None:
            columns["model"] = _check_text(model, "model")
        self._update_columns(chat_id, columns)

    def delete(self, chat_id: int) -> None:
        """Delete a chat, its messages and their attachment links; attachment files no other message
        uses are removed."""
        with self._db.write() as conn:
            shas = chat_shas(conn, chat_id)
            if conn.execute("DELETE FROM chats WHERE id = ?", (chat_id,)).rowcount == 0:
                raise self.not_found(chat_id)
            unused = self._attachments.drop_unused(conn, shas)
        self._attachments.remove_files(unused)

    # -- helpers shared with messages

    def _update_columns(self, chat_id: int, columns: dict[str, Any]) -> None:
        # Column names come from this module, never from callers.
        assignments = "".join(f"{name} = ?, " for name in columns)
        with self._db.write() as conn:
            cursor = conn.execute(
                f"UPDATE chats SET {assignments}updated_at = ? WHERE id = ?",
                (*columns.values(), self._db.now(), chat_id),
            )
            if cursor.rowcount == 0:
                raise self.not_found(chat_id)

    def touch(self, conn: sqlite3.Connection, chat_id: int) -> None:
        """Mark a chat updated now, inside the caller's transaction; KeyError if it does not exist."""
        if conn.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (self._db.now(), chat_id)).rowcount == 0:
            raise self.not_found(chat_id)

    def not_found(self, chat_id: int) -> NotFoundError:
        """The error for an unknown chat id (raised by the caller)."""
        return NotFoundError(f"no chat with id {chat_id!r} in {self._db.path}")
