"""How a search asks the index (app/store/search.py): a long query asks for a few rare trigrams near each other
and checks the text, so its answers must be the scan's exactly; snippets come from the messages' text.

Bad inputs tried: texts holding every trigram of the query, near each other, in another order; a trigram the
index has never seen; queries with FTS5 syntax and quotes; a message the backfill has not reached yet.
"""

from __future__ import annotations

import random
import sqlite3

from app.store.search import fold, rarest_apart, search
from app.store.search_index import backfill_step, ensure_index, indexed_from

WORDS = "kernel cache river train not there at all über Straße café naïve the".split()


def ids(hits) -> list[int]:
    return [hit.chat.id for hit in hits]


def scan(store, query: str, limit: int | None = None) -> list[int]:
    return ids(store._db.read(lambda conn: search(conn, query, limit, use_index=False)))


def test_rarest_trigrams_three_apart_in_query_order():
    grams = ["not", "ot ", "t t", " th", "the", "her", "ere"]
    counts = {"not": 50, "ot ": 40, "t t": 900, " th": 900, "the": 10, "her": 900, "ere": 30}
    # "the" the rarest, then "ere" is too close (overlapping trigrams share their messages): "ot ", then none fits.
    assert rarest_apart(grams, counts.__getitem__) == [1, 4]
    counts["her"] = 20
    assert rarest_apart(grams, counts.__getitem__) == [1, 4]
    grams.append("re ")  # offset 7: three from "the", six from "ot "
    assert rarest_apart(grams, {**counts, "re ": 800}.__getitem__) == [1, 4, 7]
    # The rarest in the middle of a short query leaves no room for a second: the next rarest pair is taken.
    assert rarest_apart(["gar", "arl", "rli", "lic"], {"gar": 9, "arl": 1, "rli": 2, "lic": 5}.__getitem__) == [0, 3]
    # A trigram no message holds: nothing can match, and the rest need not be probed.
    asked = []
    assert rarest_apart(["abc", "bcd", "cde", "def"], lambda g: asked.append(g) or (0 if g == "bcd" else 5)) is None
    assert asked == ["abc", "bcd"]


def test_long_queries_answer_as_the_scan_does(store):
    rng = random.Random(5)
    texts = []
    for c in range(40):
        chat = store.create_chat(f"chat {c}")
        for _ in range(rng.randint(1, 4)):
            text = " ".join(rng.choices(WORDS, k=rng.randint(3, 14)))
            store.add_message(chat.id, "user", text)
            texts.append(text)
    # Every trigram of "not there at all", near each other, but never the phrase: the text check must drop it.
    decoy = store.create_chat("decoy")
    store.add_message(decoy.id, "user", "at all there not; the not there, at al l")
    queries = ["not there at all", "there at all", "kernel cache river", "KERNEL CACHE", "Straße café", "al l t"]
    for text in rng.sample(texts, 25):  # substrings of real messages, and the same with one letter changed
        start = rng.randrange(len(text))
        piece = text[start : start + rng.randint(6, 24)]
        queries += [piece, piece[:-1] + "q"]
    for query in queries:
        if len(query.strip()) >= 6:
            assert ids(store.search_chats(query)) == scan(store, query), query
            assert ids(store.search_chats(query, limit=3)) == scan(store, query, limit=3), query
    assert decoy.id not in ids(store.search_chats("not there at all"))
    assert store.search_chats("xyzzy plugh") == []  # trigrams the index never saw


def test_newest_first_with_a_limit_and_snippets_from_the_text(store):
    made = []
    for n in range(5):
        chat = store.create_chat(f"story {n}")
        store.add_message(chat.id, "user", "filler " * 20 + f"not there at all, said {n}. " + "tail " * 20)
        store.add_message(chat.id, "assistant", "not here")
        made.append(chat.id)
    hits = store.search_chats("NOT THERE AT ALL", limit=3)
    assert ids(hits) == made[::-1][:3]  # the newest three, newest first
    for hit, n in zip(hits, (4, 3, 2)):
        assert f"not there at all, said {n}." in hit.snippet and hit.snippet.startswith("…"), hit.snippet
        assert hit.snippet.endswith("…") and len(hit.snippet) < 120


def test_messages_the_backfill_has_not_reached_are_found_with_a_trigram_the_index_lacks(tmp_path):
    from app.store import Store
    from app.store.migrations import MIGRATIONS

    class StoreV1(Store):
        migrations = MIGRATIONS[:1]

    path = tmp_path / "tandem.sqlite3"
    with StoreV1(path) as v1:
        old = v1.create_chat("old")
        v1.add_message(old.id, "user", "an old note about a wombat burrow")
        new = v1.create_chat("new")
        v1.add_message(new.id, "user", "a newer note about the river")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.create_function("tandem_fold", 1, fold)
    try:
        conn.execute("BEGIN IMMEDIATE")
        assert ensure_index(conn)
        conn.execute("COMMIT")
        assert backfill_step(conn, batch=1) == 1 and indexed_from(conn) > 0  # only the newer message indexed
        # "wom" is in no indexed message: the index says nothing matches, the scan below finds the old one.
        assert ids(search(conn, "wombat burrow")) == [old.id]
        assert ids(search(conn, "about the river")) == [new.id]
    finally:
        conn.close()
