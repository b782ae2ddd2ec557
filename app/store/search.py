"""Search over chat titles and message text: the queries (the index itself, its triggers and its background
build are app/store/search_index.py).

A query of three characters or more asks the FTS5 trigram index (any substring, case-insensitively) for the
newest matching messages and titles, and scans the messages below ``indexed_from`` that the background build
has not reached; one or two characters, ``TANDEM_SEARCH_INDEX=off`` or a SQLite without FTS5 scan everything,
newest first, stopping at the limit. ``ChatSearch`` runs queries on a worker thread with its own read-only
connection; a new keystroke interrupts the last one.

Why a long query does not go to FTS5 as one phrase: FTS5 walks every trigram's list of messages in step, and in
everyday words most trigrams are in a third of all messages or more. "not there at all" is 14 such trigrams:
as one phrase that matches nothing, FTS5 walks all 14 lists down to the oldest message, since it cannot stop
sooner. Instead the index is asked for the messages holding the query's three rarest trigrams, three or more
characters apart so they say more together, near each other (NEAR), and SQLite
keeps those whose text holds the query (casefolded, as the scan compares). Which trigrams are rare is read
from the index: the newest PROBE_ROWS messages of each say how dense it is (a short read each).
A trigram the index does not hold at all means nothing indexed matches.

Snippets are cut from the chosen messages' text (at most the limit's), not by FTS5's snippet(): asked for one
message, FTS5 walks each trigram's list from its start to that message, which for 200 chats would be most of a
search's time.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from app.store.records import Chat, chat_from_row
from app.store.search_index import has_index, index_wanted, indexed_from

logger = logging.getLogger(__name__)

MIN_INDEXED = 3  # the trigram tokenizer indexes runs of three characters; shorter queries scan
NEAR_TERMS = 3  # the trigrams asked of the index for a longer query; fewer leave too many texts to check
PROBE_ROWS = 256  # how many of a trigram's newest messages tell how common it is
MAX_PROBES = 32  # trigrams probed in a long (pasted) query, spread over it
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
        matches = _indexed(conn, query, folded)
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
    shown = [newest[row["id"]] for row in rows if row["id"] in newest]
    texts = dict(
        conn.execute(f"SELECT id, text FROM messages WHERE id IN ({','.join('?' * len(shown))})", shown).fetchall()
    )
    return [
        SearchHit(chat_from_row(row), scan_snippet(texts[newest[row["id"]]], folded) if row["id"] in newest else None)
        for row in rows
    ]


def _indexed(conn: sqlite3.Connection, query: str, folded: str) -> Iterator[tuple[int, int]]:
    """(message id, chat id) of the indexed messages containing ``query``, newest first (see the module's
    docstring for why a long query asks for a few rare trigrams near each other and checks the text)."""
    grams = [query[i : i + 3] for i in range(len(query) - 2)]  # the original case: FTS5 folds it as the text
    if len(grams) <= NEAR_TERMS:
        yield from conn.execute(
            "SELECT rowid, chat_id FROM message_search WHERE message_search MATCH ? ORDER BY rowid DESC",
            (_phrase(query),),
        )
        return
    chosen = rarest_apart(grams, lambda gram: _count_estimate(conn, gram))
    if chosen is None:
        return
    # Trigrams at query offsets i < j are j - i - 1 tokens apart in a matching text: at most len - 4.
    near = f"NEAR({' '.join(_phrase(grams[i]) for i in chosen)}, {len(query) - 3})"
    yield from conn.execute(
        "SELECT messages.id, messages.chat_id FROM message_search JOIN messages ON messages.id = message_search.rowid"
        " WHERE message_search MATCH ? AND instr(tandem_fold(messages.text), ?) > 0"
        " ORDER BY message_search.rowid DESC",
        (near, folded),
    )


def _count_estimate(conn: sqlite3.Connection, gram: str) -> float:
    """About how many indexed messages hold ``gram``: exact below PROBE_ROWS, else from how far back its newest
    PROBE_ROWS messages reach."""
    rows = conn.execute(
        "SELECT rowid FROM message_search WHERE message_search MATCH ? ORDER BY rowid DESC LIMIT ?",
        (_phrase(gram), PROBE_ROWS),
    ).fetchall()
    if len(rows) < PROBE_ROWS:
        return float(len(rows))
    newest, oldest = rows[0][0], rows[-1][0]
    return PROBE_ROWS * newest / (newest - oldest + 1)


def rarest_apart(grams: list[str], count: Callable[[str], float]) -> list[int] | None:
    """Offsets of up to NEAR_TERMS of ``grams`` to ask the index for: the rarest by ``count`` first, each at least
    three characters from the others (overlapping trigrams are in the same messages, so add little), in query
    order. None when one of them is in no message: then no message holds the query."""
    offsets = range(len(grams))
    if len(grams) > MAX_PROBES:
        offsets = sorted({round(k * (len(grams) - 1) / (MAX_PROBES - 1)) for k in range(MAX_PROBES)})
    counts: dict[str, float] = {}
    for i in offsets:
        if grams[i] not in counts:
            counts[grams[i]] = count(grams[i])
            if counts[grams[i]] == 0:
                return None
    by_rarity = sorted(offsets, key=lambda i: (counts[grams[i]], i))
    # Greedily from the rarest. One trigram alone leaves every message holding it to check: when the rarest
    # has no other three apart (the middle of a short query), start from the next rarest.
    chosen: list[int] = []
    for first in by_rarity:
        chosen = [first]
        for i in by_rarity:
            if len(chosen) < NEAR_TERMS and all(abs(i - j) >= 3 for j in chosen):
                chosen.append(i)
        if len(chosen) > 1:
            break
    return sorted(chosen)


def _scan(conn: sqlite3.Connection, folded: str, below: int | None = None) -> Iterator[tuple[int, int]]:
    """(message id, chat id) of messages containing ``folded`` (casefolded), newest first, ids below ``below``."""
    sql = "SELECT id, chat_id FROM messages WHERE instr(tandem_fold(text), ?) > 0"
    params: tuple[object, ...] = (folded,)
    if below is not None:
        sql, params = sql + " AND id < ?", (folded, below)
    yield from conn.execute(sql + " ORDER BY id DESC", params)


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
