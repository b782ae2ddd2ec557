"""Search over chat titles and message text: the queries (the index itself, its triggers and its background
build are app/store/search_index.py).

A query of three characters or more asks the FTS5 trigram index (any substring, case-insensitively) for the
newest matching messages and titles, and scans the messages below ``indexed_from`` that the background build
has not reached; one or two characters, ``TANDEM_SEARCH_INDEX=off`` or a SQLite without FTS5 scan everything,
newest first, stopping at the limit. ``ChatSearch`` runs queries on a worker thread with its own read-only
connection; a new keystroke interrupts the last one.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from app.store.records import Chat, chat_from_row
from app.store.search_index import has_index, index_wanted, indexed_from

logger = logging.getLogger(__name__)

MIN_INDEXED = 3  # the trigram tokenizer indexes runs of three characters; shorter queries scan
SNIPPET_CHARS = 60  # about this much text around the match
SHOWN_LIMIT = 200  # the sidebar lists this many matching chats at most: the newest matches


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
        # Where the backfill has reached, read before the index: it only moves down, so the index holds at least
        # everything from `below` up and the scan takes the rest. Read after, a batch committed in between was in
        # neither (a race the migration test lost under load: chats missing from "alpha").
        below = indexed_from(conn)
        titles = [
            row[0]
            for row in conn.execute("SELECT rowid FROM title_search WHERE title_search MATCH ?", (_phrase(query),))
        ]
        matches = conn.execute(
            "SELECT rowid, chat_id FROM message_search WHERE message_search MATCH ? ORDER BY rowid DESC",
            (_phrase(query),),
        )
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
