"""Documents sent with messages: their passages, and the search that finds the passages a question needs.

    documents           one row per document a user message carries: its name, kind, size in tokens, and
                        whether it goes into prompts whole or by passages (decided when it was sent)
    document_passages   its text cut into passages (app/documents/passages.py), in reading order
    document_search     an FTS5 index of the passages (porter stemming), ranked with bm25

Deleting a message deletes its documents and their passages (foreign keys). The index is kept by this module,
not by triggers: a file opened once by an SQLite without FTS5 must still let messages be deleted, which a
trigger on an FTS5 table would make fail. So the index may hold passages that are gone (each add sweeps them;
passage ids are AUTOINCREMENT, never reused, and a search joins the passages, so a stale entry never answers),
and passages added without FTS5 are indexed by the next add that has it. Where FTS5 is missing, or
``TANDEM_SEARCH_INDEX=off``, a search ranks the passages itself with the same bm25 formula (no stemming).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from app.store.db import Database
from app.store.document_index import ensure_index, query_words, rank_bm25
from app.store.errors import StoreError
from app.store.migrations import DOCUMENTS_VERSION
from app.store.search_index import index_wanted

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DocumentRecord:
    """A stored document: `whole` says whether prompts carry it whole; else they carry up to `budget` tokens of
    its best passages for each question."""

    id: int
    message_id: int
    position: int
    name: str
    kind: str
    num_pages: int | None
    num_tokens: int
    whole: bool
    budget: int


@dataclass(frozen=True)
class PassageRecord:
    id: int
    document_id: int
    position: int
    where: str
    text: str
    num_tokens: int


def _passage(row: sqlite3.Row) -> PassageRecord:
    return PassageRecord(
        row["id"], row["document_id"], row["position"], row["location"], row["text"], row["num_tokens"]
    )


def _marks(ids: Sequence[int]) -> str:
    return ",".join("?" * len(ids))


class Documents:
    """The documents of a store's messages (app/store/store.py holds one as `store.documents`)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def add(
        self,
        message_id: int,
        position: int,
        *,
        name: str,
        kind: str,
        sha256: str,
        num_pages: int | None,
        num_tokens: int,
        whole: bool,
        budget: int,
        passages: Sequence[tuple[str, str, int]],
    ) -> int:
        """Store a document of message `message_id` and its passages ((where, text, num_tokens) in reading
        order), indexed for search; returns its id. One transaction: all of it is stored, or nothing."""
        if self._db.version < DOCUMENTS_VERSION:
            raise StoreError(f"this store stops at schema version {self._db.version}, before documents")
        with self._db.write() as conn:
            cursor = conn.execute(
                "INSERT INTO documents (message_id, position, name, kind, sha, num_pages, num_tokens, whole, budget,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (message_id, position, name, kind, sha256, num_pages, num_tokens, int(whole), budget, self._db.now()),
            )
            document_id = cursor.lastrowid
            conn.executemany(
                "INSERT INTO document_passages (document_id, position, location, text, num_tokens)"
                " VALUES (?, ?, ?, ?, ?)",
                [(document_id, i, where, text, n) for i, (where, text, n) in enumerate(passages)],
            )
            ensure_index(conn)
        return document_id

    def of_messages(self, message_ids: Sequence[int]) -> dict[int, list[DocumentRecord]]:
        """The documents of those messages, by message id, each message's in the order they were attached."""
        found: dict[int, list[DocumentRecord]] = {}
        ids = list(message_ids) if self._db.version >= DOCUMENTS_VERSION else []
        for start in range(0, len(ids), 500):  # old SQLite allows 999 parameters
            chunk = ids[start : start + 500]
            rows = self._db.rows(
                f"SELECT * FROM documents WHERE message_id IN ({_marks(chunk)}) ORDER BY message_id, position", chunk
            )
            for r in rows:
                record = DocumentRecord(
                    r["id"], r["message_id"], r["position"], r["name"], r["kind"], r["num_pages"], r["num_tokens"],
                    bool(r["whole"]), r["budget"],
                )  # fmt: skip
                found.setdefault(record.message_id, []).append(record)
        return found

    def passages(self, document_id: int) -> list[PassageRecord]:
        """A document's passages in reading order."""
        sql = "SELECT * FROM document_passages WHERE document_id = ? ORDER BY position"
        return [_passage(row) for row in self._db.rows(sql, (document_id,))]

    def search(self, document_ids: Sequence[int], question: str, limit: int = 50) -> list[PassageRecord]:
        """The passages of those documents that best answer `question`, best first (bm25 over its words); the
        documents' first passages when the question has no word any passage holds."""
        ids = list(document_ids)
        if not ids:
            return []
        words = query_words(question)
        ranked = self._db.read(lambda conn: self._ranked(conn, ids, words, limit)) if words else []
        if ranked:
            return ranked
        sql = f"SELECT * FROM document_passages WHERE document_id IN ({_marks(ids)}) ORDER BY position, id LIMIT ?"
        return [_passage(row) for row in self._db.rows(sql, (*ids, limit))]

    def _ranked(self, conn: sqlite3.Connection, ids: list[int], words: list[str], limit: int) -> list[PassageRecord]:
        if index_wanted():
            match = " OR ".join(f'"{w}"' for w in words)  # \w+ words hold no quote
            try:
                rows = conn.execute(
                    "SELECT p.* FROM document_search JOIN document_passages AS p ON p.id = document_search.rowid"
                    f" WHERE document_search MATCH ? AND p.document_id IN ({_marks(ids)})"
                    " ORDER BY bm25(document_search), p.id LIMIT ?",
                    (match, *ids, limit),
                ).fetchall()
                return [_passage(row) for row in rows]
            except sqlite3.OperationalError as e:  # no FTS5 here, or no index yet: rank them here
                logger.info("document search without the index: %s", e)
        rows = conn.execute(f"SELECT * FROM document_passages WHERE document_id IN ({_marks(ids)})", ids).fetchall()
        return [_passage(row) for row in rank_bm25(rows, words, limit)]
