"""Messages: add (saved when sent, at the end of the visible thread or as a new version of a message), update (a
streaming answer's text and stats), list the visible thread or every version, switch versions, cut from a point.

A chat's messages form a tree (app/store/branches.py); :meth:`Messages.thread` returns the thread the
chat shows, so most callers never see the other versions."""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from app.store.attachments import Attachments
from app.store.branches import ROOT, Tree
from app.store.chats import Chats
from app.store.db import Database, dict_json
from app.store.errors import NotFoundError
from app.store.migrations import BRANCHES_VERSION
from app.store.records import Message

ROLES = ("system", "user", "assistant", "tool")
MAX_COLUMNS = 4  # a compare run shows up to four columns


def _message_from_row(row: sqlite3.Row, images: list[str], parent_id: int | None) -> Message:
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
        parent_id=parent_id,
    )


def _tree(rows: list[sqlite3.Row]) -> Tree:
    """The tree of a chat's rows (in id order); a store stopped before version 3 has neither column."""
    if rows and "parent_id" not in rows[0].keys():
        return Tree((row["id"], None, row["created_at"]) for row in rows)
    return Tree((row["id"], row["parent_id"], row["selected_at"] or row["created_at"]) for row in rows)


def _chat_rows(conn: sqlite3.Connection, chat_id: int, columns: str = "*") -> list[sqlite3.Row]:
    return conn.execute(f"SELECT {columns} FROM messages WHERE chat_id = ? ORDER BY id", (chat_id,)).fetchall()


def _chunks(ids: list[int], size: int = 500) -> list[list[int]]:
    """Id lists short enough for one IN (...) each (old SQLite allows 999 parameters)."""
    return [ids[i : i + size] for i in range(0, len(ids), size)]


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


class Messages:
    """A chat's messages as a tree of versions (app/store/branches.py); each write marks its chat updated."""

    def __init__(self, db: Database, chats: Chats, attachments: Attachments) -> None:
        self._db = db
        self._chats = chats
        self._attachments = attachments

    def add(
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
        version_of: int | None = None,
    ) -> Message:
        """Save a message at the end of the chat's visible thread and mark the chat updated.

        ``images`` are shas from :meth:`Attachments.add`; ``settings`` the sampler settings that
        produced an answer; ``complete=False`` for an answer that is about to stream. ``version_of``: save it
        as a new version of that message instead (a regenerated answer, an edited question): it follows the
        same message, and the visible thread now runs through it; the old version and what follows it stay.
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
            self._chats.touch(conn, chat_id)
            placeholders = ",".join("?" * len(images))
            known = {
                row[0] for row in conn.execute(f"SELECT sha FROM attachments WHERE sha IN ({placeholders})", images)
            }
            missing = [sha for sha in images if sha not in known]
            if missing:
                raise ValueError(f"unknown attachment(s) {missing}; store the bytes with add_attachment first")
            now = self._db.now()
            values = (chat_id, role, text, stats_json, settings_json, column, int(complete), now)
            if self._db.version < BRANCHES_VERSION:
                if version_of is not None:
                    raise ValueError(f"this store stops at schema version {self._db.version}, before versions")
                parent_id = None
                cursor = conn.execute(
                    "INSERT INTO messages (chat_id, role, text, stats, settings, col, complete, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    values,
                )
            else:
                parent_id = self._new_parent(conn, chat_id, version_of)
                cursor = conn.execute(
                    "INSERT INTO messages (chat_id, role, text, stats, settings, col, complete, created_at, parent_id)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*values, ROOT if parent_id is None else parent_id),
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
            parent_id=parent_id,
        )

    def _new_parent(self, conn: sqlite3.Connection, chat_id: int, version_of: int | None) -> int | None:
        """The parent of a message being added (inside the write): the visible thread's last message, or the
        parent of the message it is a new version of."""
        tree = _tree(_chat_rows(conn, chat_id, self._tree_columns()))
        if version_of is None:
            return tree.leaf()
        if version_of not in tree:
            raise NotFoundError(f"no message with id {version_of!r} in chat {chat_id!r} ({self._db.path})")
        return tree.parent[version_of]

    def update(
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
                self._chats.touch(conn, row[0])

    def thread(self, chat_id: int, *, before: int | None = None) -> list[Message]:
        """A chat's visible thread, first message first: what the chat shows and sends to the model. ``before``:
        the thread that leads to that message, without it (the prompt for a new version of it). KeyError for an
        unknown chat or message."""
        tree, rows = self._read_tree(chat_id)
        if before is None:
            ids = tree.thread()
        elif before in tree:
            ids = tree.path_to(before)[:-1]
        else:
            raise NotFoundError(f"no message with id {before!r} in chat {chat_id!r} ({self._db.path})")
        return self._records(chat_id, tree, rows, ids)

    def all(self, chat_id: int) -> list[Message]:
        """Every message of a chat, every version on every branch, in the order they were written."""
        tree, rows = self._read_tree(chat_id)
        return self._records(chat_id, tree, rows, [row["id"] for row in rows])

    def versions(self, chat_id: int) -> dict[int, list[int]]:
        """For each message of the visible thread, its versions' ids (itself among them), oldest first."""
        tree, _rows = self._read_tree(chat_id, skeleton=True)
        return {message_id: tree.versions(message_id) for message_id in tree.thread()}

    def select_version(self, message_id: int) -> None:
        """Show this version of its message: the visible thread now runs through it (and through its earlier
        messages), and on below it through the versions last shown there. The chat's update time is left alone:
        nothing was written."""
        row = self._db.row("SELECT chat_id FROM messages WHERE id = ?", (message_id,))
        if row is None:
            raise NotFoundError(f"no message with id {message_id!r} in {self._db.path}")
        tree, _rows = self._read_tree(row[0], skeleton=True)
        hidden = [m for m in tree.path_to(message_id) if not tree.is_chosen(m)]
        if hidden:  # (never in a store before version 3: each message there is its only version)
            with self._db.write() as conn:
                now = self._db.now()
                conn.executemany("UPDATE messages SET selected_at = ? WHERE id = ?", [(now, m) for m in hidden])

    def _read_tree(self, chat_id: int, *, skeleton: bool = False) -> tuple[Tree, list[sqlite3.Row]]:
        """The chat's tree and its rows (``skeleton``: only the columns the tree needs); KeyError for no chat."""
        if self._db.row("SELECT 1 FROM chats WHERE id = ?", (chat_id,)) is None:
            raise self._chats.not_found(chat_id)
        columns = self._tree_columns() if skeleton else "*"
        rows = self._db.read(lambda conn: _chat_rows(conn, chat_id, columns))
        return _tree(rows), rows

    def _tree_columns(self) -> str:
        return "id, parent_id, selected_at, created_at" if self._db.version >= BRANCHES_VERSION else "id, created_at"

    def _records(self, chat_id: int, tree: Tree, rows: list[sqlite3.Row], ids: list[int]) -> list[Message]:
        by_id = {row["id"]: row for row in rows}
        images: dict[int, list[str]] = defaultdict(list)
        for row in self._db.rows(
            "SELECT a.message_id, a.sha FROM message_attachments AS a JOIN messages AS m ON m.id = a.message_id"
            " WHERE m.chat_id = ? ORDER BY a.message_id, a.position",
            (chat_id,),
        ):
            images[row[0]].append(row[1])
        return [_message_from_row(by_id[i], images.get(i, []), tree.parent[i]) for i in ids]

    def delete_from(self, chat_id: int, message_id: int) -> None:
        """Delete ``message_id`` and every message that follows it, on every branch; attachment files no
        other message uses are removed."""
        with self._db.write() as conn:
            row = conn.execute("SELECT chat_id FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None or row[0] != chat_id:
                self._chats.touch(conn, chat_id)  # an unknown chat is reported as such
                raise NotFoundError(f"no message with id {message_id!r} in chat {chat_id!r} ({self._db.path})")
            doomed = _tree(_chat_rows(conn, chat_id, self._tree_columns())).descendants(message_id)
            shas: set[str] = set()
            for ids in _chunks(doomed):
                marks = ",".join("?" * len(ids))
                shas.update(
                    r[0]
                    for r in conn.execute(f"SELECT sha FROM message_attachments WHERE message_id IN ({marks})", ids)
                )
                conn.execute(f"DELETE FROM messages WHERE id IN ({marks})", ids)
            self._chats.touch(conn, chat_id)
            unused = self._attachments.drop_unused(conn, shas)
        self._attachments.remove_files(unused)
