"""Render Tandem's icon, assets/icons/tandem.svg, to PNGs at the standard sizes (assets/icons/tandem-<N>.png).

    python tools/render_icons.py            # write the PNGs
    python tools/render_icons.py --check    # exit 1 when a PNG is missing or differs from a fresh render

Qt's SVG renderer (QtSvg, part of PySide6) draws them on the offscreen platform. Without QtSvg, the same
shapes are drawn with Pillow: the icon uses only <rect> (with rx/ry), <circle> and <polygon> with flat fills,
which this script reads from the SVG itself, supersampled 4x for antialiasing.

Development tool: the app only reads the PNGs (app/resources.py, packaging/linux).
"""

from __future__ import annotations

import argparse
import os
import sys
import xml.etree.ElementTree as ET
from io import BytesIO
from pathlib import Path

import numpy as np
from PIL import Image, ImageColor, ImageDraw

ROOT = Path(__file__).resolve().parents[1]
ICONS_DIR = ROOT / "assets" / "icons"
SVG_PATH = ICONS_DIR / "tandem.svg"
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
# Mean absolute difference per channel (0..255) a PNG may have from a fresh render: renderer versions
# antialias edges a little differently; a changed shape or colour moves the mean far more than this.
TOLERANCE = 2.0
_SUPERSAMPLE = 4
_SVG_NS = "{http://www.w3.org/2000/svg}"


def png_path(size: int, folder: Path = ICONS_DIR) -> Path:
    return folder / f"tandem-{size}.png"


def qt_svg_available() -> bool:
    try:
        from PySide6 import QtSvg  # noqa: F401
    except ImportError:
        return False
    return True


def render_qt(svg: Path, size: int) -> Image.Image:
    """`svg` drawn by QSvgRenderer into a size x size RGBA image."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    if QGuiApplication.instance() is None:  # painting needs the GUI module up; offscreen needs no display
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        _keep.append(QGuiApplication([sys.argv[0]]))
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise ValueError(f"{svg} is not an SVG file Qt can draw; check its XML.")
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    buffer.close()
    return Image.open(BytesIO(bytes(data))).convert("RGBA")


_keep: list = []  # the QGuiApplication render_qt made, kept alive for later renders


def render_pillow(svg: Path, size: int) -> Image.Image:
    """The same shapes drawn with Pillow: the SVG's rect, circle and polygon elements, in document order."""
    root = ET.parse(svg).getroot()
    view = [float(v) for v in root.get("viewBox", "0 0 256 256").split()]
    big = size * _SUPERSAMPLE
    scale = big / view[2]
    canvas = Image.new("RGBA", (big, big), (0, 0, 0, 0))
    draw = ImageDraw.Draw(canvas)

    def xy(x: str | float, y: str | float) -> tuple[float, float]:
        return ((float(x) - view[0]) * scale, (float(y) - view[1]) * scale)

    for element in root.iter():
        tag = element.tag.removeprefix(_SVG_NS)
        fill = element.get("fill")
        if tag not in ("rect", "circle", "polygon"):
            continue
        if not fill:
            raise ValueError(f"{svg}: a <{tag}> without a fill; the Pillow renderer draws flat fills only")
        colour = ImageColor.getrgb(fill)
        if tag == "rect":
            x0, y0 = xy(element.get("x", 0), element.get("y", 0))
            width, height = float(element.get("width")) * scale, float(element.get("height")) * scale
            radius = float(element.get("rx", element.get("ry", 0))) * scale
            draw.rounded_rectangle((x0, y0, x0 + width - 1, y0 + height - 1), radius=radius, fill=colour)
        elif tag == "circle":
            cx, cy = xy(element.get("cx"), element.get("cy"))
            r = float(element.get("r")) * scale
            draw.ellipse((cx - r, cy - r, cx + r - 1, cy + r - 1), fill=colour)
        else:
            numbers = element.get("points", "").replace(",", " ").split()
            draw.polygon([xy(numbers[i], numbers[i + 1]) for i in range(0, len(numbers) - 1, 2)], fill=colour)
    return canvas.resize((size, size), Image.Resampling.LANCZOS)


def render(svg: Path, size: int, backend: str = "auto") -> Image.Image:
    """`svg` as a size x size RGBA image; backend "qt", "pillow", or "auto" (Qt when QtSvg is installed)."""
    if backend == "auto":
        backend = "qt" if qt_svg_available() else "pillow"
    if backend == "qt":
        return render_qt(svg, size)
    if backend == "pillow":
        return render_pillow(svg, size)
    raise ValueError(f"unknown backend {backend!r}; use 'qt', 'pillow' or 'auto'")


def difference(a: Image.Image, b: Image.Image) -> float:
    """Mean absolute difference per RGBA channel (0..255); inf when the sizes differ."""
    if a.size != b.size:
        return float("inf")
    return float(np.abs(np.asarray(a.convert("RGBA"), np.int16) - np.asarray(b.convert("RGBA"), np.int16)).mean())


def stale_pngs(svg: Path = SVG_PATH, folder: Path = ICONS_DIR, backend: str = "auto") -> list[str]:
    """Why each PNG is missing or differs from a fresh render (empty when all are current)."""
    problems = []
    for size in SIZES:
        path = png_path(size, folder)
        if not path.is_file():
            problems.append(f"{path} is missing")
            continue
        with Image.open(path) as saved:
            diff = difference(saved, render(svg, size, backend))
        if diff > TOLERANCE:
            problems.append(f"{path} differs from a fresh render of {svg.name} (mean difference {diff:.2f})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare the PNGs with a fresh render")
    parser.add_argument("--backend", choices=("auto", "qt", "pillow"), default="auto")
    parser.add_argument("--svg", type=Path, default=SVG_PATH)
    parser.add_argument("--out", type=Path, default=ICONS_DIR, help="folder for tandem-<N>.png")
    args = parser.parse_args(argv)
    if not args.svg.is_file():
        parser.error(f"--svg {args.svg}: no such file")
    if args.check:
        problems = stale_pngs(args.svg, args.out, args.backend)
        for problem in problems:
            print(problem, file=sys.stderr)
        print("icons are current" if not problems else "run: python tools/render_icons.py")
        return 1 if problems else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for size in SIZES:
        render(args.svg, size, args.backend).save(png_path(size, args.out), optimize=True)
        print(png_path(size, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
