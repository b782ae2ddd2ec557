"""app.resources finds assets/ from a checkout and inside a frozen (PyInstaller) bundle, and the app's asset
lookups (demo model, presets, stylesheet) go through it.

Bad inputs tried: a frozen process whose bundle folder (sys._MEIPASS) lacks the demo model, a frozen process
without _MEIPASS (another freezer: assets beside the executable).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from app import resources
from app.service.catalog import demo_vision_available, demo_vision_path
from app.store.presets import BUILTIN_PRESETS_PATH
from app.ui.theme import PALETTE_PATH, STYLE_PATH

REPO = Path(__file__).resolve().parents[2]


def test_from_a_checkout_assets_sit_beside_the_app_package():
    assert not resources.is_frozen()
    assert resources.assets_dir() == REPO / "assets"
    assert (resources.assets_dir() / "style.qss").is_file()
    assert resources.asset_path("presets.json") == BUILTIN_PRESETS_PATH and BUILTIN_PRESETS_PATH.is_file()
    assert STYLE_PATH == REPO / "assets" / "style.qss" and PALETTE_PATH == REPO / "assets" / "palette.json"
    assert demo_vision_path() == REPO / "assets" / "demo-vision" and demo_vision_available()
    assert len(resources.icon_paths()) == len(resources.ICON_SIZES)


def test_frozen_assets_come_from_the_bundle_folder(tmp_path, monkeypatch):
    bundle = tmp_path / "_internal"
    (bundle / "assets" / "icons").mkdir(parents=True)
    shutil.copy(REPO / "assets" / "icons" / "tandem-32.png", bundle / "assets" / "icons")
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(bundle), raising=False)
    assert resources.is_frozen()
    assert resources.assets_dir() == bundle / "assets"
    assert demo_vision_path() == bundle / "assets" / "demo-vision"
    assert not demo_vision_available()  # this bundle was built without the demo model
    assert resources.icon_paths() == [bundle / "assets" / "icons" / "tandem-32.png"]


def test_frozen_without_meipass_looks_beside_the_executable(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.delattr(sys, "_MEIPASS", raising=False)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "tandem"))
    assert resources.assets_dir() == tmp_path / "assets"
