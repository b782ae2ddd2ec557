"""The schema of the documents' tables and their search: the FTS5 index of passages, kept by app/store/documents.py,
and the same bm25 ranking done in Python where the index cannot be used (see that module's docstring)."""

from __future__ import annotations

import logging
import math
import re
import sqlite3
from collections import Counter
from collections.abc import Sequence

from app.store.search_index import index_wanted

logger = logging.getLogger(__name__)

TABLES = (
    """CREATE TABLE documents (
        id INTEGER PRIMARY KEY,
        message_id INTEGER NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        sha TEXT NOT NULL,
        num_pages INTEGER,
        num_tokens INTEGER NOT NULL,
        whole INTEGER NOT NULL CHECK (whole IN (0, 1)),
        budget INTEGER NOT NULL,
        created_at REAL NOT NULL,
        UNIQUE (message_id, position)
    )""",
    """CREATE TABLE document_passages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        document_id INTEGER NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        location TEXT NOT NULL,
        text TEXT NOT NULL,
        num_tokens INTEGER NOT NULL
    )""",
    "CREATE INDEX document_passages_by_document ON document_passages (document_id, position)",
)
_INDEX = "CREATE VIRTUAL TABLE IF NOT EXISTS document_search USING fts5(text, tokenize='porter unicode61')"
_WORD = re.compile(r"\w+")
MAX_QUERY_WORDS = 64
BM25_K1, BM25_B = 1.2, 0.75  # FTS5's own bm25() constants, so both paths rank alike


def create_tables(conn: sqlite3.Connection) -> None:
    """The tables, and the index where this SQLite has FTS5 (inside the caller's transaction: a migration's)."""
    for statement in TABLES:
        conn.execute(statement)
    ensure_index(conn)


def ensure_index(conn: sqlite3.Connection) -> bool:
    """Create the index if missing and bring it in step with the passages; False without FTS5 (nothing done)."""
    if not index_wanted():
        return False
    try:
        conn.execute(_INDEX)
    except sqlite3.OperationalError as e:  # "no such module: fts5"
        logger.info("documents are searched without an index: %s", e)
        return False
    conn.execute("DELETE FROM document_search WHERE rowid NOT IN (SELECT id FROM document_passages)")
    conn.execute(
        "INSERT INTO document_search (rowid, text) SELECT id, text FROM document_passages"
        " WHERE id NOT IN (SELECT rowid FROM document_search)"
    )
    return True


def query_words(question: str) -> list[str]:
    """The question's distinct words, lower-cased, in order (at most MAX_QUERY_WORDS)."""
    seen = dict.fromkeys(w.lower() for w in _WORD.findall(question) if w.strip("_"))
    return list(seen)[:MAX_QUERY_WORDS]


def rank_bm25(rows: Sequence[sqlite3.Row], words: Sequence[str], limit: int) -> list[sqlite3.Row]:
    """The rows whose text holds any of `words`, best first by Okapi bm25 (ties: reading order)."""
    counts = [Counter(w.lower() for w in _WORD.findall(row["text"])) for row in rows]
    if not counts:
        return []
    average = sum(sum(c.values()) for c in counts) / len(counts) or 1.0
    weights = {}
    for word in words:
        holding = sum(1 for c in counts if word in c)
        weights[word] = math.log((len(counts) - holding + 0.5) / (holding + 0.5) + 1.0)
    scored = []
    for row, c in zip(rows, counts, strict=True):
        length = sum(c.values())
        score = sum(
            weights[w] * c[w] * (BM25_K1 + 1) / (c[w] + BM25_K1 * (1 - BM25_B + BM25_B * length / average))
            for w in words
            if c[w]
        )
        if score > 0:
            scored.append((-score, row["id"], row))
    scored.sort(key=lambda item: item[:2])
    return [row for _, _, row in scored[:limit]]
