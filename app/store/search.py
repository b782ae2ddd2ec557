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
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
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
)
# External-content FTS5 tables are told about each change; 'delete' needs the old values to find the trigrams.
_TRIGGERS = {
    "message_search_insert": """CREATE TRIGGER message_search_insert AFTER INSERT ON messages BEGIN
        INSERT INTO message_search (rowid, text, chat_id) VALUES (new.id, new.text, new.chat_id);
    END""",
    "message_search_delete": """CREATE TRIGGER message_search_delete AFTER DELETE ON messages BEGIN
        INSERT INTO message_search (message_search, rowid, text, chat_id)
        VALUES ('delete', old.id, old.text, old.chat_id);
    END""",
    "message_search_update": """CREATE TRIGGER message_search_update AFTER UPDATE OF text ON messages BEGIN
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
INDEX_TABLES = ("message_search", "title_search")


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

    - FTS5 there, index missing or its triggers dropped: create what is missing and index every row (once;
      1.2 million messages take about a minute, logged as it goes).
    - FTS5 missing but the file has the index's triggers (made by another SQLite): drop the triggers, or
      every write to messages would fail with "no such module: fts5". The index is then stale, and is
      rebuilt the next time FTS5 is there (the missing triggers say so).
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
    for name, statement in _TRIGGERS.items():
        if name not in triggers:
            conn.execute(statement)
    started = time.perf_counter()
    for table in INDEX_TABLES:
        # 'rebuild' re-reads the whole content table: right for a new index and for a stale one alike.
        conn.execute(f"INSERT INTO {table} ({table}) VALUES ('rebuild')")
    logger.info("built the search index in %.1f s", time.perf_counter() - started)
    return True


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
    else:
        titles = [
            row[0] for row in conn.execute("SELECT id FROM chats WHERE instr(tandem_fold(title), ?) > 0", (folded,))
        ]
        matches = conn.execute(
            "SELECT id, chat_id FROM messages WHERE instr(tandem_fold(text), ?) > 0 ORDER BY id DESC", (folded,)
        )
    newest: dict[int, int] = {}  # chat id -> its newest matching message id
    for message_id, chat_id in matches:
        if chat_id not in newest:
            newest[chat_id] = message_id
            if limit is not None and len(newest) >= limit:
                break
    matches.close()
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


def _snippet(conn: sqlite3.Connection, message_id: int, query: str, indexed: bool) -> str:
    if indexed:
        # snippet() counts trigram tokens, about one a character; the ends are trimmed to whole words by _tidy.
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
        self._executor.submit(self._close_conn)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _close_conn(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
