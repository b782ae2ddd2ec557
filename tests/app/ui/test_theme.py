"""The stylesheet in light and dark: chosen by the colour scheme, re-applied when it changes, parsed by Qt
without a warning, readable font size, and the states (error, muted) widgets use instead of their own colours.

Bad inputs tried: a sheet naming a colour the palette lacks, a stray dollar sign, palettes that disagree on
their names, a colour that is not one, an unknown scheme and state, and a sheet Qt cannot parse (the last
one shows the warning capture does catch what the real sheet must not produce).
"""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFrame,
    QLabel,
    QLineEdit,
    QListWidget,
    QMainWindow,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.ui import theme


@pytest.fixture
def themed(qapp):
    """The application, put back to the system's scheme afterwards (other tests' windows share it)."""
    yield qapp
    theme.apply_theme(qapp)


def _palettes() -> dict[str, dict[str, str]]:
    return theme.load_palettes()


def _showcase(qtbot) -> QMainWindow:
    """A window with every kind of widget and object name the sheet styles, shown so Qt polishes it."""
    window = QMainWindow()
    qtbot.addWidget(window)
    column = QWidget()
    column.setObjectName("messageColumn")
    layout = QVBoxLayout(column)
    for name in ("userMessage", "assistantMessage", "startupBanner"):
        frame = QFrame()
        frame.setObjectName(name)
        QVBoxLayout(frame).addWidget(QTextBrowser())
        layout.addWidget(frame)
    for name in ("roleLabel", "statsLabel", "noticeLabel", "errorLabel"):
        label = QLabel(name)
        label.setObjectName(name)
        layout.addWidget(label)
    notice = QWidget()
    notice.setObjectName("notice")
    system_prompt = QPlainTextEdit()
    system_prompt.setObjectName("systemPrompt")
    chats = QListWidget()
    chats.setObjectName("chatList")
    chats.addItems(["First chat", "Second chat"])
    meter = QProgressBar()
    meter.setObjectName("contextMeter")
    meter.setValue(30)
    tabs = QTabWidget()
    tabs.addTab(QWidget(), "A chat")
    combo = QComboBox()
    combo.addItems(["Balanced", "Creative"])
    for widget in (notice, system_prompt, chats, meter, tabs, combo, QLineEdit("x"), QPushButton("Run"),
                   QSpinBox(), QCheckBox("JSON")):  # fmt: skip
        layout.addWidget(widget)
    window.setCentralWidget(column)
    window.menuBar().addMenu("&Chat").addAction("New chat")
    window.statusBar().showMessage("ready")
    window.resize(500, 900)
    window.show()
    qtbot.waitExposed(window)
    return window


def test_dark_scheme_yields_the_dark_sheet_and_palette(themed):
    dark = _palettes()["dark"]
    assert theme.apply_theme(themed, Qt.ColorScheme.Dark) == "dark"
    sheet = themed.styleSheet()
    assert sheet == theme.stylesheet("dark") != theme.stylesheet("light")
    assert "$" not in sheet and dark["user_bg"] in sheet and _palettes()["light"]["user_bg"] not in sheet
    assert themed.palette().color(QPalette.ColorRole.Window) == QColor(dark["window"])
    assert themed.palette().color(QPalette.ColorRole.Text) == QColor(dark["text"])
    assert theme.is_dark(themed) and theme.current_scheme(themed) == "dark"

    assert theme.apply_theme(themed, Qt.ColorScheme.Light) == "light"
    assert themed.styleSheet() == theme.stylesheet("light")
    assert themed.palette().color(QPalette.ColorRole.Window) == QColor(_palettes()["light"]["window"])
    assert not theme.is_dark(themed)
    # Qt's Unknown (X11 without a desktop portal, the offscreen platform) reads as light.
    assert theme.apply_theme(themed, Qt.ColorScheme.Unknown) == "light"


def test_the_window_is_painted_in_the_schemes_colours(themed, qtbot):
    window = _showcase(qtbot)
    for name in ("light", "dark"):
        theme.apply_theme(themed, name)
        themed.processEvents()
        status_bar = window.statusBar()
        image = status_bar.grab().toImage()
        assert image.pixelColor(image.width() - 5, image.height() // 2) == QColor(_palettes()[name]["panel"])
        frame = window.findChild(QFrame, "userMessage")
        image = frame.grab().toImage()
        assert image.pixelColor(frame.width() // 2, frame.height() - 4) == QColor(_palettes()[name]["user_bg"])


def test_a_change_of_scheme_reapplies_the_sheet(themed):
    theme.follow_system(themed)
    theme.follow_system(themed)  # a second window: still one connection
    hints = themed.styleHints()
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)
    assert themed.styleSheet() == theme.stylesheet("dark") and theme.is_dark(themed)
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
    assert themed.styleSheet() == theme.stylesheet("light") and not theme.is_dark(themed)


def test_the_main_window_follows_the_system(themed, window):
    system = theme.scheme_name(themed.styleHints().colorScheme())
    assert themed.styleSheet() == theme.stylesheet(system)
    theme.apply_theme(themed, "dark")
    assert window.palette().color(QPalette.ColorRole.Window) == QColor(_palettes()["dark"]["window"])


@pytest.mark.parametrize("scheme", theme.SCHEMES)
def test_the_sheet_parses_without_qt_warnings(themed, qtbot, qtlog, scheme):
    theme.apply_theme(themed, scheme)
    window = _showcase(qtbot)
    window.findChild(QComboBox).showPopup()
    themed.processEvents()
    window.findChild(QComboBox).hidePopup()
    assert [r.message for r in qtlog.records if "style" in r.message.lower()] == []


def test_a_sheet_qt_cannot_parse_is_caught_by_the_same_capture(qtbot, qtlog):
    label = QLabel("broken")
    label.setStyleSheet("QLabel { color: ")
    qtbot.addWidget(label)
    label.show()
    label.ensurePolished()
    assert any("parse" in r.message.lower() for r in qtlog.records)


def test_a_readable_default_font_size(themed):
    theme.apply_theme(themed, "light")
    assert themed.font().pointSizeF() >= theme.MIN_POINT_SIZE
    small = themed.font()
    small.setPointSizeF(7)
    assert theme.readable_font(small).pointSizeF() == theme.MIN_POINT_SIZE
    big = themed.font()
    big.setPointSizeF(14)
    assert theme.readable_font(big).pointSizeF() == 14  # a bigger system font is kept


def test_marked_labels_take_the_sheets_colours(themed, qtbot):
    label = QLabel("Not enough memory")
    qtbot.addWidget(label)
    for name in ("light", "dark"):
        theme.apply_theme(themed, name)
        colours = _palettes()[name]
        theme.mark(label, "error")
        assert label.palette().color(QPalette.ColorRole.WindowText) == QColor(colours["error_text"])
        theme.mark(label, "muted")
        assert label.palette().color(QPalette.ColorRole.WindowText) == QColor(colours["muted_text"])
        theme.mark(label, None)
        assert label.palette().color(QPalette.ColorRole.WindowText) == QColor(colours["text"])
    with pytest.raises(theme.ThemeError, match="no widget state named 'red'"):
        theme.mark(label, "red")


def test_broken_assets_say_what_to_fix(tmp_path):
    palette_path = tmp_path / "palette.json"
    colours = {"window": "#ffffff", "text": "#000000"}
    palette_path.write_text(json.dumps({"light": colours, "dark": colours}))
    sheet = tmp_path / "style.qss"
    sheet.write_text("QWidget { color: $text; background: $missing; }")
    with pytest.raises(theme.ThemeError, match=r"uses \$missing, which .* does not define"):
        theme.stylesheet("dark", sheet, palette_path)
    sheet.write_text("QWidget { color: $ text; }")
    with pytest.raises(theme.ThemeError, match=r"literal dollar sign as \$\$"):
        theme.stylesheet("dark", sheet, palette_path)
    sheet.write_text("QWidget { color: $text; } /* costs $$5 */")
    assert theme.stylesheet("light", sheet, palette_path) == "QWidget { color: #000000; } /* costs $5 */"

    palette_path.write_text(json.dumps({"light": colours, "dark": {"window": "#000000"}}))
    with pytest.raises(theme.ThemeError, match=r"only in light: \['text'\]"):
        theme.load_palettes(palette_path)
    palette_path.write_text(json.dumps({"light": colours, "dark": {**colours, "text": "blurple"}}))
    with pytest.raises(theme.ThemeError, match="dark.text is 'blurple', not a colour"):
        theme.load_palettes(palette_path)
    palette_path.write_text(json.dumps({"light": colours}))
    with pytest.raises(theme.ThemeError, match="no 'dark' colour set"):
        theme.load_palettes(palette_path)
    with pytest.raises(theme.ThemeError, match="no colour scheme named 'sepia'"):
        theme.scheme_name("sepia")


def test_both_palettes_fill_the_real_sheet_and_the_qt_palette():
    palettes = _palettes()
    assert set(palettes["light"]) == set(palettes["dark"])
    for name in theme.SCHEMES:
        assert "$" not in theme.stylesheet(name)
        assert theme.qt_palette(name).color(QPalette.ColorRole.Base) == QColor(palettes[name]["base"])


def test_code_blocks_in_answers_follow_the_scheme(themed, qtbot):
    from app.ui.message_view import MessageWidget

    answer = "Here:\n\n```python\nprint('hi')\n```\n"
    html = {}
    for name in ("light", "dark"):
        theme.apply_theme(themed, name)
        widget = MessageWidget(1, "assistant", answer)
        qtbot.addWidget(widget)
        html[name] = widget.body.toHtml()
    assert "#272822" in html["dark"] and "#272822" not in html["light"]  # rich_text's dark code background
