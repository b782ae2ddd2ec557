"""The search index over chat titles and message text: an SQLite FTS5 index (trigram tokenizer, so any substring of
three characters or more matches, case-insensitively) kept in step with the tables by triggers.

Why an index: a scan runs a Python function over every message, seconds per search on a long history and
growing with it. The index answers from the trigrams' lists.

Both indexes are "external content" tables (``content='messages'``/``'chats'``): they hold only the
trigrams, and a search reads the text from the real row, so the text is not stored twice. Triggers on
insert, delete (a chat's cascade included) and update of the text keep them exact inside the same
transaction as the write.

Where the index cannot be used, searching still works by the scan: a SQLite built without FTS5 or older than
3.34 (no trigram tokenizer), ``TANDEM_SEARCH_INDEX=off`` in the environment, or a query of one or two
characters (trigrams need three; those scan messages newest first and stop at the limit). A database whose
index triggers were dropped (opened once by a SQLite without FTS5, see :func:`ensure_index`) is re-indexed
the next time FTS5 is there.

Upgrading (schema 1 -> 2) or re-indexing indexes the titles at once and the messages in the background
(:class:`Backfill`, minutes for a long history), newest first; ``search_index_state.indexed_from`` says
how far it got, and searches scan below it, so answers are whole meanwhile.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

INDEX_ENV = "TANDEM_SEARCH_INDEX"  # "off": never build or use the index (the scan answers)

_TABLES = (
    "CREATE VIRTUAL TABLE message_search USING fts5("
    "text, chat_id UNINDEXED, content='messages', content_rowid='id', tokenize='trigram')",
    "CREATE VIRTUAL TABLE title_search USING fts5(title, content='chats', content_rowid='id', tokenize='trigram')",
    # Messages with id >= indexed_from are in message_search; older ones wait for the backfill (see Backfill).
    "CREATE TABLE search_index_state (id INTEGER PRIMARY KEY CHECK (id = 1), indexed_from INTEGER NOT NULL)",
)
INDEX_TABLES = ("message_search", "title_search", "search_index_state")
_INDEXED = "(SELECT indexed_from FROM search_index_state)"
# External-content FTS5 tables are told about each change; 'delete' needs the old values to find the trigrams.
# A message the backfill has not reached yet is not in the index, so its changes are not either (the WHEN):
# a 'delete' of trigrams that were never added would damage the index.
_TRIGGERS = {
    "message_search_insert": f"""CREATE TRIGGER message_search_insert AFTER INSERT ON messages
    WHEN new.id >= {_INDEXED} BEGIN
        INSERT INTO message_search (rowid, text, chat_id) VALUES (new.id, new.text, new.chat_id);
    END""",
    "message_search_delete": f"""CREATE TRIGGER message_search_delete AFTER DELETE ON messages
    WHEN old.id >= {_INDEXED} BEGIN
        INSERT INTO message_search (message_search, rowid, text, chat_id)
        VALUES ('delete', old.id, old.text, old.chat_id);
    END""",
    "message_search_update": f"""CREATE TRIGGER message_search_update AFTER UPDATE OF text ON messages
    WHEN old.id >= {_INDEXED} BEGIN
        INSERT INTO message_search (message_search, rowid, text, chat_id)
        VALUES ('delete', old.id, old.text, old.chat_id);
        INSERT INTO message_search (rowid, text, chat_id) VALUES (new.id, new.text, new.chat_id);
    END""",
    "title_search_insert": """CREATE TRIGGER title_search_insert AFTER INSERT ON chats BEGIN
        INSERT INTO title_search (rowid, title) VALUES (new.id, new.title);
    END""",
    "title_search_delete": """CREATE TRIGGER title_search_delete AFTER DELETE ON chats BEGIN
        INSERT INTO title_search (title_search, rowid, title) VALUES ('delete', old.id, old.title);
    END""",
    "title_search_update": """CREATE TRIGGER title_search_update AFTER UPDATE OF title ON chats BEGIN
        INSERT INTO title_search (title_search, rowid, title) VALUES ('delete', old.id, old.title);
        INSERT INTO title_search (rowid, title) VALUES (new.id, new.title);
    END""",
}
BACKFILL_BATCH = 500  # messages in the first write transaction; later ones are sized to take BATCH_SECONDS
BATCH_SECONDS = 0.05  # the longest a GUI write should wait for a batch
MERGE_PAGES = 200  # FTS5 'merge' work per transaction after the backfill (see Backfill._merge)


def is_index_table(name: str) -> bool:
    """An index table or one of the shadow tables FTS5 keeps for it (message_search_data, ..._idx, ...)."""
    return any(name == table or name.startswith(f"{table}_") for table in INDEX_TABLES)


def index_wanted() -> bool:
    """False where the user (or a test) turned the index off with ``TANDEM_SEARCH_INDEX=off``."""
    return os.environ.get(INDEX_ENV, "").strip().lower() not in ("off", "0", "no", "false")


def index_supported(conn: sqlite3.Connection) -> bool:
    """Whether this SQLite has FTS5 with the trigram tokenizer (3.34 and later, built with FTS5)."""
    try:
        conn.execute("CREATE VIRTUAL TABLE temp.tandem_probe USING fts5(x, tokenize='trigram')")
    except sqlite3.Error:
        return False
    conn.execute("DROP TABLE temp.tandem_probe")
    return True


def _names(conn: sqlite3.Connection, kind: str) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = ?", (kind,))}


def has_index(conn: sqlite3.Connection) -> bool:
    """Whether the index is there and kept in step (its tables and every trigger)."""
    return set(INDEX_TABLES) <= _names(conn, "table") and set(_TRIGGERS) <= _names(conn, "trigger")


def ensure_index(conn: sqlite3.Connection) -> bool:
    """Bring the index to the state this SQLite allows, inside the caller's transaction; True if it is usable.

    - FTS5 there, index missing or its triggers dropped: create what is missing, index the titles, and leave
      the existing messages to :class:`Backfill` (1.2 million messages take minutes, which must not be spent
      starting the app); new messages are indexed from now on by the triggers.
    - FTS5 missing but the file has the index's triggers (made by another SQLite): drop the triggers, or
      every write to messages would fail with "no such module: fts5". The index is then stale, and is
      emptied and filled again the next time FTS5 is there (the missing triggers say so).
    - Turned off by ``TANDEM_SEARCH_INDEX=off``: left as it is, and not used.
    """
    if not index_wanted():
        return False
    triggers = _names(conn, "trigger")
    if not index_supported(conn):
        for name in set(_TRIGGERS) & triggers:
            conn.execute(f"DROP TRIGGER {name}")  # names from this module only
        return False
    if has_index(conn):
        return True
    tables = _names(conn, "table")
    for name, statement in zip(INDEX_TABLES, _TABLES, strict=True):
        if name not in tables:
            conn.execute(statement)
    for name in ("message_search", "title_search"):
        conn.execute(f"INSERT INTO {name} ({name}) VALUES ('delete-all')")  # whatever a stale index held
    conn.execute("INSERT INTO title_search (title_search) VALUES ('rebuild')")  # titles are few and short: done at once
    (pending,) = conn.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM messages").fetchone()
    conn.execute("INSERT OR REPLACE INTO search_index_state (id, indexed_from) VALUES (1, ?)", (pending,))
    for name, statement in _TRIGGERS.items():
        if name not in triggers:
            conn.execute(statement)
    return True


def indexed_from(conn: sqlite3.Connection) -> int:
    """The lowest message id from which every message is in the index (0 once the backfill is done)."""
    row = conn.execute(
        "SELECT CASE WHEN s.indexed_from > COALESCE((SELECT MIN(id) FROM messages), 0) THEN s.indexed_from ELSE 0"
        " END FROM search_index_state AS s"
    ).fetchall()  # all: no statement left open (an open read would pin this connection's snapshot)
    return int(row[0][0]) if row else 0


def backfill_step(conn: sqlite3.Connection, batch: int = BACKFILL_BATCH) -> int:
    """Index the next ``batch`` older messages, inside the caller's write transaction; returns about how many
    are still waiting (the ids below the new bound: exact while ids have no gaps), 0 when done."""
    upper = indexed_from(conn)
    if upper == 0:
        return 0
    (lower,) = conn.execute(
        "SELECT COALESCE(MIN(id), 0) FROM (SELECT id FROM messages WHERE id < ? ORDER BY id DESC LIMIT ?)",
        (upper, batch),
    ).fetchone()
    conn.execute(
        "INSERT INTO message_search (rowid, text, chat_id)"
        " SELECT id, text, chat_id FROM messages WHERE id >= ? AND id < ?",
        (lower, upper),
    )
    conn.execute("UPDATE search_index_state SET indexed_from = ?", (lower,))
    # Not COUNT(*): that reads every older row, each batch.
    (lowest,) = conn.execute("SELECT COALESCE(MIN(id), 0) FROM messages").fetchone()
    return max(0, lower - lowest)


class Backfill:
    """Indexes the messages written before the index existed, newest first, on a thread with its own
    connection, one short write transaction at a time (so the GUI thread's writes wait at most one batch).
    Searches meanwhile use the index for what it holds and scan the rest, so their answers are whole."""

    def __init__(self, path: Path, write_lock: threading.Lock, batch: int = BACKFILL_BATCH) -> None:
        self.path = path
        self.batch = batch
        self._write_lock = write_lock  # the store's: its writes wait for one batch at most (see Database)
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="tandem-search-backfill", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
        except sqlite3.Error as exc:
            self.error = exc
            logger.warning("search index backfill could not open %s: %s", self.path, exc)
            return
        try:
            # As the store's own connection (see db.py): a commit is not fsynced, which would take seconds on a
            # busy disk while the GUI waits for the lock.
            conn.execute("PRAGMA synchronous = NORMAL")
            left, logged, batch = 1, started, self.batch
            while left and not self._stop.is_set():
                begun = time.perf_counter()
                left = self._locked(conn, lambda c, n=batch: backfill_step(c, n))
                took = time.perf_counter() - begun
                batch = max(50, min(20_000, int(batch * BATCH_SECONDS / max(took, 1e-3))))
                if time.perf_counter() - logged > 5:
                    logged = time.perf_counter()
                    logger.info("search index: %d older messages still to index", left)
                time.sleep(0.01)  # the lock is not fair: give a waiting GUI write the gap between batches
            if not left:
                logger.info("search index: older messages indexed in %.0f s", time.perf_counter() - started)
                self._merge(conn)
        except sqlite3.Error as exc:
            # Searches still answer (by the scan for what is not indexed); the next start carries on.
            self.error = exc
            logger.warning("search index backfill stopped: %s; it goes on at the next start", exc)
        finally:
            conn.close()

    def _locked(self, conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], int]) -> int:
        with self._write_lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = work(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return result

    def _merge(self, conn: sqlite3.Connection) -> None:
        """Merge the many small segments the batches left into fewer large ones, a little per transaction:
        a search then reads one list per trigram instead of dozens. FTS5's 'optimize' would do it in one long
        write transaction that blocks the window's saves."""
        started = time.perf_counter()
        while not self._stop.is_set():
            before = conn.total_changes
            self._locked(
                conn,
                lambda c: (
                    c.execute(
                        "INSERT INTO message_search (message_search, rank) VALUES ('merge', ?)", (MERGE_PAGES,)
                    ).rowcount
                ),
            )
            if conn.total_changes - before < 2:  # FTS5's sign that no merge work was left
                logger.info("search index: segments merged in %.0f s", time.perf_counter() - started)
                return
            time.sleep(0.01)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the backfill to end; True if it did within ``timeout``."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        """Stop after the batch in progress (committed or rolled back whole) and wait for the thread."""
        self._stop.set()
        self._thread.join()
