"""Help -> Keyboard shortcuts: every key the window answers to, read from its actions, so the list cannot drift.

Two sources:
- the window's own QActions (menus, Esc to stop, Ctrl+Enter in the compare window): their shortcuts() as set
  in code; an action used outside the main window names its place in the PLACE_PROPERTY property. Only the
  window's direct children: a file dialog it opened keeps its own unnamed actions (Ctrl+Shift+H, Ctrl+Up);
- keys a widget handles in its own keyPressEvent (Enter and Shift+Enter in the message box), which no
  action describes: WIDGET_KEYS, checked against the widgets' behaviour by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

PLACE_PROPERTY = "shortcutPlace"  # a QAction property: where its shortcut works, when not the main window
MAIN_WINDOW = "Main window"


@dataclass(frozen=True)
class Shortcut:
    """One line of the list: the keys (as the platform writes them), what they do, and where."""

    keys: str
    action: str
    place: str


WIDGET_KEYS = (
    Shortcut("Enter", "Send the message", "Message box"),
    Shortcut("Shift+Enter", "Start a new line in the message", "Message box"),
)


def action_shortcuts(window: QWidget, fmt: QKeySequence.SequenceFormat = QKeySequence.SequenceFormat.NativeText):
    """The shortcuts of the QActions `window` made for itself (its menus' too), in the order they were made."""
    found: list[Shortcut] = []
    for action in window.findChildren(QAction, options=Qt.FindChildOption.FindDirectChildrenOnly):
        sequences = [s for s in action.shortcuts() if not s.isEmpty()]
        if not sequences:
            continue
        keys = ", ".join(s.toString(fmt) for s in sequences)
        place = action.property(PLACE_PROPERTY) or MAIN_WINDOW
        found.append(Shortcut(keys, _plain(action.text()), place))
    return found


def all_shortcuts(
    window: QWidget, fmt: QKeySequence.SequenceFormat = QKeySequence.SequenceFormat.NativeText
) -> list[Shortcut]:
    """What the dialog lists: the widget keys, then the actions' shortcuts, grouped by place."""
    shortcuts = [*WIDGET_KEYS, *action_shortcuts(window, fmt)]
    places = list(dict.fromkeys([MAIN_WINDOW, *(s.place for s in shortcuts)]))  # main window first
    return sorted(shortcuts, key=lambda s: places.index(s.place))  # stable: keeps each place's order


def _plain(text: str) -> str:
    """A menu text as a sentence: no mnemonic '&', no trailing '…' that promises a dialog."""
    return text.replace("&&", "\0").replace("&", "").replace("\0", "&").rstrip("…").rstrip(".").strip()


class ShortcutsDialog(QDialog):
    """A three-column table (keys, what they do, where) of `all_shortcuts(window)`."""

    def __init__(self, window: QWidget, parent: QWidget | None = None):
        super().__init__(parent if parent is not None else window)
        self.setWindowTitle("Keyboard shortcuts — Tandem")
        self.shortcuts = all_shortcuts(window)
        self.table = QTableWidget(len(self.shortcuts), 3)
        self.table.setObjectName("shortcutTable")
        self.table.setHorizontalHeaderLabels(["Keys", "Action", "Where"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        for row, shortcut in enumerate(self.shortcuts):
            for column, text in enumerate((shortcut.keys, shortcut.action, shortcut.place)):
                self.table.setItem(row, column, QTableWidgetItem(text))
        self.table.setShowGrid(False)
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        header = self.table.horizontalHeader()
        header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addWidget(buttons)
        # Big enough to show every line whole: the list is short, and a scroll bar would hide part of it.
        self.table.resizeColumnsToContents()
        self.table.resizeRowsToContents()
        frame = 2 * self.table.frameWidth()
        width = sum(self.table.columnWidth(c) for c in range(3)) + frame + 24
        height = header.sizeHint().height() + sum(self.table.rowHeight(r) for r in range(len(self.shortcuts)))
        self.table.setMinimumSize(width, min(height + frame, 640))

    def rows(self) -> list[tuple[str, str, str]]:
        """The table as shown: (keys, action, where) per line."""
        return [tuple(self.table.item(r, c).text() for c in range(3)) for r in range(self.table.rowCount())]
