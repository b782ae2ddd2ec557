"""Tandem's look: one stylesheet, a light and a dark set of colours, chosen by the system's colour scheme.

    assets/style.qss  --$name filled from-->  assets/palette.json["light" | "dark"]
            |                                          |
            v                                          v
    QApplication.setStyleSheet                 QApplication.setPalette (widgets the sheet does not
                                               name, and palette(...) references, match the sheet)

`follow_system(app)` applies the scheme Qt reports (QStyleHints.colorScheme, Qt 6.5+) and re-applies it on
colorSchemeChanged, so switching the desktop to dark while Tandem runs turns the window dark too. The sheet
is applied to the application rather than one window, so dialogs and the compare window follow it as well.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from string import Template

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QPalette
from PySide6.QtWidgets import QApplication, QWidget

from app.resources import asset_path

log = logging.getLogger(__name__)

STYLE_PATH = asset_path("style.qss")  # from a checkout or the frozen bundle (app.resources)
PALETTE_PATH = asset_path("palette.json")
SCHEMES = ("light", "dark")
# Platform defaults are 9 pt on Linux and Windows, small for reading long answers; never shrink a bigger one.
MIN_POINT_SIZE = 10.0
# Widget states the sheet colours (QLabel[error="true"] ...), set with mark().
MARKS = ("error", "warning", "muted")
_SCHEME_PROPERTY = "tandemColorScheme"  # on the QApplication: the name of the scheme applied last
_FOLLOWING_PROPERTY = "tandemFollowsColorScheme"


class ThemeError(ValueError):
    """The stylesheet or the palette file in assets/ is broken (a message says which and how to fix it)."""


def scheme_name(scheme: Qt.ColorScheme | str) -> str:
    """The scheme's name: Qt's Dark is "dark"; Light and Unknown (X11 without a desktop portal) are "light"."""
    if isinstance(scheme, str):
        if scheme not in SCHEMES:
            raise ThemeError(f"no colour scheme named {scheme!r}: use one of {', '.join(SCHEMES)}")
        return scheme
    return "dark" if scheme == Qt.ColorScheme.Dark else "light"


def load_palettes(path: Path = PALETTE_PATH) -> dict[str, dict[str, str]]:
    """The colour sets of palette.json by scheme name, checked: both schemes, the same names, valid colours."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ThemeError(f"cannot read the colour palette {path}: {e}; restore it from the Tandem sources") from e
    palettes: dict[str, dict[str, str]] = {}
    for name in SCHEMES:
        colours = raw.get(name)
        if not isinstance(colours, dict):
            raise ThemeError(f"{path} has no {name!r} colour set: add one with the same names as the other")
        palettes[name] = {key: value for key, value in colours.items() if not key.startswith("_")}
    light, dark = (set(palettes[name]) for name in SCHEMES)
    if light != dark:
        raise ThemeError(
            f"{path}: the light and dark sets must name the same colours; only in light: {sorted(light - dark)}, "
            f"only in dark: {sorted(dark - light)}"
        )
    for name, colours in palettes.items():
        for key, value in colours.items():
            if not isinstance(value, str) or not QColor.isValidColorName(value):
                raise ThemeError(f"{path}: {name}.{key} is {value!r}, not a colour; write it as #rrggbb")
    return palettes


def stylesheet(scheme: Qt.ColorScheme | str, style_path: Path = STYLE_PATH, palette_path: Path = PALETTE_PATH) -> str:
    """style.qss with every $name replaced by the scheme's colour."""
    name = scheme_name(scheme)
    colours = load_palettes(palette_path)[name]
    try:
        template = Template(style_path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ThemeError(f"cannot read the stylesheet {style_path}: {e}; restore it from the Tandem sources") from e
    try:
        return template.substitute(colours)
    except KeyError as e:
        raise ThemeError(
            f"{style_path} uses ${e.args[0]}, which {palette_path} does not define: add it to both colour sets"
        ) from e
    except ValueError as e:  # a lone $ or a $ before something that is not a name
        raise ThemeError(f"{style_path}: {e}; colours are written $name, a literal dollar sign as $$") from e


def qt_palette(scheme: Qt.ColorScheme | str, palette_path: Path = PALETTE_PATH) -> QPalette:
    """The Qt palette matching the sheet, for what the sheet does not style (scroll bars, check boxes, ...)."""
    c = {key: QColor(value) for key, value in load_palettes(palette_path)[scheme_name(scheme)].items()}
    role = QPalette.ColorRole
    palette = QPalette()
    for r, key in (
        (role.Window, "window"),
        (role.WindowText, "text"),
        (role.Base, "base"),
        (role.AlternateBase, "alt_base"),
        (role.Text, "text"),
        (role.Button, "button"),
        (role.ButtonText, "text"),
        (role.BrightText, "error_text"),
        (role.Highlight, "accent"),
        (role.HighlightedText, "on_accent"),
        (role.Link, "link"),
        (role.LinkVisited, "link"),
        (role.PlaceholderText, "placeholder"),
        (role.ToolTipBase, "tooltip_bg"),
        (role.ToolTipText, "tooltip_text"),
        (role.Light, "button_hover"),
        (role.Midlight, "soft_border"),
        (role.Dark, "border"),
        # palette(mid) is what Qt code reaches for as secondary text, so it must stay readable on the window.
        (role.Mid, "muted_text"),
    ):
        palette.setColor(r, c[key])
    palette.setColor(role.Shadow, QColor("#000000"))
    for r in (role.Text, role.WindowText, role.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, r, c["disabled_text"])
    return palette


def readable_font(font: QFont) -> QFont:
    """`font` at MIN_POINT_SIZE or more (a font sized in pixels is left as it is)."""
    result = QFont(font)
    if 0 < result.pointSizeF() < MIN_POINT_SIZE:
        result.setPointSizeF(MIN_POINT_SIZE)
    return result


def apply_theme(app: QApplication, scheme: Qt.ColorScheme | str | None = None) -> str:
    """Style the whole application for `scheme` (None: the system's) and return the scheme's name."""
    if scheme is None:
        scheme = app.styleHints().colorScheme()
    name = scheme_name(scheme)
    sheet = stylesheet(name)
    app.setFont(readable_font(app.font()))
    app.setPalette(qt_palette(name))
    if app.styleSheet() != sheet:  # setting a sheet re-polishes every widget: skip it when nothing changed
        app.setStyleSheet(sheet)
    app.setProperty(_SCHEME_PROPERTY, name)
    log.debug("applied the %s colour scheme", name)
    return name


def follow_system(app: QApplication) -> str:
    """Apply the system's colour scheme now and again whenever it changes; calling it twice connects once."""
    name = apply_theme(app)
    if not app.property(_FOLLOWING_PROPERTY):
        app.styleHints().colorSchemeChanged.connect(lambda scheme: _scheme_changed(app, scheme))
        app.setProperty(_FOLLOWING_PROPERTY, True)
    return name


def _scheme_changed(app: QApplication, scheme: Qt.ColorScheme) -> None:
    # A platform may report a change because our own palette changed; only a different scheme re-applies.
    if scheme_name(scheme) != current_scheme(app):
        apply_theme(app, scheme)


def current_scheme(app: QApplication | None = None) -> str:
    """The scheme applied last ("light" or "dark"); the system's when no theme was applied yet."""
    app = app or QApplication.instance()
    if app is None:
        return "light"
    applied = app.property(_SCHEME_PROPERTY)
    return applied if applied in SCHEMES else scheme_name(app.styleHints().colorScheme())


def is_dark(app: QApplication | None = None) -> bool:
    """Whether the dark colours are in use (rich text that carries its own colours, e.g. code, asks this)."""
    return current_scheme(app) == "dark"


def mark(widget: QWidget, state: str | None) -> None:
    """Give `widget` one of the sheet's states (MARKS: "error", "warning", "muted") or none, and restyle it.

    Widgets call this instead of setStyleSheet("color: ...") so the colour comes from the sheet and follows
    the scheme.
    """
    if state is not None and state not in MARKS:
        raise ThemeError(f"no widget state named {state!r} in the stylesheet: use one of {', '.join(MARKS)}")
    for name in MARKS:
        widget.setProperty(name, name == state)
    # Qt matches [property=...] selectors when a widget is polished, so a changed property needs a re-polish.
    widget.style().unpolish(widget)
    widget.style().polish(widget)
