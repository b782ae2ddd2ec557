"""The models the user added: local folders and GGUF files, and hub ids, in the order they were added."""

from __future__ import annotations

from pathlib import Path

from app.store.db import Database
from app.store.errors import NotFoundError
from app.store.records import ModelEntry


class ModelList:
    """The models table; a model's files are never touched here."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def all(self) -> list[ModelEntry]:
        """Models the user added, oldest first."""
        rows = self._db.rows("SELECT path, name, kind, added_at FROM models ORDER BY added_at, path")
        return [ModelEntry(path=row[0], name=row[1], kind=row[2], added_at=row[3]) for row in rows]

    def add(self, path: str, name: str | None = None, kind: str = "local") -> ModelEntry:
        """Remember a model (a folder or GGUF path, or a hub id for ``kind="hub"``). ``name`` defaults to
        the path's last part. Adding a known path again updates its kind (and its name when given), keeping
        its place in the list."""
        if not isinstance(path, str) or not path.strip():
            raise ValueError(f"a model path must be a non-empty string, got {path!r}")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f"a model name must be None or a non-empty string, got {name!r}")
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"a model kind must be a non-empty string such as 'local', got {kind!r}")
        given = name.strip() if name is not None else None
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO models (path, name, kind, added_at) VALUES (:path, :name, :kind, :now)"
                " ON CONFLICT (path) DO UPDATE SET name = COALESCE(:given, name), kind = excluded.kind",
                {
                    "path": path,
                    "name": given or Path(path).name or path,
                    "kind": kind,
                    "given": given,
                    "now": self._db.now(),
                },
            )
            row = conn.execute("SELECT path, name, kind, added_at FROM models WHERE path = ?", (path,)).fetchone()
        return ModelEntry(path=row[0], name=row[1], kind=row[2], added_at=row[3])

    def remove(self, path: str) -> None:
        """Forget a model (its files stay); KeyError (NotFoundError) for a path never added."""
        with self._db.write() as conn:
            if conn.execute("DELETE FROM models WHERE path = ?", (path,)).rowcount == 0:
                raise NotFoundError(f"no model {path!r} in the model list")
