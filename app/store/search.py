"""Search over chat titles and message text: an SQLite FTS5 index (trigram tokenizer, so any substring of
three characters or more matches, case-insensitively) kept in step with the tables by triggers.

Why an index: the scan before it ran a Python function over every message, 2.5 s per search on a history of
30,000 chats and 1.2 million messages, growing with the history. The index answers from the trigrams' lists.

Both indexes are "external content" tables (``content='messages'``/``'chats'``): they hold only the
trigrams, and ``snippet()`` reads the text from the real row, so the text is not stored twice. Triggers on
insert, delete (a chat's cascade included) and update of the text keep them exact inside the same
transaction as the write.

Where the index cannot be used, searching still works by the scan: a SQLite built without FTS5 or older than
3.34 (no trigram tokenizer), ``TANDEM_SEARCH_INDEX=off`` in the environment, or a query of one or two
characters (trigrams need three; those scan messages newest first and stop at the limit). A database whose
index triggers were dropped (opened once by a SQLite without FTS5, see :func:`ensure_index`) is re-indexed
the next time FTS5 is there.

Upgrading (schema 1 -> 2) or re-indexing indexes the titles at once and the messages in the background
(:class:`Backfill`, 121 s for 1.2 million messages), newest first; ``search_index_state.indexed_from`` says
how far it got, and searches scan below it, so answers are whole meanwhile.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from app.store.records import Chat, chat_from_row

logger = logging.getLogger(__name__)

INDEX_ENV = "TANDEM_SEARCH_INDEX"  # "off": never build or use the index (the scan answers)
MIN_INDEXED = 3  # the trigram tokenizer indexes runs of three characters; shorter queries scan
SNIPPET_CHARS = 60  # about this much text around the match
SHOWN_LIMIT = 200  # the sidebar lists this many matching chats at most: the newest matches

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
    conn.execute("INSERT INTO title_search (title_search) VALUES ('rebuild')")  # 30,000 titles: well under 1 s
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
        a search then reads one list per trigram instead of dozens (on 1.2M messages, 'garlic' went from
        240 ms to 50 ms after a full merge). FTS5's 'optimize' would do it in one 25 s write transaction."""
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


@dataclass
class SearchHit:
    """A chat that matched; ``snippet`` is text around the newest matching message's match, or None when only
    the title matched."""

    chat: Chat
    snippet: str | None


def fold(text: str | None) -> str | None:
    """``tandem_fold``: Unicode case folding for the scan (SQLite's own LIKE folds only A-Z)."""
    return text.casefold() if text is not None else None


def _phrase(query: str) -> str:
    # One FTS5 string: the trigram tokenizer then matches it as a substring, operators and all taken literally.
    return '"' + query.replace('"', '""') + '"'


def _cut(text: str, start: int, length: int) -> str:
    """SNIPPET_CHARS of ``text`` around ``text[start:start + length]``, on one line, with … where cut."""
    before = max(0, start - (SNIPPET_CHARS - length) // 2)
    end = min(len(text), before + max(SNIPPET_CHARS, length))
    before = max(0, end - max(SNIPPET_CHARS, length))
    piece = " ".join(text[before:end].split())
    return ("…" if before > 0 else "") + piece + ("…" if end < len(text) else "")


def scan_snippet(text: str, query: str) -> str:
    """The snippet for a match the scan found (casefolded ``query`` in ``text``)."""
    folded = text.casefold()
    at = folded.find(query)
    if at < 0 or len(folded) != len(text):  # casefold changed the length (ß -> ss): cut from the start
        at = max(0, at)
    return _cut(text, at, len(query))


def search(conn: sqlite3.Connection, query: str, limit: int | None = None, use_index: bool = True) -> list[SearchHit]:
    """Chats whose title or message text contains ``query`` (ignoring case), most recently updated first.

    ``limit`` keeps the chats with the newest matching messages (and every title match), so a word that is
    in every chat costs as much as ``limit`` chats, not the whole history. ``conn`` needs ``tandem_fold``
    registered (:func:`connect` and the store's connection do). Blank ``query``: no hits.
    """
    query = query.strip()
    if not query:
        return []
    indexed = use_index and len(query) >= MIN_INDEXED
    folded = query.casefold()
    if indexed:
        titles = [
            row[0]
            for row in conn.execute("SELECT rowid FROM title_search WHERE title_search MATCH ?", (_phrase(query),))
        ]
        matches = conn.execute(
            "SELECT rowid, chat_id FROM message_search WHERE message_search MATCH ? ORDER BY rowid DESC",
            (_phrase(query),),
        )
        below = indexed_from(conn)
        if below:  # the backfill has not reached the oldest messages yet: scan those, after the indexed ones
            matches = chain(matches, _scan(conn, folded, below))
    else:
        titles = [
            row[0] for row in conn.execute("SELECT id FROM chats WHERE instr(tandem_fold(title), ?) > 0", (folded,))
        ]
        matches = _scan(conn, folded)
    newest: dict[int, int] = {}  # chat id -> its newest matching message id
    for message_id, chat_id in matches:
        if chat_id not in newest:
            newest[chat_id] = message_id
            if limit is not None and len(newest) >= limit:
                break
    ids = set(newest) | set(titles)
    if not ids:
        return []
    rows = conn.execute(
        f"SELECT * FROM chats WHERE id IN ({','.join('?' * len(ids))}) ORDER BY updated_at DESC, id DESC", list(ids)
    ).fetchall()
    if limit is not None:
        rows = rows[:limit]
    hits = []
    for row in rows:
        message_id = newest.get(row["id"])
        hits.append(
            SearchHit(chat_from_row(row), None if message_id is None else _snippet(conn, message_id, query, indexed))
        )
    return hits


def _scan(conn: sqlite3.Connection, folded: str, below: int | None = None) -> Iterator[tuple[int, int]]:
    """(message id, chat id) of messages containing ``folded`` (casefolded), newest first, ids below ``below``."""
    sql = "SELECT id, chat_id FROM messages WHERE instr(tandem_fold(text), ?) > 0"
    params: tuple[object, ...] = (folded,)
    if below is not None:
        sql, params = sql + " AND id < ?", (folded, below)
    yield from conn.execute(sql + " ORDER BY id DESC", params)


def _snippet(conn: sqlite3.Connection, message_id: int, query: str, indexed: bool) -> str:
    if indexed:
        # snippet() counts trigram tokens, one a character, and takes at most 64; a message the backfill has not
        # reached yet has no row here and gets the scan's snippet.
        row = conn.execute(
            "SELECT snippet(message_search, 0, '', '', '…', ?) FROM message_search"
            " WHERE message_search MATCH ? AND rowid = ?",
            (min(64, SNIPPET_CHARS), _phrase(query), message_id),
        ).fetchone()
        if row is not None:
            return " ".join(row[0].split())
    text = conn.execute("SELECT text FROM messages WHERE id = ?", (message_id,)).fetchone()[0]
    return scan_snippet(text, query.casefold())


def connect(path: Path) -> sqlite3.Connection:
    """A read-only connection to the store file for searching from another thread (WAL lets it read while the
    GUI thread writes)."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False, timeout=5.0)
    conn.row_factory = sqlite3.Row
    conn.create_function("tandem_fold", 1, fold, deterministic=True)
    return conn


class ChatSearch:
    """Searches the store file on a worker thread of its own, one search at a time; a new search interrupts
    the one running (typing on makes earlier queries moot)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tandem-search")
        self._conn: sqlite3.Connection | None = None
        self._use_index: bool | None = None
        self._lock = threading.Lock()  # guards _conn between the worker (opening it) and interrupt/close
        self._closed = False

    def submit(self, query: str, limit: int | None = None) -> Future[list[SearchHit]]:
        """Start a search; the future's result is the hits, or it raises sqlite3.Error
        (``sqlite3.OperationalError: interrupted`` when a later search or close() cut it short)."""
        if self._closed:
            raise RuntimeError("this ChatSearch is closed; make a new one with Store.chat_search()")
        self.interrupt()
        return self._executor.submit(self._run, query, limit)

    def _run(self, query: str, limit: int | None) -> list[SearchHit]:
        with self._lock:
            if self._conn is None:
                self._conn = connect(self.path)
                self._use_index = index_wanted() and has_index(self._conn)
            conn = self._conn
        return search(conn, query, limit, use_index=bool(self._use_index))

    def interrupt(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.interrupt()

    def close(self) -> None:
        """Stop the running search and the worker; the connection closes with it."""
        if self._closed:
            return
        self._closed = True
        self.interrupt()
        try:
            self._executor.submit(self._close_conn)  # on the worker, after the (interrupted) search
        except RuntimeError:  # the interpreter is exiting and takes no new work: close it here
            self._close_conn()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _close_conn(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
