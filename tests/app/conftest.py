"""Fixtures shared by the app tests."""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# pip's own settings: no pip.conf, no local wheel folders or extra indexes, one quick try at a closed port.
# (packaging/check_bundle.py, a stand-alone script, keeps its own copy.)
OFFLINE_PIP = {
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
    "PIP_EXTRA_INDEX_URL": "",
    "PIP_FIND_LINKS": "",
    "PIP_NO_CACHE_DIR": "1",
    "PIP_RETRIES": "0",
    "PIP_TIMEOUT": "2",
}


@pytest.fixture(scope="session", autouse=True)
def collect_on_the_gui_thread(qapp):
    """As in the app (app/gui_gc.py): Qt objects are freed on the GUI thread, by its own collections while
    the event loop runs and by one after each test, never by a worker thread that happens to allocate."""
    from app.gui_gc import GuiThreadCollector

    collector = GuiThreadCollector(qapp)
    yield collector
    collector.stop()


@pytest.fixture(autouse=True)
def _collect_after_each_test(collect_on_the_gui_thread):
    yield
    gc.collect()


@pytest.fixture
def offline_pip(monkeypatch) -> dict[str, str]:
    """pip in this process and its children reaches no index, as on a machine without a network."""
    for key, value in OFFLINE_PIP.items():
        monkeypatch.setenv(key, value)
    return dict(OFFLINE_PIP)


@pytest.fixture
def shapes_png(tmp_path) -> Path:
    """A picture of a red circle left of a blue square, drawn by the demo vision model's own generator."""
    # tools/ is not a package: load the generator by its path.
    spec = importlib.util.spec_from_file_location("demo_vision_shapes", REPO / "tools" / "demo_vision" / "shapes.py")
    shapes = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = shapes  # its dataclasses look their module up there
    spec.loader.exec_module(shapes)
    path = tmp_path / "shapes.png"
    shapes.render_objects([("red", "circle"), ("blue", "square")]).save(path)
    return path
