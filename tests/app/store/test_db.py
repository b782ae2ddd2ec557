"""Opening a file: WAL and foreign keys on, the migration path, and files Tandem must refuse untouched."""

from __future__ import annotations

import sqlite3

import pytest

from app.store import Store, StoreError
from app.store.migrations import MIGRATIONS


def add_pinned_column(conn: sqlite3.Connection) -> None:
    """A stand-in for a future migration (after the current ones)."""
    conn.execute("ALTER TABLE chats ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0")
    conn.execute("UPDATE chats SET pinned = 1 WHERE title = 'Pin me'")


class StoreV2(Store):
    migrations = (*MIGRATIONS, add_pinned_column)


LATEST = len(MIGRATIONS)
ALL = list(range(1, LATEST + 1))


def versions(path) -> list[int]:
    raw = sqlite3.connect(path)
    try:
        return [row[0] for row in raw.execute("SELECT version FROM schema_version ORDER BY version")]
    finally:
        raw.close()


def test_new_file_is_wal_with_foreign_keys_and_the_latest_version(store):
    # 2: the search index, 3: message versions, 4: drafts, 5: documents, 6: chats' tool switches
    assert store.schema_version == LATEST == 6
    assert versions(store.path) == ALL
    raw = sqlite3.connect(store.path)
    assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    raw.close()
    assert store._db.rows("PRAGMA foreign_keys")[0][0] == 1
    assert store._db.rows("PRAGMA synchronous")[0][0] == 1  # NORMAL


def test_reopening_does_not_migrate_again(tmp_path):
    path = tmp_path / "t.sqlite3"
    Store(path).close()
    Store(path).close()
    assert versions(path) == ALL


def test_migration_path_upgrades_an_existing_file_and_keeps_data(tmp_path):
    path = tmp_path / "t.sqlite3"
    with Store(path) as v1:
        pinned = v1.create_chat("Pin me", system_prompt="sys")
        other = v1.create_chat("Other")
        sha = v1.add_attachment(b"img", "png")
        message = v1.add_message(pinned.id, "user", "hello", images=[sha], stats={"n": 1})
        v1.set_setting("window", [1, 2, 3, 4])
        v1.presets.save("mine", {"temperature": 0.4})
    assert versions(path) == ALL

    with StoreV2(path) as v2:
        assert v2.schema_version == LATEST + 1
        assert [c.id for c in v2.list_chats()] == [pinned.id, other.id]
        assert v2.messages(pinned.id) == [message]
        assert v2.get_setting("window") == [1, 2, 3, 4]
        assert [p.name for p in v2.presets.all() if not p.builtin] == ["mine"]
        v2.add_message(other.id, "user", "written after the upgrade")
    assert versions(path) == [*ALL, LATEST + 1]
    raw = sqlite3.connect(path)
    assert dict(raw.execute("SELECT title, pinned FROM chats").fetchall()) == {"Pin me": 1, "Other": 0}
    raw.close()

    with StoreV2(path) as reopened:  # already upgraded: nothing runs twice
        assert reopened.messages(other.id)[0].text == "written after the upgrade"
    assert versions(path) == [*ALL, LATEST + 1]


def test_failed_migration_leaves_the_file_at_its_version(tmp_path):
    def half_done(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE tags (name TEXT)")
        conn.execute("DELETE FROM messages")
        raise RuntimeError("bug in the new migration")

    class BrokenV2(Store):
        migrations = (*MIGRATIONS, half_done)

    path = tmp_path / "t.sqlite3"
    with Store(path) as v1:
        chat = v1.create_chat("Survives")
        v1.add_message(chat.id, "user", "still here")
    with pytest.raises(
        StoreError, match=f"schema version {LATEST + 1}.*bug in the new migration.*left at version {LATEST}"
    ):
        BrokenV2(path)
    assert versions(path) == ALL
    with Store(path) as again:
        assert [m.text for m in again.messages(chat.id)] == ["still here"]
        assert not again._db.rows("SELECT name FROM sqlite_master WHERE name = 'tags'")


def test_newer_schema_version_is_refused(tmp_path):
    path = tmp_path / "t.sqlite3"
    with StoreV2(path) as v2:
        v2.create_chat("from the future")
    before = path.read_bytes()
    latest = len(MIGRATIONS)
    with pytest.raises(
        StoreError, match=rf"newer Tandem \(schema version {latest + 1}; this Tandem knows up to {latest}\)"
    ):
        Store(path)
    assert versions(path) == list(range(1, latest + 2))
    assert path.read_bytes() == before


def test_garbage_file_is_refused_untouched(tmp_path):
    path = tmp_path / "tandem.sqlite3"
    garbage = b"this is a text file, not a database\n" * 200
    path.write_bytes(garbage)
    with pytest.raises(StoreError, match="is not a Tandem database") as info:
        Store(path)
    assert str(path) in str(info.value) and "Move it aside" in str(info.value)
    assert path.read_bytes() == garbage
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tandem.sqlite3"]  # no -wal/-shm left beside it


def test_truncated_sqlite_header_is_refused(tmp_path):
    path = tmp_path / "tandem.sqlite3"
    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    with pytest.raises(StoreError, match="not a Tandem database"):
        Store(path)


def test_someone_elses_sqlite_file_is_refused_untouched(tmp_path):
    path = tmp_path / "other.sqlite3"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE contacts (name TEXT)")
    raw.execute("INSERT INTO contacts VALUES ('Ada')")
    raw.commit()
    raw.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="not Tandem's.*contacts"):
        Store(path)
    assert path.read_bytes() == before  # not even switched to WAL


def test_folder_instead_of_file_is_refused(tmp_path):
    with pytest.raises(StoreError, match="is a folder"):
        Store(tmp_path)


def test_missing_parent_folder_is_created(tmp_path):
    with Store(tmp_path / "a" / "b" / "t.sqlite3") as store:
        assert store.create_chat("x").id == 1
