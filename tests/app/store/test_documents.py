"""Documents in the store: kept with their message, searched with FTS5's bm25 (and the same ranking without the
index), deleted with their message, and an index that catches up after an SQLite without FTS5 added to it."""

from __future__ import annotations

import pytest

from app.store import Store, StoreError
from app.store.document_index import query_words
from app.store.migrations import MIGRATIONS

PASSAGES = [
    ("§1", "The lighthouse keeper climbs the stairs every evening.", 12),
    ("§2", "Storms bring ships towards the rocks near the harbour.", 12),
    ("§3", "The lamp burns paraffin; the keeper trims its wick twice.", 13),
    ("§4", "Gulls nest on the cliffs in spring.", 8),
]


def add(
    store: Store, chat_id: int, name: str = "keeper.txt", passages=PASSAGES, whole: bool = False
) -> tuple[int, int]:
    message = store.add_message(chat_id, "user", f"about {name}")
    document_id = store.documents.add(
        message.id,
        0,
        name=name,
        kind="txt",
        sha256="0" * 64,
        num_pages=None,
        num_tokens=sum(n for *_, n in passages),
        whole=whole,
        budget=500,
        passages=passages,
    )
    return message.id, document_id


def test_documents_are_kept_with_their_message_in_order(store):
    chat = store.create_chat("c")
    message_id, document_id = add(store, chat.id)
    found = store.documents.of_messages([message_id, 12345])
    assert list(found) == [message_id]
    (record,) = found[message_id]
    assert (record.id, record.name, record.whole, record.budget, record.num_tokens) == (
        document_id,
        "keeper.txt",
        False,
        500,
        45,
    )
    assert [(p.where, p.text, p.num_tokens) for p in store.documents.passages(document_id)] == PASSAGES


@pytest.mark.parametrize("index", ["on", "off"])
def test_search_ranks_by_bm25_with_or_without_the_index(store, monkeypatch, index):
    monkeypatch.setenv("TANDEM_SEARCH_INDEX", index)
    chat = store.create_chat("c")
    _, document_id = add(store, chat.id)
    _, other_id = add(store, chat.id, "other.txt", [("§1", "The keeper of another story.", 6)])
    hits = store.documents.search([document_id], "How often does the keeper trim the wick?")
    assert [h.where for h in hits][:2] == ["§3", "§1"]  # wick + keeper outrank keeper alone
    assert all(h.document_id == document_id for h in hits)  # only the documents asked about
    assert [h.where for h in store.documents.search([document_id], "gulls")] == ["§4"]
    # no word any passage holds, or no word at all: the documents' beginning
    assert [h.where for h in store.documents.search([document_id], "zzz qqq", limit=2)] == ["§1", "§2"]
    assert [h.where for h in store.documents.search([document_id, other_id], "?!", limit=3)] == ["§1", "§1", "§2"]


def test_stemming_finds_other_forms_with_the_index(store):
    chat = store.create_chat("c")
    _, document_id = add(store, chat.id)
    assert store.documents.search([document_id], "storm")[0].where == "§2"  # "Storms"


def test_deleting_the_message_deletes_its_documents_and_the_next_add_sweeps_the_index(store):
    chat = store.create_chat("c")
    message_id, document_id = add(store, chat.id)
    store.delete_messages_from(chat.id, message_id)
    assert store.documents.of_messages([message_id]) == {}
    assert store._db.rows("SELECT * FROM document_passages") == []
    assert len(store._db.rows("SELECT rowid FROM document_search")) == len(PASSAGES)  # stale until the next add
    _, again = add(store, chat.id, "again.txt", PASSAGES[:1])
    assert len(store._db.rows("SELECT rowid FROM document_search")) == 1
    assert [h.document_id for h in store.documents.search([again, document_id], "keeper")] == [again]


def test_passages_added_without_the_index_are_indexed_by_the_next_add(store, monkeypatch):
    chat = store.create_chat("c")
    monkeypatch.setenv("TANDEM_SEARCH_INDEX", "off")  # as an SQLite without FTS5 would
    _, first = add(store, chat.id)
    monkeypatch.delenv("TANDEM_SEARCH_INDEX")
    # not in the index yet: the question matches nothing there, so the document's beginning comes back
    assert [h.where for h in store.documents.search([first], "gulls", limit=2)] == ["§1", "§2"]
    assert len(store._db.rows("SELECT rowid FROM document_search")) == 0
    add(store, chat.id, "second.txt", PASSAGES[:1])
    assert [h.where for h in store.documents.search([first], "gulls")] == ["§4"]


def test_a_store_stopped_before_documents_has_none(tmp_path):
    class Older(Store):
        migrations = MIGRATIONS[:4]

    with Older(tmp_path / "old.sqlite3") as old:
        chat = old.create_chat("c")
        message = old.add_message(chat.id, "user", "hi")
        assert old.documents.of_messages([message.id]) == {}
        with pytest.raises(StoreError, match="before documents"):
            add(old, chat.id)
    with Store(tmp_path / "old.sqlite3") as upgraded:  # the upgrade makes the tables and the index
        add(upgraded, chat.id)
        names = {r[0] for r in upgraded._db.rows("SELECT name FROM sqlite_master")}
        assert {"documents", "document_passages", "document_search"} <= names


def test_without_the_index_table_the_search_ranks_by_itself(tmp_path):
    # What an SQLite without FTS5 sees: no usable index. The search ranks by itself, and deletes still work.
    with Store(tmp_path / "t.sqlite3") as store:
        chat = store.create_chat("c")
        message_id, document_id = add(store, chat.id)
        store._db._conn.execute("DROP TABLE document_search")
        assert [h.where for h in store.documents.search([document_id], "gulls")] == ["§4"]
        store.delete_messages_from(chat.id, message_id)


def test_query_words():
    assert query_words("What's the keeper's WICK, the wick?") == ["what", "s", "the", "keeper", "wick"]
