"""Opening the store whatever state its file is in: a damaged file is moved aside (never deleted) and what
can still be read is copied into a new one, so the app always starts and says what happened.

The cases, each with its own message (`Opened.notice`, shown by the window; the headless paths print it):
- a damaged page inside a valid database (found by `PRAGMA quick_check` when opening, before any chat is
  read: otherwise every start would fail with "database disk image is malformed" once the last chat opened);
- a file that is not a database at all (garbage);
- an empty (0-byte) file, as a full disk or a crash while creating it leaves;
- a folder Tandem cannot write: nothing to recover, a `StoreError` saying which folder and what to do.

Recovery reads table by table and, past a damaged page, row by row (by rowid), keeping every row SQLite can
still read; rows whose chat was lost are dropped (the foreign keys). sqlite3's `.recover` would find more
in badly broken files, but it is a command of the sqlite3 shell, which Python's module does not have and
which a user's machine may not have either.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.store.errors import StoreError
from app.store.search_index import is_index_table
from app.store.store import DB_FILE_NAME, Store

log = logging.getLogger(__name__)

# Rowids probed one by one past a damaged page when the table's largest rowid cannot be read either.
_PROBE_LIMIT = 200_000


@dataclass
class Opened:
    store: Store
    notice: str | None = None  # what happened to the file, for the user; None when it opened as it was
    moved_to: Path | None = None  # where the damaged file went
    recovered: dict[str, int] = field(default_factory=dict)  # rows copied, by table


def open_store(path: Path | str | None = None, store_class: type[Store] = Store) -> Opened:
    """The store at `path` (the user's data folder by default), recovered if it is damaged. Raises StoreError
    only where nothing can be done here (a folder that cannot be written, a newer Tandem's file)."""
    if path is None:
        from engine.paths import user_data_dir

        try:
            path = user_data_dir() / DB_FILE_NAME
        except OSError as e:
            raise StoreError(
                f"Tandem cannot create its data folder {e.filename}: {e.strerror or e}. Create it with write "
                "permission for your user, or set TANDEM_DATA_DIR to a folder you can write."
            ) from None
    path = Path(path)
    _check_writable(path.parent)
    if path.is_file() and path.stat().st_size == 0 and not _sibling(path, "-wal").exists():
        aside = _move_aside(path)
        store = store_class(path)
        return Opened(store, f"Tandem's data file {path} was empty (0 bytes), as a full disk or a crash while it "
                      f"was first written leaves it. It was moved to {aside.name} and a new one was started.", aside)  # fmt: skip
    try:
        store = store_class(path)
    except StoreError as e:
        if not _is_damage(e):
            raise
        return _recover(path, store_class, f"it is not a database SQLite can read ({_cause(e)})")
    problem = _quick_check(path)
    if problem is None:
        return Opened(store)
    store.close()
    return _recover(path, store_class, f"SQLite found damage inside it ({problem})")


def _recover(path: Path, store_class: type[Store], reason: str) -> Opened:
    aside = _move_aside(path)
    log.warning("%s is damaged (%s): moved to %s, recovering what can be read", path, reason, aside)
    store_class(path).close()  # a new file with the current schema
    counts = _copy_readable(aside, path)
    store = store_class(path)
    chats, messages = counts.get("chats", 0), counts.get("messages", 0)
    if chats or messages:
        what = f"{chats} chat{'s' * (chats != 1)} and {messages} message{'s' * (messages != 1)} were recovered"
    else:
        what = "nothing in it could be read, so Tandem started with a new, empty file"
    notice = (
        f"Tandem's data file was damaged: {reason}. The damaged file was kept as {aside} (nothing was deleted); {what}."
    )
    return Opened(store, notice, aside, counts)


def _check_writable(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(
            f"Tandem cannot create its data folder {folder}: {e.strerror or e}. Create it with write permission "
            "for your user, or set TANDEM_DATA_DIR to a folder you can write."
        ) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise StoreError(
            f"Tandem's data folder {folder} is read-only for this user, so chats cannot be saved. Give your user "
            "write permission on it, or set TANDEM_DATA_DIR to a folder you can write."
        )


def _is_damage(e: StoreError) -> bool:
    text = str(e)
    return "not a Tandem database" in text or "malformed" in text or "not a database" in text


def _cause(e: StoreError) -> str:
    cause = e.__cause__
    return str(cause) if cause is not None else str(e)


def _quick_check(path: Path) -> str | None:
    """None when SQLite's quick_check passes; else its first complaint. O(file size), a few ms for a chat
    history of thousands of messages."""
    try:
        conn = sqlite3.connect(path, timeout=5.0)
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        return str(e)
    first = rows[0][0] if rows else "no answer"
    return None if first == "ok" else first


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _move_aside(path: Path) -> Path:
    """Rename the file (and its WAL, which holds committed writes not yet in it) to a dated name beside it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    os.replace(path, aside)
    for suffix in ("-wal", "-shm"):
        if _sibling(path, suffix).exists():
            os.replace(_sibling(path, suffix), _sibling(aside, suffix))
    return aside


def _copy_readable(source: Path, target: Path) -> dict[str, int]:
    """Copy every readable row of `source`'s tables into `target`'s tables of the same name (the columns both
    have); returns the rows copied per table."""
    counts: dict[str, int] = {}
    try:
        src = sqlite3.connect(source, timeout=5.0)
    except sqlite3.Error:
        return counts
    dst = sqlite3.connect(target, isolation_level=None, timeout=5.0)
    try:
        dst.execute("PRAGMA foreign_keys = OFF")  # rows arrive in table order; orphans are dropped at the end
        dst.execute("BEGIN")
        tables = [r[0] for r in dst.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            if table.startswith("sqlite_") or table == "schema_version" or is_index_table(table):
                continue  # the search index is not copied: the triggers index each copied row
            counts[table] = _copy_table(src, dst, table)
        for table, rowid, *_ in dst.execute("PRAGMA foreign_key_check").fetchall():
            dst.execute(f'DELETE FROM "{table}" WHERE rowid = ?', (rowid,))
            counts[table] -= 1
        dst.execute("COMMIT")
    finally:
        src.close()
        dst.close()
    return counts


def _copy_table(src: sqlite3.Connection, dst: sqlite3.Connection, table: str) -> int:
    try:
        theirs = {r[1] for r in src.execute(f'PRAGMA table_info("{table}")')}
    except sqlite3.DatabaseError:
        return 0
    columns = [r[1] for r in dst.execute(f'PRAGMA table_info("{table}")') if r[1] in theirs]
    if not columns:
        return 0
    names = ", ".join(f'"{c}"' for c in columns)
    insert = f'INSERT OR IGNORE INTO "{table}" (rowid, {names}) VALUES (?, {", ".join("?" * len(columns))})'
    copied, last = 0, 0
    try:
        for row in src.execute(f'SELECT rowid, {names} FROM "{table}" ORDER BY rowid'):
            copied += dst.execute(insert, row).rowcount
            last = row[0]
        return copied
    except sqlite3.DatabaseError:
        pass  # a damaged page: go on row by row past it
    try:
        highest = src.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0] or last
    except sqlite3.DatabaseError:
        highest = last + _PROBE_LIMIT
    for rowid in range(last + 1, min(highest, last + _PROBE_LIMIT) + 1):
        try:
            row = src.execute(f'SELECT rowid, {names} FROM "{table}" WHERE rowid = ?', (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            continue
        if row is not None:
            copied += dst.execute(insert, row).rowcount
    return copied
