"""Where Tandem's read-only assets (stylesheet, presets, icons, the demo vision model) live.

From a checkout or an installed tree, `assets/` sits beside the `app` package. In a PyInstaller bundle the
packages are in an archive with no real folder beside them, so the spec puts `assets/` in the bundle's data
folder, which the bootloader names in `sys._MEIPASS` (`_internal/` of a one-folder bundle,
`Contents/Frameworks` of a macOS .app, where PyInstaller links the resources in).
"""

from __future__ import annotations

import sys
from pathlib import Path

from engine.paths import assets_dir as engine_assets_dir

ICON_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def is_frozen() -> bool:
    """Whether this process runs from a PyInstaller bundle (not from Python with the source tree)."""
    return bool(getattr(sys, "frozen", False))


def assets_dir() -> Path:
    """The `assets/` folder: in the bundle's data folder when frozen, else beside the `app` package (the
    engine finds its bundled demo model there too, so the rule lives in engine.paths)."""
    return engine_assets_dir()


def asset_path(*parts: str) -> Path:
    """A path inside `assets/` (it may not exist: callers check, e.g. for the optional demo model)."""
    return assets_dir().joinpath(*parts)


def icon_paths() -> list[Path]:
    """The app icon's rendered PNGs that exist, smallest first (tools/render_icons.py writes them)."""
    return [p for p in (asset_path("icons", f"tandem-{size}.png") for size in ICON_SIZES) if p.is_file()]


__all__ = ["ICON_SIZES", "asset_path", "assets_dir", "icon_paths", "is_frozen"]
