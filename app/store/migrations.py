"""Schema versions: an ordered list of migrations, each run once, in its own transaction.

Migration ``n`` (1-based) is ``MIGRATIONS[n - 1]``; it takes the connection inside an open
transaction and must not commit. ``schema_version`` keeps one row per applied migration, so the
file's version is ``MAX(version)``. To change the schema, append a migration; never edit one
that has shipped (files in the wild already ran it).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from app.store.document_index import create_tables as create_document_tables
from app.store.errors import StoreError
from app.store.search_index import ensure_index

logger = logging.getLogger(__name__)

Migration = Callable[[sqlite3.Connection], None]

_V1_TABLES = (
    """CREATE TABLE chats (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('chat', 'compare')),
        system_prompt TEXT NOT NULL DEFAULT '',
        settings TEXT NOT NULL DEFAULT '{}',
        model TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    )""",
    "CREATE INDEX chats_by_update ON chats (updated_at DESC, id DESC)",
    # "column" is an SQL keyword, hence col.
    """CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        chat_id INTEGER NOT NULL REFERENCES chats (id) ON DELETE CASCADE,
        role TEXT NOT NULL,
        text TEXT NOT NULL,
        stats TEXT NOT NULL DEFAULT '{}',
        settings TEXT NOT NULL DEFAULT '{}',
        col INTEGER CHECK (col IS NULL OR col BETWEEN 0 AND 3),
        complete INTEGER NOT NULL DEFAULT 1 CHECK (complete IN (0, 1)),
        created_at REAL NOT NULL
    )""",
    "CREATE INDEX messages_by_chat ON messages (chat_id, id)",
    """CREATE TABLE attachments (
        sha TEXT PRIMARY KEY,
        suffix TEXT NOT NULL,
        size INTEGER NOT NULL,
        created_at REAL NOT NULL
    )""",
    """CREATE TABLE message_attachments (
        message_id INTEGER NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        sha TEXT NOT NULL REFERENCES attachments (sha),
        PRIMARY KEY (message_id, position)
    )""",
    "CREATE INDEX message_attachments_by_sha ON message_attachments (sha)",
    """CREATE TABLE presets (
        name TEXT PRIMARY KEY,
        settings TEXT NOT NULL,
        created_at REAL NOT NULL
    )""",
    "CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE models (
        path TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        added_at REAL NOT NULL
    )""",
)


def _v1_create_tables(conn: sqlite3.Connection) -> None:
    """Version 1: chats, messages, attachments and their links, presets, settings, models."""
    for statement in _V1_TABLES:
        conn.execute(statement)


def _v2_search_index(conn: sqlite3.Connection) -> None:
    """Version 2: the search index over titles and message text (app/store/search.py), built from every
    existing chat; skipped where this SQLite has no FTS5 trigram tokenizer (searches then scan)."""
    ensure_index(conn)


def _v3_message_branches(conn: sqlite3.Connection) -> None:
    """Version 3: kept versions and branches (app/store/branches.py). Existing rows keep NULL in both columns,
    which reads as the one thread they were: adding columns rewrites no row, however long the history."""
    conn.execute("ALTER TABLE messages ADD COLUMN parent_id INTEGER")  # 0: a first message; NULL: the one before
    conn.execute("ALTER TABLE messages ADD COLUMN selected_at REAL")  # NULL: chosen when written (created_at)
    # No index on parent_id: a chat's tree is read whole through messages_by_chat.


def _v4_drafts(conn: sqlite3.Connection) -> None:
    """Version 4: each chat's unsent message and its images (app/store/drafts.py)."""
    conn.execute(
        """CREATE TABLE drafts (
            chat_id INTEGER PRIMARY KEY REFERENCES chats (id) ON DELETE CASCADE,
            text TEXT NOT NULL,
            updated_at REAL NOT NULL
        )"""
    )
    conn.execute(
        """CREATE TABLE draft_attachments (
            chat_id INTEGER NOT NULL REFERENCES drafts (chat_id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            sha TEXT NOT NULL REFERENCES attachments (sha),
            name TEXT NOT NULL,
            PRIMARY KEY (chat_id, position)
        )"""
    )
    conn.execute("CREATE INDEX draft_attachments_by_sha ON draft_attachments (sha)")


def _v5_documents(conn: sqlite3.Connection) -> None:
    """Version 5: documents sent with messages, their passages and the passages' FTS5 index
    (app/store/documents.py; the index only where this SQLite has FTS5)."""
    create_document_tables(conn)


def _v6_chat_tools(conn: sqlite3.Connection) -> None:
    """Version 6: each chat's tool switches (app/store/tool_settings.py); a tool with no row is off."""
    conn.execute(
        """CREATE TABLE chat_tools (
            chat_id INTEGER NOT NULL REFERENCES chats (id) ON DELETE CASCADE,
            tool TEXT NOT NULL,
            enabled INTEGER NOT NULL CHECK (enabled IN (0, 1)),
            PRIMARY KEY (chat_id, tool)
        )"""
    )


MIGRATIONS: tuple[Migration, ...] = (
    _v1_create_tables,
    _v2_search_index,
    _v3_message_branches,
    _v4_drafts,
    _v5_documents,
    _v6_chat_tools,
)
DOCUMENTS_VERSION = 5  # a store stopped before it has no documents: its messages carry none
BRANCHES_VERSION = 3  # a store stopped before it (tools, tests) keeps one thread per chat, as Tandem did then


def schema_version(conn: sqlite3.Connection) -> int:
    """The file's schema version: 0 for an empty file."""
    has_table = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
    if not has_table:
        return 0
    (version,) = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()
    return int(version)


def check_compatible(conn: sqlite3.Connection, path: Path, latest: int) -> int:
    """The file's version, after refusing (read-only, so the file stays as it was) one that is SQLite
    but not Tandem's or one from a newer Tandem, with :class:`StoreError`."""
    version = schema_version(conn)
    if version == 0:
        others = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall()
        if others:
            names = ", ".join(row[0] for row in others[:5])
            raise StoreError(
                f"{path} is an SQLite database but not Tandem's (it has tables {names} and no schema_version). "
                "Choose another file, or move this one aside so Tandem can start a new one."
            )
    if version > latest:
        raise StoreError(
            f"{path} was written by a newer Tandem (schema version {version}; this Tandem knows up to {latest}). "
            "Update Tandem, or move the file aside to start with an empty history."
        )
    return version


def migrate(conn: sqlite3.Connection, path: Path, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Bring the database at ``path`` up to ``len(migrations)`` and return that version.

    ``conn`` must be in autocommit mode (``isolation_level=None``): each migration runs in its own
    ``BEGIN IMMEDIATE`` transaction together with its ``schema_version`` row, so a failed migration
    leaves the file at the previous version, untouched. Raises :class:`StoreError` for a file that is
    SQLite but not Tandem's, one from a newer Tandem, or a migration that fails.
    """
    latest = len(migrations)
    version = check_compatible(conn, path, latest)
    for target in range(version + 1, latest + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-read under the write lock: another Tandem process may have migrated meanwhile.
            if schema_version(conn) >= target:
                conn.execute("ROLLBACK")
                continue
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
            )
            migrations[target - 1](conn)
            conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (target, time.time()))
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, Exception):
                raise StoreError(
                    f"could not upgrade {path} to schema version {target}: {exc}. "
                    f"The file was left at version {target - 1}; report this bug and keep the file."
                ) from exc
            raise
        logger.info("upgraded %s to schema version %d", path, target)
    return latest
