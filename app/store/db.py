"""The SQLite connection: opening (WAL, foreign keys, migrations), one transaction per write, JSON columns.

Durability: every write is one ``BEGIN IMMEDIATE ... COMMIT``; when a store method returns, its change
is in the WAL file. ``synchronous=NORMAL`` with WAL means a commit is written to the OS but not
fsynced: a crash or ``kill -9`` of Tandem loses nothing already committed, and the file is never
corrupted; only an OS crash or power cut may drop the last commits. ``FULL`` would fsync on every
commit, i.e. a disk flush on the GUI thread once a second per streaming answer, which stalls
frames on slow disks for no gain against the failure we guard (the app dying mid-answer).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from app.store.errors import StoreError
from app.store.migrations import MIGRATIONS, Migration, check_compatible, migrate
from app.store.search import fold
from app.store.search_index import ensure_index, has_index, index_supported, index_wanted

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _is_not_a_database(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorname", "") in ("SQLITE_NOTADB", "SQLITE_CORRUPT") or "not a database" in str(exc)


class Database:
    """One connection to the store file, used from one thread (the GUI thread)."""

    def __init__(self, path: Path, migrations: Sequence[Migration] = MIGRATIONS) -> None:
        self.path = path
        self._last_time = 0.0
        self._closed = False
        # Held around each write transaction, here and by the search index backfill's batches on its thread:
        # SQLite's busy wait polls, and a writer that takes the lock again 10 ms after releasing it could keep
        # this one waiting past its timeout; a lock hands over within one batch (~0.1 s).
        self.write_lock = threading.Lock()
        if path.is_dir():
            raise StoreError(f"{path} is a folder, not a database file; choose a file path for Tandem's data.")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: autocommit, so transactions are exactly the BEGIN/COMMIT we write.
            self._conn = sqlite3.connect(path, isolation_level=None, timeout=5.0)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"could not open {path}: {exc}. Check that the folder exists and is writable.") from exc
        try:
            self._conn.row_factory = sqlite3.Row
            # Case-insensitive search beyond ASCII (SQLite's LIKE folds only A-Z).
            self._conn.create_function("tandem_fold", 1, fold, deterministic=True)
            # Read-only checks first: a file that is not ours (not SQLite, another app's, a newer
            # Tandem's) is refused before switching to WAL, which would rewrite its header.
            check_compatible(self._conn, path, len(migrations))
            mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                logger.warning("%s: SQLite refused WAL mode (journal_mode=%s)", path, mode)
            self._conn.execute("PRAGMA synchronous = NORMAL")  # see the module docstring
            self._conn.execute("PRAGMA foreign_keys = ON")
            self.version = migrate(self._conn, path, migrations)
            self.indexed = self._check_index()
        except StoreError:
            self._conn.close()
            raise
        except sqlite3.Error as exc:
            self._conn.close()
            if _is_not_a_database(exc):
                raise StoreError(
                    f"{path} is not a Tandem database (not an SQLite file, or damaged: {exc}). "
                    "Move it aside or choose another file; Tandem will then start a new one."
                ) from exc
            raise StoreError(f"could not open {path}: {exc}") from exc

    def _check_index(self) -> bool:
        """Whether searches can use the index; fixes it first where this SQLite and the file disagree (see
        ensure_index). Read-only when all is well, so a normal start takes no write lock."""
        if self.version < 2:
            return False  # a store made to stop at version 1 (tools, tests): the index is version 2
        if index_wanted() and has_index(self._conn) and index_supported(self._conn):
            return True
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            usable = ensure_index(self._conn)
            self._conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        return usable

    def now(self) -> float:
        """Wall-clock seconds, strictly increasing within this store so "newest first" is exact even
        where the clock is coarse (Windows ticks ~15 ms)."""
        self._last_time = max(time.time(), self._last_time + 1e-6)
        return self._last_time

    def rows(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        """Run a read query and return all rows."""
        self._check_open()
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"could not read {self.path}: {exc}") from exc

    def row(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Row | None:
        """Run a read query and return its first row, or None."""
        found = self.rows(sql, params)
        return found[0] if found else None

    def read(self, reader: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``reader`` on the connection (queries only); SQLite errors come out as StoreError."""
        self._check_open()
        try:
            return reader(self._conn)
        except sqlite3.Error as exc:
            raise StoreError(f"could not read {self.path}: {exc}") from exc

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One transaction: committed when the block ends, rolled back (nothing written) if it raises.

        SQLite errors come out as :class:`StoreError`; other exceptions (KeyError, ValueError) pass
        through after the rollback.
        """
        self._check_open()
        with self.write_lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"could not write to {self.path}: {exc}") from exc
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                raise StoreError(f"could not save to {self.path}: {exc}. Nothing of this change was written.") from exc
            except BaseException:
                self._rollback()
                raise

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"the store for {self.path} is closed")

    def close(self) -> None:
        """Close the connection; later calls raise StoreError."""
        if not self._closed:
            self._closed = True
            self._conn.close()


def to_json(value: Any, what: str) -> str:
    """Encode a value for a JSON column, or raise ValueError naming ``what`` (before any write starts)."""
    try:
        return json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{what} must hold only JSON values (str, int, float, bool, None, lists, dicts): {exc}"
        ) from None


def dict_json(value: dict[str, Any] | None, what: str) -> str:
    """``to_json`` for a column that holds a dict (None means empty)."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a dict, got {type(value).__name__}")
    return to_json(value, what)
