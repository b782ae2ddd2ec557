"""Sampler presets: built-ins from ``assets/presets.json`` (read-only) and the user's own, in the database."""

from __future__ import annotations

import copy
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from app.resources import asset_path
from app.store.db import Database, dict_json
from app.store.errors import NotFoundError, StoreError
from app.store.records import Preset

BUILTIN_PRESETS_PATH = asset_path("presets.json")  # from a checkout or the frozen bundle (app.resources)

# Keys a settings dict may hold besides SamplerSettings fields (the job's, not the sampler's).
JOB_KEYS = ("seed", "max_new_tokens")


def load_builtin_presets(path: Path) -> list[Preset]:
    """Read the built-in presets file: ``{"format": 1, "presets": [{"name": ..., "settings": {...}}]}``."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreError(f"could not read the built-in presets {path}: {exc}. Reinstall Tandem.") from exc
    if not isinstance(document, dict) or document.get("format") != 1 or not isinstance(document.get("presets"), list):
        raise StoreError(f"{path} is not a Tandem presets file (expected format 1 with a 'presets' list)")
    presets = []
    for index, entry in enumerate(document["presets"]):
        name = entry.get("name") if isinstance(entry, dict) else None
        settings = entry.get("settings") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or not isinstance(settings, dict):
            raise StoreError(f"{path}: preset #{index} needs a 'name' string and a 'settings' object, got {entry!r}")
        presets.append(Preset(name=name, settings=settings, builtin=True))
    return presets


def check_preset_settings(settings: dict[str, Any], name: str) -> None:
    """Raise ValueError unless ``settings`` builds an ``engine.SamplerSettings`` (plus seed/max_new_tokens)."""
    from engine.generator.sampler import SamplerSettings  # lazy: keeps `import app.store` free of torch

    known = {f.name for f in fields(SamplerSettings)}
    unknown = sorted(set(settings) - known - set(JOB_KEYS))
    if unknown:
        raise ValueError(f"preset {name!r}: unknown setting(s) {unknown}; use SamplerSettings field names")
    try:
        SamplerSettings(**{key: value for key, value in settings.items() if key in known})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"preset {name!r}: {exc}") from None
    seed = settings.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise ValueError(f"preset {name!r}: seed must be None or an int in [0, 2**63), got {seed!r}")
    max_new = settings.get("max_new_tokens")
    if max_new is not None and (isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1):
        raise ValueError(f"preset {name!r}: max_new_tokens must be a positive int, got {max_new!r}")


class Presets:
    """The built-in presets (read on first use) and the user's, which a built-in's name cannot be given to."""

    def __init__(self, db: Database, builtin_path: Path = BUILTIN_PRESETS_PATH) -> None:
        self._db = db
        self._builtin_path = builtin_path
        self._builtins: list[Preset] | None = None

    def all(self) -> list[Preset]:
        """Built-in presets in file order, then the user's, by name (case-insensitive)."""
        if self._builtins is None:
            self._builtins = load_builtin_presets(self._builtin_path)
        builtins = [copy.deepcopy(preset) for preset in self._builtins]
        rows = self._db.rows("SELECT name, settings FROM presets")
        users = [Preset(name=row[0], settings=json.loads(row[1]), builtin=False) for row in rows]
        return builtins + sorted(users, key=lambda preset: preset.name.casefold())

    def save(self, name: str, settings: dict[str, Any]) -> None:
        """Save (or overwrite) a user preset. The name must differ from every built-in's, ignoring case;
        settings must build an ``engine.SamplerSettings`` (plus optional "seed", "max_new_tokens")."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a preset name must be a non-empty string, got {name!r}")
        name = name.strip()
        if self._builtin_named(name) is not None:
            raise ValueError(f"{name!r} is a built-in preset; save yours under another name")
        settings_json = dict_json(settings, f"preset {name!r} settings")
        check_preset_settings(settings, name)
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO presets (name, settings, created_at) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET settings = excluded.settings",
                (name, settings_json, self._db.now()),
            )

    def delete(self, name: str) -> None:
        """Delete a user preset; ValueError for a built-in, KeyError (NotFoundError) for an unknown name."""
        if self._builtin_named(name) is not None:
            raise ValueError(f"{name!r} is a built-in preset and cannot be deleted")
        with self._db.write() as conn:
            if conn.execute("DELETE FROM presets WHERE name = ?", (name,)).rowcount == 0:
                raise NotFoundError(f"no user preset named {name!r}")

    def _builtin_named(self, name: str) -> Preset | None:
        folded = name.strip().casefold() if isinstance(name, str) else None
        return next((p for p in self.all() if p.builtin and p.name.casefold() == folded), None)
