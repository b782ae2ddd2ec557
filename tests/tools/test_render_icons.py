"""The app icon's PNGs (assets/icons) exist at the standard sizes and match a fresh render of tandem.svg.

Bad inputs tried: a PNG deleted, a PNG of the wrong size, the SVG recoloured after rendering (the PNGs are then
stale), an SVG shape without a fill (the Pillow renderer refuses it), an unknown backend.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from PIL import Image

from app.resources import ICON_SIZES, icon_paths

REPO = Path(__file__).resolve().parents[2]


def _load_tool():
    # tools/ is not a package: load the script by its path.
    spec = importlib.util.spec_from_file_location("render_icons", REPO / "tools" / "render_icons.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render_icons = _load_tool()


def test_pngs_exist_at_every_standard_size():
    assert render_icons.SIZES == ICON_SIZES
    for size in ICON_SIZES:
        with Image.open(render_icons.png_path(size)) as image:
            assert image.size == (size, size) and image.mode == "RGBA"
    assert [p.name for p in icon_paths()] == [f"tandem-{s}.png" for s in ICON_SIZES]


def test_pngs_match_a_fresh_render(qapp):
    assert render_icons.stale_pngs() == []


def test_a_recoloured_svg_makes_the_pngs_stale(qapp, tmp_path):
    svg = tmp_path / "tandem.svg"
    svg.write_text(render_icons.SVG_PATH.read_text().replace("#1f3a5f", "#c03020"))
    problems = render_icons.stale_pngs(svg, render_icons.ICONS_DIR)
    assert len(problems) == len(ICON_SIZES) and all("differs" in p for p in problems)


def test_missing_or_wrong_size_pngs_are_reported(qapp, tmp_path):
    for size in ICON_SIZES:
        shutil.copy(render_icons.png_path(size), tmp_path)
    render_icons.png_path(16, tmp_path).unlink()
    Image.new("RGBA", (20, 20)).save(render_icons.png_path(24, tmp_path))
    problems = render_icons.stale_pngs(render_icons.SVG_PATH, tmp_path)
    assert len(problems) == 2 and "missing" in problems[0] and "tandem-24.png differs" in problems[1]


def test_the_cli_writes_pngs_that_then_check_clean(qapp, tmp_path):
    assert render_icons.main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"tandem-{s}.png" for s in ICON_SIZES)
    assert render_icons.main(["--check", "--out", str(tmp_path)]) == 0
    render_icons.png_path(48, tmp_path).unlink()
    assert render_icons.main(["--check", "--out", str(tmp_path)]) == 1


@pytest.mark.parametrize("size", [16, 64, 256])
def test_the_pillow_fallback_draws_the_same_shapes(qapp, size):
    qt = render_icons.render(render_icons.SVG_PATH, size, "qt")
    pillow = render_icons.render(render_icons.SVG_PATH, size, "pillow")
    # Antialiasing differs along edges, most at 16 px; a missing or misplaced shape differs by tens.
    assert render_icons.difference(qt, pillow) < 8


def test_the_pillow_renderer_refuses_what_it_cannot_draw(tmp_path):
    svg = tmp_path / "bad.svg"
    svg.write_text('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10"><rect width="5" height="5"/></svg>')
    with pytest.raises(ValueError, match="without a fill"):
        render_icons.render(svg, 16, "pillow")
    with pytest.raises(ValueError, match="unknown backend"):
        render_icons.render(render_icons.SVG_PATH, 16, "cairo")
