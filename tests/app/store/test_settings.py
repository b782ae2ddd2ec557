"""Settings / window state (JSON values by key) and the user's model list."""

from __future__ import annotations

import pytest

from app.store import ModelEntry, Store


def test_settings_round_trip_and_persist(store):
    values = {
        "window.geometry": [10, 20, 1280, 800],
        "window.maximized": True,
        "sampler.last_preset": "Balanced",
        "ui.font_size": 13.5,
        "nested": {"splitter": [200, 600], "open_chats": [3, 1], "none": None},
        "count": 0,
    }
    for key, value in values.items():
        store.set_setting(key, value)
    assert {key: store.get_setting(key) for key in values} == values
    store.set_setting("count", 7)  # overwrite
    assert store.get_setting("count") == 7
    store.close()
    with Store(store.path) as again:
        assert again.get_setting("nested") == values["nested"]
        assert again.get_setting("count") == 7


def test_setting_defaults_and_json_conversion(store):
    assert store.get_setting("missing") is None
    assert store.get_setting("missing", {"w": 1}) == {"w": 1}
    store.set_setting("explicit none", None)
    assert store.get_setting("explicit none", "default") is None  # a saved None is a value
    store.set_setting("tuple", (1, 2))
    assert store.get_setting("tuple") == [1, 2]


@pytest.mark.parametrize("value", [object(), {1, 2}, float("inf"), b"bytes"])
def test_non_json_setting_refused(store, value):
    store.set_setting("key", "before")
    with pytest.raises(ValueError, match="setting 'key'"):
        store.set_setting("key", value)
    assert store.get_setting("key") == "before"


def test_bad_setting_key(store):
    with pytest.raises(ValueError, match="key"):
        store.set_setting("", 1)


def test_models_add_list_remove(store, tmp_path):
    first = store.models.add(str(tmp_path / "SmolLM2-135M"))
    second = store.models.add("Qwen/Qwen3-0.6B", name="Qwen3 0.6B", kind="hub")
    assert isinstance(first, ModelEntry)
    assert (first.name, first.kind) == ("SmolLM2-135M", "local")
    assert store.models.all() == [first, second]
    again = store.models.add(first.path, name="Smol", kind="gguf")
    assert (again.name, again.kind, again.added_at) == ("Smol", "gguf", first.added_at)
    assert store.models.add(first.path).name == "Smol"  # no name given keeps the chosen one
    assert [m.path for m in store.models.all()] == [first.path, second.path]
    store.models.remove(first.path)
    assert store.models.all() == [second]
    with pytest.raises(KeyError, match="no model"):
        store.models.remove(first.path)
    store.close()
    with Store(store.path) as again:
        assert again.models.all() == [second]


@pytest.mark.parametrize("kwargs", [{"path": ""}, {"path": "x", "name": ""}, {"path": "x", "kind": ""}, {"path": None}])
def test_add_model_bad_input(store, kwargs):
    with pytest.raises(ValueError):
        store.models.add(**kwargs)
    assert store.models.all() == []
