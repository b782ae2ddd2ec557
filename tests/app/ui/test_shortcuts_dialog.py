"""Help -> Keyboard shortcuts lists every shortcut the window has, the keys it names do what it says, and the
README's "Keyboard shortcuts" section lists the same ones.

Bad inputs tried: Ctrl+Enter in the main window's message box (it sends the message there and must not start
the compare window), Ctrl+Enter with the compare window's prompt empty (the run refuses, saying why).
"""

from __future__ import annotations

import re
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence

from app.ui.shortcuts_dialog import MAIN_WINDOW, WIDGET_KEYS, ShortcutsDialog, all_shortcuts

README = Path(__file__).resolve().parents[3] / "README.md"
PORTABLE = QKeySequence.SequenceFormat.PortableText


def _shortcut_actions(window) -> list[QAction]:
    return [a for a in window.findChildren(QAction) if any(not s.isEmpty() for s in a.shortcuts())]


def test_every_action_with_a_shortcut_is_in_the_dialog(window, qtbot):
    dialog = ShortcutsDialog(window)
    qtbot.addWidget(dialog)
    rows = dialog.rows()
    actions = _shortcut_actions(window)
    texts = {a.text() for a in actions}
    assert {"New chat", "Close chat", "Stop answer", "Run the comparison", "Keyboard shortcuts"} <= texts
    for action in actions:
        for sequence in action.shortcuts():
            keys = sequence.toString(QKeySequence.SequenceFormat.NativeText)
            assert any(keys in row[0].split(", ") for row in rows), f"{action.text()} ({keys}) is not listed"
    listed = {row[1] for row in rows}
    assert "Rename" in listed and "Stop answer" in listed  # menu texts without their '…' and '&'
    assert ("Ctrl+Return, Ctrl+Enter", "Run the comparison", "Compare window") in rows
    assert ("Esc", "Stop answer", MAIN_WINDOW) in rows
    for key in WIDGET_KEYS:
        assert (key.keys, key.action, key.place) in rows
    assert rows[0][2] == MAIN_WINDOW  # the main window's keys come first


def test_help_menu_opens_the_dialog(window, qtbot):
    help_menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Help")
    action = next(a for a in help_menu.actions() if a.text() == "Keyboard shortcuts")
    assert action.shortcut() == QKeySequence(QKeySequence.StandardKey.HelpContents)
    action.trigger()
    dialog = window.findChild(ShortcutsDialog)
    assert dialog is not None and dialog.isVisible()
    assert dialog.table.rowCount() == len(all_shortcuts(window)) > len(WIDGET_KEYS)
    dialog.close()


def test_the_message_box_keys_do_what_the_list_says(window, qtbot):
    tab = window.current_tab()
    assert [k.keys for k in WIDGET_KEYS] == ["Enter", "Shift+Enter"]
    tab.input.setPlainText("one")
    tab.input.moveCursor(tab.input.textCursor().MoveOperation.End)
    qtbot.keyClick(tab.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert tab.input.toPlainText() == "one\n"
    tab.input.setPlainText("")  # Enter asks to send; an empty message box sends nothing (no engine run here)
    with qtbot.waitSignal(tab.input.send_requested, timeout=1000):
        qtbot.keyClick(tab.input, Qt.Key.Key_Return)


def test_ctrl_enter_runs_the_compare_window(window, qtbot, ui, run):
    window.show_compare_view()
    view = window._compare_view
    view.activateWindow()
    qtbot.waitUntil(view.isActiveWindow, timeout=5000)

    async def press(key: Qt.Key) -> bool:
        # Inside the running loop, as in the app: start() spawns the run as a task on it.
        qtbot.keyClick(view.prompt_edit, key, Qt.KeyboardModifier.ControlModifier)
        if view._task is None:
            return False
        return await view._task

    view.set_prompt("")
    assert run(press(Qt.Key.Key_Return)) is False
    assert "Write a prompt first" in view.message_label.text()

    view.set_prompt("Hello there")
    view.set_column_count(2)
    view.set_max_new_tokens(3)
    ok = run(press(Qt.Key.Key_Enter))  # keypad Enter
    assert ok is True, view.message_label.text()
    assert all(column.output.toPlainText() for column in view.columns)
    assert view.prompt_edit.toPlainText() == "Hello there"  # the shortcut ran, it did not type a newline


def test_ctrl_enter_in_the_main_window_does_not_start_the_compare_window(window, qtbot):
    window.show_compare_view()
    view = window._compare_view
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5000)
    view.set_prompt("Hello there")
    tab = window.current_tab()
    tab.input.setPlainText("")  # an empty message: Enter sends nothing
    qtbot.keyClick(tab.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert not view.is_running() and view._task is None


def test_the_readme_lists_every_shortcut(window):
    text = README.read_text(encoding="utf-8")
    match = re.search(r"^## Keyboard shortcuts\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, "README.md needs a '## Keyboard shortcuts' section"
    lines = [line for line in match.group(1).splitlines() if line.startswith("|")]
    for shortcut in all_shortcuts(window, PORTABLE):
        assert any(
            f"| {shortcut.keys} |" in line and f"| {shortcut.action} |" in line and shortcut.place in line
            for line in lines
        ), f"README's Keyboard shortcuts table lacks: | {shortcut.keys} | {shortcut.action} | {shortcut.place} |"
