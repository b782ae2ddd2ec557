"""`Store`: Tandem's SQLite persistence, one object the GUI thread holds for the app's lifetime."""

from __future__ import annotations

from pathlib import Path

from app.store.db import Database
from app.store.export import ExportMixin
from app.store.migrations import MIGRATIONS, Migration
from app.store.presets import BUILTIN_PRESETS_PATH, PresetsMixin
from app.store.records import Preset
from app.store.search_index import Backfill, indexed_from
from app.store.settings import SettingsMixin

DB_FILE_NAME = "tandem.sqlite3"


class Store(ExportMixin, PresetsMixin, SettingsMixin):
    """Chats, messages, attachments, presets, settings and the model list in one SQLite file.

    ``path`` defaults to ``engine.paths.user_data_dir() / "tandem.sqlite3"``; attachments live in an
    ``attachments`` folder beside it. Every write commits before the call returns (see
    :mod:`app.store.db` for what that survives). Unknown ids raise ``KeyError``; a file Tandem
    cannot use raises :class:`StoreError`; bad arguments raise ``ValueError`` before anything is
    written. Use from one thread; ``close()`` (or ``with Store() as store:``) when done.

    ``migrations`` is the ordered schema history; a subclass may extend it (tests do).
    """

    migrations: tuple[Migration, ...] = MIGRATIONS

    def __init__(self, path: Path | str | None = None, *, builtin_presets: Path | None = None) -> None:
        if path is None:
            from engine.paths import user_data_dir  # lazy: reads TANDEM_DATA_DIR at call time

            path = user_data_dir() / DB_FILE_NAME
        self.path = Path(path)
        self.data_dir = self.path.parent
        self.attachments_dir = self.data_dir / "attachments"
        self._builtin_presets_path = Path(builtin_presets) if builtin_presets is not None else BUILTIN_PRESETS_PATH
        self._builtin_presets: list[Preset] | None = None
        self._db = Database(self.path, self.migrations)
        self._sweep_attachments()
        # Messages written before the search index existed are indexed on a thread of their own (minutes for
        # a long history; searches scan what it has not reached), so opening stays as fast as before.
        self._backfill: Backfill | None = None
        if self._db.indexed and self._db.read(indexed_from):
            self._backfill = Backfill(self.path, self._db.write_lock)

    def wait_for_search_index(self, timeout: float | None = None) -> bool:
        """Wait until every message is in the search index; True if so within ``timeout`` (tools, tests)."""
        if self._backfill is not None and not self._backfill.wait(timeout):
            return False
        return not self._db.indexed or not self._db.read(indexed_from)

    @property
    def schema_version(self) -> int:
        """The file's schema version after opening (``len(self.migrations)``)."""
        return self._db.version

    def close(self) -> None:
        """Close the database (after the search index backfill's current batch); later calls raise StoreError."""
        if self._backfill is not None:
            self._backfill.stop()
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"
