"""App settings and window state: JSON values by key."""

from __future__ import annotations

import json
from typing import Any

from app.store.db import Database, to_json


class Settings:
    """The settings table: one JSON value per key."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def get(self, key: str, default: Any = None) -> Any:
        """The JSON value saved under ``key``, or ``default`` when none is."""
        row = self._db.row("SELECT value FROM settings WHERE key = ?", (key,))
        return default if row is None else json.loads(row[0])

    def set(self, key: str, value: Any) -> None:
        """Save a JSON value (window geometry, last preset, ...); tuples come back as lists."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"a setting key must be a non-empty string, got {key!r}")
        value_json = to_json(value, f"setting {key!r}")
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO settings (key, value) VALUES (?, ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value_json),
            )
