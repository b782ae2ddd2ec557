"""app/ui/thinking_block.py: open while the model thinks, closed with its duration once the answer begins,
hidden for an answer without thinking; the user can open and close it."""

from __future__ import annotations

from PySide6.QtWidgets import QVBoxLayout, QWidget

from app.ui.thinking_block import ThinkingBlock


def shown_block(qtbot) -> tuple[QWidget, ThinkingBlock]:
    """A block in a shown message, as the message view holds it (keep the message: it owns the block)."""
    message = QWidget()
    qtbot.addWidget(message)
    block = ThinkingBlock()
    QVBoxLayout(message).addWidget(block)
    message.show()
    return message, block


def test_open_while_thinking_then_closed_with_its_duration(qtbot):
    _message, block = shown_block(qtbot)
    assert not block.isVisible()  # nothing to show yet
    block.set_reasoning("", thinking=True)
    assert block.isVisible() and block.is_open and block.toggle.text() == "▾ Thinking…"
    block.set_reasoning("The user wants colours.\n", thinking=True)
    assert block.text.text() == "The user wants colours." and block.text.isVisible()
    block.set_reasoning("The user wants colours.", thinking=False, seconds=12.34)
    assert not block.is_open and not block.text.isVisible() and block.toggle.text() == "▸ Thought for 12.3 s"
    block.toggle.click()
    assert block.is_open and block.text.isVisible() and block.toggle.text().startswith("▾ Thought for")
    block.set_reasoning("The user wants colours.", thinking=False, seconds=12.34)  # a re-render keeps it open
    assert block.is_open


def test_no_thinking_no_block(qtbot):
    _message, block = shown_block(qtbot)
    block.set_reasoning("  ", thinking=False)
    assert not block.isVisible()
