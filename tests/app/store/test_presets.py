"""Presets: the built-ins build real SamplerSettings with sensible values; user presets save, list, delete."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from app.store import Preset, Store, StoreError
from app.store.presets import BUILTIN_PRESETS_PATH
from engine import SamplerSettings

BUILTIN_NAMES = ["Greedy", "Balanced", "Creative", "Precise"]
# Per-tokenizer or unused-by-the-sampler fields a preset does not carry.
NOT_IN_PRESETS = {"token_bias", "disallowed_tokens", "cfg_scale"}


def builtins(store) -> dict[str, dict]:
    return {p.name: p.settings for p in store.presets.all() if p.builtin}


def test_builtins_come_first_in_file_order(store):
    presets = store.presets.all()
    assert [p.name for p in presets] == BUILTIN_NAMES
    assert all(isinstance(p, Preset) and p.builtin for p in presets)


def test_every_builtin_builds_sampler_settings_and_sets_every_field(store):
    every_field = {f.name for f in fields(SamplerSettings)} - NOT_IN_PRESETS
    for name, settings in builtins(store).items():
        assert set(settings) == every_field, f"{name} should set every sampler field so applying it is total"
        SamplerSettings(**settings)  # raises on a misspelled name or an out-of-range value


def test_builtin_values_are_what_users_expect(store):
    presets = {name: SamplerSettings(**s) for name, s in builtins(store).items()}
    greedy, balanced, creative, precise = (presets[n] for n in BUILTIN_NAMES)
    assert greedy.is_greedy and greedy.top_k == 1 and greedy.token_repetition_penalty == 1.0
    assert not any(p.is_greedy for p in (balanced, creative, precise))
    assert (balanced.temperature, balanced.top_p, balanced.min_p) == (0.7, 0.9, 0.05)
    assert creative.temperature > balanced.temperature and creative.min_p > 0
    assert precise.temperature < balanced.temperature
    for preset in (balanced, creative, precise):
        assert preset.dry_multiplier == 0 and preset.xtc_probability == 0 and not preset.mirostat


def test_user_presets_save_list_overwrite_delete(store):
    store.presets.save("zesty", {"temperature": 1.3, "min_p": 0.1})
    store.presets.save("Alpha", {"temperature": 0.5, "seed": 42, "max_new_tokens": 256})
    presets = store.presets.all()
    assert [p.name for p in presets] == BUILTIN_NAMES + ["Alpha", "zesty"]
    assert presets[-2] == Preset("Alpha", {"temperature": 0.5, "seed": 42, "max_new_tokens": 256}, False)
    store.presets.save("zesty", {"temperature": 1.1})
    assert store.presets.all()[-1] == Preset("zesty", {"temperature": 1.1}, False)
    store.close()
    with Store(store.path) as again:
        assert [p.name for p in again.presets.all() if not p.builtin] == ["Alpha", "zesty"]
        again.presets.delete("Alpha")
        assert [p.name for p in again.presets.all()] == BUILTIN_NAMES + ["zesty"]
        with pytest.raises(KeyError, match="no user preset named 'Alpha'"):
            again.presets.delete("Alpha")


def test_builtins_cannot_be_deleted_or_shadowed(store):
    for name in ("Balanced", "balanced"):
        with pytest.raises(ValueError, match="built-in"):
            store.presets.delete(name)
        with pytest.raises(ValueError, match="built-in"):
            store.presets.save(name, {"temperature": 0.1})
    assert [p.name for p in store.presets.all()] == BUILTIN_NAMES


@pytest.mark.parametrize(
    "name, settings, match",
    [
        ("", {"temperature": 1.0}, "name"),
        ("x", {"temprature": 1.0}, "unknown setting"),
        ("x", {"top_p": 1.5}, "top_p"),
        ("x", {"top_k": "many"}, "top_k"),
        ("x", {"seed": -1}, "seed"),
        ("x", {"max_new_tokens": 0}, "max_new_tokens"),
        ("x", {"temperature": float("nan")}, "JSON"),
        ("x", ["temperature"], "dict"),
    ],
)
def test_bad_user_presets_refused(store, name, settings, match):
    with pytest.raises(ValueError, match=match):
        store.presets.save(name, settings)
    assert all(p.builtin for p in store.presets.all())


def test_returned_settings_are_copies(store):
    store.presets.all()[1].settings["temperature"] = 99.0
    assert builtins(store)["Balanced"]["temperature"] == 0.7


def test_presets_file_shape_on_disk():
    document = json.loads(BUILTIN_PRESETS_PATH.read_text(encoding="utf-8"))
    assert document["format"] == 1
    assert [p["name"] for p in document["presets"]] == BUILTIN_NAMES


@pytest.mark.parametrize(
    "content", ["{not json", '{"format": 2, "presets": []}', '{"format": 1, "presets": [{"name": "x"}]}', "[]"]
)
def test_broken_presets_file_is_a_store_error(tmp_path, content):
    bad = tmp_path / "presets.json"
    bad.write_text(content)
    with Store(tmp_path / "t.sqlite3", builtin_presets=bad) as store:
        with pytest.raises(StoreError, match="presets"):
            store.presets.all()
    with Store(tmp_path / "u.sqlite3", builtin_presets=tmp_path / "missing.json") as store:
        with pytest.raises(StoreError, match="missing.json"):
            store.presets.all()
