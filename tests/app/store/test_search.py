"""Search (app/store/search.py): the FTS5 trigram index kept in step by triggers, the migration that indexes
existing chats, the scan where the index cannot be used, snippets, the limit, and the worker.

Bad inputs tried: FTS5 syntax in a query (quotes, AND, *, NEAR), LIKE wildcards, 1-2 character queries,
non-ASCII case, a SQLite without FTS5 (simulated, then the index rebuilt when it is back), an index turned off.
"""

from __future__ import annotations

import random
import sqlite3

import pytest

from app.store import Store
from app.store import search_index as search_module
from app.store.migrations import MIGRATIONS
from app.store.recovery import open_store
from app.store.search import connect, fold, search
from app.store.search_index import INDEX_ENV, backfill_step, ensure_index, has_index, indexed_from

WORDS = "alpha beta gamma delta über Straße café naïve zebra quokka kernel cache river train".split()


class StoreV1(Store):
    """The schema before the search index (version 1), written through the store's own API."""

    migrations = MIGRATIONS[:1]


def ids(hits) -> list[int]:
    return [hit.chat.id for hit in hits]


def scan(store: Store, query: str, limit: int | None = None) -> list[int]:
    """The truth: the old scan (Python casefold over every title and message)."""
    return ids(store._db.read(lambda conn: search(conn, query, limit, use_index=False)))


def fill(store: Store, chats: int = 30, seed: int = 0) -> dict[int, list[str]]:
    """Random chats (titles and messages from WORDS); returns each chat's texts."""
    rng = random.Random(seed)
    texts = {}
    for c in range(chats):
        chat = store.create_chat(" ".join(rng.choices(WORDS, k=2)) + f" {c}")
        sha = store.add_attachment(f"img{c}".encode(), "png")
        texts[chat.id] = [chat.title]
        for m in range(rng.randint(1, 6)):
            text = " ".join(rng.choices(WORDS, k=rng.randint(1, 12)))
            store.add_message(chat.id, "user" if m % 2 == 0 else "assistant", text, images=[sha] if m == 0 else [])
            texts[chat.id].append(text)
    store.create_chat("Side by side", kind="compare")
    return texts


QUERIES = ("alpha", "ÜBER", "straße", "CAFÉ", "zebra quokka", "a", "ga", "mma del", "nothing here", "Side by")


def test_migration_indexes_every_existing_chat(tmp_path):
    path = tmp_path / "tandem.sqlite3"
    with StoreV1(path) as v1:
        texts = fill(v1)
        before = {c.id: (c, v1.messages(c.id)) for c in v1.list_chats()}
        truth = {q: scan(v1, q) for q in QUERIES}
        assert v1.schema_version == 1 and not has_index(v1._db._conn)
    with Store(path) as store:
        assert store.schema_version == len(MIGRATIONS) and store._db.indexed
        assert {c.id: (c, store.messages(c.id)) for c in store.list_chats()} == before  # every chat intact
        for query in QUERIES:
            assert ids(store.search_chats(query)) == truth[query], query
        for chat_id, (title, *messages) in texts.items():  # each chat found by its title and each message
            for text in (title, *messages):
                assert chat_id in ids(store.search_chats(text)), text
        assert store.wait_for_search_index(timeout=60)  # the backfill indexed the older messages
        assert store._db.read(indexed_from) == 0
        store._db.read(
            lambda conn: conn.execute("INSERT INTO message_search (message_search) VALUES ('integrity-check')")
        )
        for query in QUERIES:
            assert ids(store.search_chats(query)) == truth[query], query


def test_writes_while_the_backfill_is_half_way_keep_the_index_exact(tmp_path):
    path = tmp_path / "tandem.sqlite3"
    with StoreV1(path) as v1:
        texts = fill(v1, chats=20, seed=6)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.create_function("tandem_fold", 1, fold)
    conn.execute("PRAGMA foreign_keys = ON")
    try:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            assert ensure_index(conn)
        total = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        assert backfill_step(conn, batch=total // 2) == total - total // 2  # the newer half indexed
        half = indexed_from(conn)
        # one message the backfill has not reached (newest first: just below `half`), one it has
        old = conn.execute("SELECT id, chat_id FROM messages WHERE id < ? ORDER BY id DESC LIMIT 1", (half,)).fetchone()
        new = conn.execute("SELECT id, chat_id FROM messages WHERE id > ? LIMIT 1", (half,)).fetchone()
        assert next(iter(texts)) not in (old["chat_id"], new["chat_id"])
        conn.execute("UPDATE messages SET text = 'edited wombat' WHERE id IN (?, ?)", (old["id"], new["id"]))
        conn.execute("DELETE FROM chats WHERE id = ?", (next(iter(texts)),))  # the oldest chat: not indexed yet
        conn.execute(
            "INSERT INTO messages (chat_id, role, text, created_at) VALUES (?, 'user', 'new wombat', 0)",
            (new["chat_id"],),
        )
        truth = {q: ids(search(conn, q, use_index=False)) for q in (*QUERIES, "wombat")}
        assert {q: ids(search(conn, q)) for q in truth} == truth  # the index for the newer half, the scan below
        while backfill_step(conn, batch=7):
            pass
        assert indexed_from(conn) == 0
        conn.execute("INSERT INTO message_search (message_search) VALUES ('integrity-check')")
        # every message indexed once and nothing else (FTS5 keeps one docsize row per indexed rowid)
        indexed = conn.execute("SELECT id FROM message_search_docsize ORDER BY id").fetchall()
        assert [r[0] for r in indexed] == [r[0] for r in conn.execute("SELECT id FROM messages ORDER BY id")]
        assert {q: ids(search(conn, q)) for q in truth} == truth
        assert sorted(ids(search(conn, "wombat"))) == sorted({old["chat_id"], new["chat_id"]})
    finally:
        conn.close()


def test_triggers_keep_the_index_in_step_with_every_write(store):
    assert store._db.indexed
    fill(store, chats=10, seed=1)
    chat = store.create_chat("Streaming")
    answer = store.add_message(chat.id, "assistant", "", complete=False)
    for text in ("hel", "hello wor", "hello world, the zebrafish"):  # a streaming answer's updates
        store.update_message(answer.id, text=text)
    assert ids(store.search_chats("zebrafish")) == [chat.id]
    assert store.search_chats("hello wor ")[0].chat.id == chat.id
    store.update_message(answer.id, text="rewritten")
    assert store.search_chats("zebrafish") == []
    store.rename_chat(chat.id, "Renamed quokka")
    assert chat.id in ids(store.search_chats("renamed"))
    assert store.search_chats("Streaming") == []
    later = store.add_message(chat.id, "user", "cut from here: platypus")
    store.delete_messages_from(chat.id, later.id)
    assert store.search_chats("platypus") == []
    store.delete_chat(chat.id)  # its messages go by the cascade, and their trigrams with them
    assert store.search_chats("rewritten") == [] and store.search_chats("Renamed") == []
    raw = store._db._conn
    raw.execute("INSERT INTO message_search (message_search) VALUES ('integrity-check')")
    raw.execute("INSERT INTO title_search (title_search) VALUES ('integrity-check')")
    for query in QUERIES:
        assert ids(store.search_chats(query)) == scan(store, query), query


def test_queries_are_substrings_not_syntax(store):
    chat = store.create_chat("Syntax")
    store.add_message(chat.id, "user", 'say "hi" AND NEAR(x y) * 100% done_ok')
    for query in ('"hi"', "AND NEAR(", "* 100%", "%", "_ok", '"'):
        assert ids(store.search_chats(query)) == scan(store, query) == [chat.id], query
    for query in ("100%%", "AND OR", "NEAR(z"):
        assert store.search_chats(query) == [] == scan(store, query), query


def test_newest_first_with_snippets_and_the_limit(store):
    made = []
    for n in range(6):
        chat = store.create_chat(f"chat {n}")
        store.add_message(chat.id, "user", "filler " * 30 + f"the kernel cache number {n} " + "tail " * 30)
        made.append(chat.id)
    store.add_message(made[0], "user", "no match, but chat 0 is now the newest")
    hits = store.search_chats("kernel cache")
    assert ids(hits) == [made[0], *reversed(made[1:])]  # most recently updated first
    for hit in hits:
        assert "kernel cache number" in hit.snippet and len(hit.snippet) < 120, hit.snippet
        assert hit.snippet.startswith("…") and hit.snippet.endswith("…")
    # the limit keeps the chats with the newest matching messages, still in update order
    assert ids(store.search_chats("kernel cache", limit=2)) == [made[5], made[4]]
    assert store.search_chats("chat 3")[0].snippet is None  # title only: no message snippet
    short = store.search_chats("r 2")  # under three characters would scan; this is three
    assert made[2] in ids(short)
    two = store.search_chats("2 ")
    assert ids(two) == scan(store, "2 ") and two[0].snippet is not None


def test_without_the_index_search_scans_and_gives_the_same_answers(tmp_path, monkeypatch):
    path = tmp_path / "tandem.sqlite3"
    monkeypatch.setenv(INDEX_ENV, "off")
    with Store(path) as store:
        assert store.schema_version == len(MIGRATIONS) and not store._db.indexed and not has_index(store._db._conn)
        fill(store, seed=2)
        truth = {q: scan(store, q) for q in QUERIES}
        assert {q: ids(store.search_chats(q)) for q in QUERIES} == truth
        assert store.search_chats("über")[0].snippet  # the scan's snippets
    monkeypatch.delenv(INDEX_ENV)
    with Store(path) as store:  # FTS5 allowed again: the index is built on opening
        assert store._db.indexed and has_index(store._db._conn)
        assert {q: ids(store.search_chats(q)) for q in QUERIES} == truth


def test_a_sqlite_without_fts5_drops_the_triggers_and_the_index_is_rebuilt_later(tmp_path, monkeypatch):
    path = tmp_path / "tandem.sqlite3"
    with Store(path) as store:
        fill(store, chats=5, seed=3)
    monkeypatch.setattr(search_module, "index_supported", lambda conn: False)
    monkeypatch.setattr("app.store.db.index_supported", lambda conn: False)
    with Store(path) as store:
        # without FTS5 a trigger on messages would make every write fail ("no such module: fts5")
        assert not store._db.indexed and not has_index(store._db._conn)
        chat = store.create_chat("Written meanwhile")
        store.add_message(chat.id, "user", "the index missed this wombat")
        assert ids(store.search_chats("wombat")) == [chat.id]  # by the scan
    monkeypatch.undo()
    with Store(path) as store:
        assert store._db.indexed
        assert ids(store.search_chats("wombat")) == [chat.id]  # rebuilt: the stale index caught up
        for query in QUERIES:
            assert ids(store.search_chats(query)) == scan(store, query), query


def test_the_worker_searches_its_own_connection_and_closes(store):
    fill(store, chats=8, seed=4)
    searcher = store.chat_search()
    try:
        for query in QUERIES:
            assert ids(searcher.submit(query).result(timeout=30)) == scan(store, query), query
        chat = store.create_chat("Fresh")
        store.add_message(chat.id, "user", "seen by the worker's connection")
        assert ids(searcher.submit("worker's conn").result(timeout=30)) == [chat.id]
    finally:
        searcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        searcher.submit("alpha")


def test_the_search_connection_is_read_only(store):
    conn = connect(store.path)
    try:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            conn.execute("DELETE FROM chats")
    finally:
        conn.close()


def test_recovery_copies_rows_and_the_triggers_index_them(tmp_path):
    path = tmp_path / "tandem.sqlite3"
    with Store(path) as store:
        texts = fill(store, chats=40, seed=5)
        for chat_id in texts:
            store.add_message(chat_id, "user", "x" * 3000)  # big enough for a page to land in messages
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek((size // 2) // 4096 * 4096)
        f.write(random.Random(1).randbytes(4096))
    opened = open_store(path)
    try:
        assert opened.moved_to is not None
        store = opened.store
        assert not any(name.startswith(("message_search", "title_search")) for name in opened.recovered)
        raw = store._db._conn
        raw.execute("INSERT INTO message_search (message_search) VALUES ('integrity-check')")
        for query in QUERIES:
            assert ids(store.search_chats(query)) == scan(store, query), query
    finally:
        opened.store.close()
