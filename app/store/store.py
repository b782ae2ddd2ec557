"""`Store`: Tandem's SQLite persistence, one object the GUI thread holds for the app's lifetime.

The store is a set of repositories over one connection, each a small class for one table group:

    Store
      _attachments  Attachments   files by sha256                         add_attachment, attachment_path
      _chats        Chats         chats, search                           create_chat, get_chat, list_chats, ...
      _messages     Messages      each chat's tree of message versions    add_message, messages, ...
      _drafts       Drafts        each chat's unsent message              draft, save_draft, clear_draft
      _settings     Settings      JSON values by key                      get_setting, set_setting
      presets       Presets       built-in and user sampler presets       store.presets.all(), .save(), .delete()
      models        ModelList     the models the user added               store.models.all(), .add(), .remove()
      documents     Documents     documents sent with messages, searched  store.documents.add(), .search(), ...
      export        Export        a chat as Markdown or JSON              store.export.markdown(), .json(), ...

The calls every chat tab makes (chats, messages, attachments, drafts, settings) are Store methods that pass
straight to their repository; the rest are reached through the repository attribute.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.store.attachments import Attachments
from app.store.chats import Chats
from app.store.db import Database
from app.store.documents import Documents
from app.store.drafts import Draft, Drafts
from app.store.export import Export
from app.store.messages import Messages
from app.store.migrations import MIGRATIONS, Migration
from app.store.model_list import ModelList
from app.store.presets import BUILTIN_PRESETS_PATH, Presets
from app.store.records import Chat, Message
from app.store.search import ChatSearch, SearchHit
from app.store.search_index import Backfill, indexed_from
from app.store.settings import Settings

DB_FILE_NAME = "tandem.sqlite3"


class Store:
    """Chats, messages, attachments, drafts, presets, settings and the model list in one SQLite file.

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
        self._db = Database(self.path, self.migrations)
        self._attachments = Attachments(self._db, self.attachments_dir)
        self._chats = Chats(self._db, self._attachments)
        self._messages = Messages(self._db, self._chats, self._attachments)
        self._drafts = Drafts(self._db)
        self._settings = Settings(self._db)
        self.presets = Presets(self._db, Path(builtin_presets) if builtin_presets is not None else BUILTIN_PRESETS_PATH)
        self.models = ModelList(self._db)
        self.documents = Documents(self._db)
        self.export = Export(self._chats, self._messages, self._attachments)
        self._attachments.sweep()
        # Messages written before the search index existed are indexed on a thread of their own (minutes for
        # a long history; searches scan what it has not reached), so opening stays fast.
        self._backfill: Backfill | None = None
        if self._db.indexed and self._db.read(indexed_from):
            self._backfill = Backfill(self.path, self._db.write_lock)

    # -- chats (app.store.chats.Chats)

    def create_chat(
        self,
        title: str = "New chat",
        system_prompt: str = "",
        settings: dict[str, Any] | None = None,
        kind: str = "chat",
    ) -> Chat:
        """Create and save a chat; ``kind`` is "chat" or "compare"."""
        return self._chats.create(title, system_prompt, settings, kind)

    def get_chat(self, chat_id: int) -> Chat:
        """The chat with this id; KeyError (NotFoundError) if there is none."""
        return self._chats.get(chat_id)

    def list_chats(self, search: str | None = None) -> list[Chat]:
        """All chats, most recently updated first; ``search`` filters them (see Chats.all)."""
        return self._chats.all(search)

    def search_chats(self, query: str, limit: int | None = None) -> list[SearchHit]:
        """Chats matching ``query`` with a snippet each, on this thread (see Chats.search)."""
        return self._chats.search(query, limit)

    def chat_search(self) -> ChatSearch:
        """A searcher on a worker thread with its own connection; close() it when done."""
        return self._chats.searcher()

    def rename_chat(self, chat_id: int, title: str) -> None:
        """Set a chat's title (surrounding whitespace dropped; empty is a ValueError)."""
        self._chats.rename(chat_id, title)

    def update_chat(
        self,
        chat_id: int,
        *,
        system_prompt: str | None = None,
        settings: dict[str, Any] | None = None,
        model: str | None = None,
    ) -> None:
        """Change a chat's system prompt, sampler settings or model name; None leaves a field as it is."""
        self._chats.update(chat_id, system_prompt=system_prompt, settings=settings, model=model)

    def delete_chat(self, chat_id: int) -> None:
        """Delete a chat with its messages; attachment files nothing else uses go too."""
        self._chats.delete(chat_id)

    # -- messages (app.store.messages.Messages)

    def add_message(
        self,
        chat_id: int,
        role: str,
        text: str,
        *,
        images: Sequence[str] = (),
        stats: dict[str, Any] | None = None,
        settings: dict[str, Any] | None = None,
        column: int | None = None,
        complete: bool = True,
        version_of: int | None = None,
    ) -> Message:
        """Save a message at the end of the visible thread, or as a new version of ``version_of`` (see
        Messages.add)."""
        return self._messages.add(
            chat_id,
            role,
            text,
            images=images,
            stats=stats,
            settings=settings,
            column=column,
            complete=complete,
            version_of=version_of,
        )

    def update_message(
        self,
        message_id: int,
        *,
        text: str | None = None,
        stats: dict[str, Any] | None = None,
        complete: bool | None = None,
    ) -> None:
        """Change a message's text, stats or completeness, committed before returning (see Messages.update)."""
        self._messages.update(message_id, text=text, stats=stats, complete=complete)

    def messages(self, chat_id: int, *, before: int | None = None) -> list[Message]:
        """A chat's visible thread, first message first; ``before``: the thread that leads to that message."""
        return self._messages.thread(chat_id, before=before)

    def all_messages(self, chat_id: int) -> list[Message]:
        """Every message of a chat, every version on every branch, in the order they were written."""
        return self._messages.all(chat_id)

    def message_versions(self, chat_id: int) -> dict[int, list[int]]:
        """For each message of the visible thread, its versions' ids (itself among them), oldest first."""
        return self._messages.versions(chat_id)

    def select_version(self, message_id: int) -> None:
        """Show this version of its message: the visible thread now runs through it."""
        self._messages.select_version(message_id)

    def delete_messages_from(self, chat_id: int, message_id: int) -> None:
        """Delete ``message_id`` and every message after it, on every branch."""
        self._messages.delete_from(chat_id, message_id)

    # -- attachments (app.store.attachments.Attachments)

    def add_attachment(self, data: bytes, suffix: str, sha256: str | None = None) -> str:
        """Store ``data`` once by content and return its sha256 hex digest (see Attachments.add)."""
        return self._attachments.add(data, suffix, sha256)

    def attachment_path(self, sha: str) -> Path:
        """The file holding attachment ``sha``; KeyError (NotFoundError) for an unknown sha."""
        return self._attachments.path(sha)

    # -- drafts (app.store.drafts.Drafts)

    def draft(self, chat_id: int) -> Draft | None:
        """Chat ``chat_id``'s unsent message, or None when it has none."""
        return self._drafts.get(chat_id)

    def save_draft(self, chat_id: int, text: str, images: Sequence[tuple[str, str]] = ()) -> None:
        """Keep the chat's unsent text and (sha, file name) images; an empty draft is cleared."""
        self._drafts.save(chat_id, text, images)

    def clear_draft(self, chat_id: int) -> None:
        """Forget the chat's unsent message (it was sent)."""
        self._drafts.clear(chat_id)

    # -- settings (app.store.settings.Settings)

    def get_setting(self, key: str, default: Any = None) -> Any:
        """The JSON value saved under ``key``, or ``default`` when none is."""
        return self._settings.get(key, default)

    def set_setting(self, key: str, value: Any) -> None:
        """Save a JSON value (window geometry, last preset, ...); tuples come back as lists."""
        self._settings.set(key, value)

    # -- the file

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
