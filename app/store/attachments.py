"""Attachments: bytes stored once by sha256 as ``<data dir>/attachments/<sha>.<suffix>``.

A row in ``attachments`` per file; ``message_attachments`` links messages to shas. A file goes when
the last message using it is deleted. Files added but never sent (the user dropped an image and
closed the tab) are swept when a store opens, once a day old, so a draft in progress is never lost.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path

from app.store.db import Database
from app.store.drafts import is_linked, linked_shas_sql
from app.store.errors import NotFoundError, StoreError

logger = logging.getLogger(__name__)

_SUFFIX = re.compile(r"[a-z0-9]{1,16}")
_SHA = re.compile(r"[0-9a-f]{64}")
UNSENT_GRACE_S = 24 * 3600.0


def clean_suffix(suffix: str) -> str:
    """ "png", ".PNG" -> "png"; anything that is not 1-16 letters/digits is a ValueError (it becomes a file name)."""
    cleaned = suffix.lstrip(".").lower() if isinstance(suffix, str) else ""
    if not _SUFFIX.fullmatch(cleaned):
        raise ValueError(f"attachment suffix must be 1-16 letters or digits such as 'png', got {suffix!r}")
    return cleaned


def _write_atomic(path: Path, data: bytes) -> None:
    # Write then rename: a crash leaves the old file or the whole new one, never half an image.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def chat_shas(conn: sqlite3.Connection, chat_id: int) -> set[str]:
    """Shas linked to a chat's messages."""
    sql = "SELECT DISTINCT a.sha FROM message_attachments AS a JOIN messages AS m ON m.id = a.message_id"
    return {row[0] for row in conn.execute(sql + " WHERE m.chat_id = ?", (chat_id,))}


class Attachments:
    """The attachment files under ``attachments_dir`` and their rows; chats and messages drop theirs through it."""

    def __init__(self, db: Database, attachments_dir: Path) -> None:
        self._db = db
        self.attachments_dir = attachments_dir

    def add(self, data: bytes, suffix: str, sha256: str | None = None) -> str:
        """Store ``data`` once (same bytes -> same file) and return its sha256 hex digest.

        ``suffix`` ("png", ".jpg") names the file type; bytes already stored keep their first suffix.
        ``sha256``: the digest of ``data`` when the caller has it already (the window's attachment check
        computed it), so the bytes are hashed once; it must be that digest, as it names the file.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"attachment data must be bytes, got {type(data).__name__}")
        suffix = clean_suffix(suffix)
        data = bytes(data)
        sha = sha256 if sha256 is not None else hashlib.sha256(data).hexdigest()
        row = self._db.row("SELECT suffix FROM attachments WHERE sha = ?", (sha,))
        path = self.attachments_dir / f"{sha}.{row['suffix'] if row else suffix}"
        if not (path.is_file() and path.stat().st_size == len(data)):
            try:
                self.attachments_dir.mkdir(parents=True, exist_ok=True)
                _write_atomic(path, data)
            except OSError as exc:
                raise StoreError(f"could not save the attachment to {path}: {exc}") from exc
        if row is None:
            # The file exists before its row, so a row never points at a missing file.
            with self._db.write() as conn:
                conn.execute(
                    "INSERT OR IGNORE INTO attachments (sha, suffix, size, created_at) VALUES (?, ?, ?, ?)",
                    (sha, suffix, len(data), time.time()),
                )
        return sha

    def path(self, sha: str) -> Path:
        """The file holding attachment ``sha``; KeyError (NotFoundError) for an unknown sha."""
        row = self._db.row("SELECT suffix FROM attachments WHERE sha = ?", (sha,))
        if row is None:
            raise NotFoundError(f"no attachment {sha!r} in {self._db.path}; store its bytes with add_attachment first")
        return self.attachments_dir / f"{sha}.{row['suffix']}"

    # -- helpers for deletes (called inside the caller's transaction)

    def drop_unused(self, conn: sqlite3.Connection, shas: Iterable[str]) -> list[Path]:
        """Delete the rows of those ``shas`` no message links any more; return their files to remove
        after the transaction commits (a rollback must not lose files)."""
        unused = []
        for sha in shas:
            if is_linked(conn, sha):  # by a message or a draft
                continue
            row = conn.execute("SELECT suffix FROM attachments WHERE sha = ?", (sha,)).fetchone()
            if row is not None:  # (no DELETE ... RETURNING: it needs SQLite 3.35, older than some distros ship)
                conn.execute("DELETE FROM attachments WHERE sha = ?", (sha,))
                unused.append(self.attachments_dir / f"{sha}.{row[0]}")
        return unused

    def remove_files(self, paths: Iterable[Path]) -> None:
        """Unlink files (after their rows' transaction committed); a failure is logged, the sweep retries it."""
        for path in paths:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:  # a leftover file is harmless; the open-time sweep retries it
                logger.warning("could not remove unused attachment %s: %s", path, exc)

    def sweep(self) -> None:
        """Remove attachments never linked to a message and files without a row (a crash between
        writing a file and its row, or after a delete committed), once they are a day old."""
        cutoff = time.time() - UNSENT_GRACE_S
        with self._db.write() as conn:
            unlinked = f"created_at < ? AND sha NOT IN ({linked_shas_sql(conn)})"
            stale = conn.execute(f"SELECT sha, suffix FROM attachments WHERE {unlinked}", (cutoff,)).fetchall()
            conn.execute(f"DELETE FROM attachments WHERE {unlinked}", (cutoff,))
        paths = [self.attachments_dir / f"{sha}.{suffix}" for sha, suffix in stale]
        known = {row[0] for row in self._db.rows("SELECT sha FROM attachments")}
        try:
            for path in self.attachments_dir.iterdir() if self.attachments_dir.is_dir() else ():
                sha = path.name.lstrip(".").split(".", 1)[0]
                orphan = sha not in known or path.name.endswith(".tmp")
                if _SHA.fullmatch(sha) and orphan and path.is_file() and path.stat().st_mtime < cutoff:
                    paths.append(path)
        except OSError as exc:  # an unreadable folder must not keep the app from starting
            logger.warning("could not scan %s for unused attachments: %s", self.attachments_dir, exc)
        self.remove_files(paths)
