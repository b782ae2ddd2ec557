"""Tandem's persistence: chats, messages, attachments, presets, settings in SQLite. No Qt here."""

from app.store.errors import NotFoundError, StoreError
from app.store.records import Chat, Message, ModelEntry, Preset
from app.store.store import Store

__all__ = ["Chat", "Message", "ModelEntry", "NotFoundError", "Preset", "Store", "StoreError"]
