"""The conversation: one MessageWidget per message (Markdown, code highlighting, copy, stats, thumbnails)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QPixmap
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)
from shiboken6 import isValid

from app.service.reasoning import split, stored_format
from app.service.workers import FILES, submit
from app.ui.context_divider import ContextDivider
from app.ui.message_documents import DocumentsBlock
from app.ui.rich_text import COPY_CODE_SCHEME, code_blocks, markdown_to_html, warm_up
from app.ui.theme import is_dark
from app.ui.thinking_block import ThinkingBlock
from app.ui.version_switch import VersionSwitch

RENDER_INTERVAL_MS = 80  # while streaming, re-render Markdown at most this often (the text itself is never lost)
# ...and at most this share of the time: a long answer's render costs more, so it is redone less often.
RENDER_SHARE = 1 / 8
_ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}


ANSWER_LIMIT_MARK = "stopped at the answer limit"


def cut_at_limit(stats: dict[str, Any]) -> bool:
    """Whether an answer ended at its token limit, not by itself: Continue can write on (not a JSON-mode answer,
    whose grammar would start again)."""
    return stats.get("eos_reason") == "max_new_tokens" and not stats.get("json_mode")


def format_stats(stats: dict[str, Any]) -> str:
    """One line for an answer: tokens, tok/s, time to first token, cached prompt tokens, the share of drafted
    tokens accepted (speculative decoding) and whether a JSON-mode answer is complete (from the eos result)."""
    parts = []
    if "new_tokens" in stats:
        parts.append(f"{stats['new_tokens']} tokens")
    if stats.get("tokens_per_second"):
        parts.append(f"{stats['tokens_per_second']:.1f} tok/s")
    if stats.get("time_to_first_token") is not None:
        parts.append(f"first token {stats['time_to_first_token'] * 1000:.0f} ms")
    if "cached_tokens" in stats and "prompt_tokens" in stats:
        parts.append(f"{stats['cached_tokens']} of {stats['prompt_tokens']} prompt tokens cached")
    drafted = stats.get("accepted_draft_tokens", 0) + stats.get("rejected_draft_tokens", 0)
    if drafted:
        parts.append(f"{stats['accepted_draft_tokens'] / drafted:.0%} of drafted tokens accepted")
    if stats.get("json_mode") and stats.get("eos_reason"):
        # A JSON-mode answer is valid JSON only when the object closed before the token limit.
        parts.append("JSON cut off at the token limit" if stats["eos_reason"] == "max_new_tokens" else "JSON complete")
    elif cut_at_limit(stats):
        parts.append(ANSWER_LIMIT_MARK)  # else it ends mid-sentence with only a token count to say why
    if stats.get("stopped"):
        parts.append("stopped")
    elif stats.get("error"):
        parts.append(f"failed: {stats['error']}")
    return " · ".join(parts)


class _RenderQueue:
    """Renders streaming messages one per event-loop turn.

    Answers streaming side by side receive tokens together, so their throttle timers fire together; rendered
    in one go, four long answers froze the window for one render each, back to back. Queued, the window
    handles input and paints between any two renders.
    """

    def __init__(self) -> None:
        self._pending: list[MessageWidget] = []
        self._timer: QTimer | None = None

    def add(self, widget: MessageWidget) -> None:
        if widget in self._pending:
            return
        self._pending.append(widget)
        if self._timer is None:  # made on first use: a QTimer needs the application to exist
            self._timer = QTimer()
            self._timer.setSingleShot(True)
            self._timer.setInterval(0)
            self._timer.timeout.connect(self._render_next)
        self._timer.start()

    def _render_next(self) -> None:
        while self._pending:
            widget = self._pending.pop(0)
            if not isValid(widget):  # a message removed while it waited is not rendered
                continue
            if widget.window().isVisible() and not widget.isVisible():  # a background tab: rendered when shown
                widget._stale = True
                continue
            widget._render()
            break
        if self._pending and self._timer is not None:
            self._timer.start()


_RENDER_QUEUE = _RenderQueue()
_warm_up_lock = threading.Lock()
_warm_up_done: Future[None] | None = None


def warm_up_code_highlighting() -> Future[None]:
    """Load the code highlighter on a worker thread, once; the future is done when it is loaded.

    The window starts it when it opens, so it is done long before the first answer (a user types first):
    loading it is a long stretch of pure Python, which run while answers stream would take the GIL from the
    GUI thread and stall the event loop."""
    global _warm_up_done
    with _warm_up_lock:
        if _warm_up_done is None:
            _warm_up_done = submit(warm_up, pool=FILES)
        return _warm_up_done


class AutoHeightBrowser(QTextBrowser):
    """A read-only rich-text view as tall as its text, so the surrounding list scrolls instead of it."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setOpenLinks(False)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self.viewport().setAutoFillBackground(False)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._fit()

    def _fit(self, *_: Any) -> None:
        self.document().setTextWidth(self.viewport().width())
        height = math.ceil(self.document().size().height()) + 2 * self.frameWidth()
        if height != self.height():
            self.setFixedHeight(max(height, 1))

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(super().sizeHint().width(), self.height())


class MessageWidget(QFrame):
    """One message: who, its text as Markdown, thumbnails, answer statistics, and its actions."""

    edit_requested = Signal(int)
    regenerate_requested = Signal(int)
    continue_requested = Signal(int)  # write on an answer cut at its token limit
    version_requested = Signal(int, int)  # message id, -1 (the version before) or +1 (the one after)

    def __init__(
        self,
        message_id: int | None,
        role: str,
        text: str = "",
        *,
        image_paths: Sequence[Path] = (),
        stats: dict[str, Any] | None = None,
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self.message_id = message_id  # None until stored: an answer's widget is built before its message is
        self.role = role
        self._text = text
        self._streaming = False
        self._progress = ""  # how far a long prompt has been read, shown until the answer's first text
        self._stale = False  # the text changed while the message was hidden; render when shown
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(lambda: _RENDER_QUEUE.add(self))
        self.setObjectName("userMessage" if role == "user" else "assistantMessage")
        self.setFrameShape(QFrame.Shape.StyledPanel)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.setSpacing(2)
        header = QHBoxLayout()
        name = QLabel(_ROLE_NAMES.get(role, role))
        name.setObjectName("roleLabel")
        header.addWidget(name)
        self.versions = VersionSwitch()
        self.versions.step.connect(lambda step: self.version_requested.emit(self.message_id, step))
        header.addWidget(self.versions)
        header.addStretch()
        self.copy_button = self._tool("Copy", "Copy the message as Markdown", self.copy_text)
        self.edit_button = self._tool("Edit", "Edit this message and send it as a new version (this one is kept)")
        self.edit_button.clicked.connect(lambda: self.edit_requested.emit(self.message_id))
        self.regenerate_button = self._tool("Regenerate", "Write this answer again (this one is kept as a version)")
        self.regenerate_button.clicked.connect(lambda: self.regenerate_requested.emit(self.message_id))
        self.continue_button = self._tool("Continue", "Write on from where the answer stopped, in this same answer")
        self.continue_button.clicked.connect(lambda: self.continue_requested.emit(self.message_id))
        for button in (self.copy_button, self.edit_button, self.regenerate_button, self.continue_button):
            header.addWidget(button)
        layout.addLayout(header)
        # only now do the buttons have a parent: showing a parentless widget would open it as a window
        self.edit_button.setVisible(role == "user")
        self.regenerate_button.setVisible(False)
        self.continue_button.setVisible(False)
        self.is_cut = False  # ended at its token limit (set_stats)

        # A reasoning model's thinking, apart from its answer: split by the backend while an answer streams, and
        # once here for a stored one (engine.reasoning's parser either way).
        self.thinking = ThinkingBlock()
        layout.addWidget(self.thinking)
        # (format, whether the prompt opened the block so the text starts as thinking), kept in the stats
        self._reasoning, self._inside = stored_format(stats) if role == "assistant" else (None, False)
        self._thinking_text, self._answer = self._split(text)
        self._think_started: float | None = None
        self.thinking_seconds: float | None = (stats or {}).get("thinking_seconds")
        self.body = AutoHeightBrowser()
        self.body.anchorClicked.connect(self._link_clicked)
        layout.addWidget(self.body)

        self.images = QHBoxLayout()
        self.num_images = 0
        for path in image_paths:
            self._add_image(path)
        self.images.addStretch()
        layout.addLayout(self.images)
        self.documents = DocumentsBlock()  # a user message's document chips, an answer's sources (from the stats)
        layout.addWidget(self.documents)

        self.stats_label = QLabel()
        self.stats_label.setObjectName("statsLabel")
        self.stats_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.stats_label)
        self.set_stats(stats or {})
        self._render()

    def _tool(self, text: str, tip: str, slot: Any = None) -> QToolButton:
        button = QToolButton(text=text)
        button.setToolTip(tip)
        button.setAutoRaise(True)
        if slot is not None:
            button.clicked.connect(slot)
        return button

    def _add_image(self, path: Path) -> None:
        pixmap = QPixmap(str(path))
        label = QLabel()
        label.setObjectName("messageImage")
        if pixmap.isNull():
            label.setText(f"[missing image {Path(path).name}]")
        else:
            label.setPixmap(
                pixmap.scaled(
                    QSize(160, 160), Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation
                )
            )
        label.setToolTip(str(path))
        self.images.addWidget(label)
        self.num_images += 1

    # --- content --------------------------------------------------------------------------------------------

    @property
    def text(self) -> str:
        return self._text

    def set_reasoning_format(self, fmt: Any, inside: bool = False) -> None:
        """How this answer marks its thinking (None: it does not think in tags); `inside`: its prompt opened
        the block, so the text begins as thinking (the R1 distills). A streaming answer's split comes with
        its text (set_text), so only a finished one is split again here."""
        self._reasoning, self._inside = fmt, inside
        if not self._streaming:
            self._thinking_text, self._answer = self._split(self._text)
        self._render()

    @property
    def thinking_text(self) -> str:
        """The thinking part of the text ("" when there is none)."""
        return self._thinking_text

    @property
    def answer_text(self) -> str:
        """The text without its thinking: what is shown as the answer, copied and exported as it."""
        return self._answer

    def set_text(self, text: str, thinking: str | None = None, answer: str | None = None) -> None:
        """Show `text`, split into `thinking` and `answer` as the backend streamed it (or here, once, when they
        are not given); while streaming the Markdown re-render is coalesced to RENDER_INTERVAL_MS."""
        self._text = text
        if thinking is None or answer is None:
            thinking, answer = self._split(text)
        self._thinking_text, self._answer = thinking, answer
        if self._streaming and self._reasoning is not None and self.thinking_seconds is None:
            self._time_thinking()
        if not self._streaming:
            self._render()
        elif not self._render_timer.isActive():
            self._render_timer.start()

    def set_prefill(self, read: int, total: int) -> None:
        """Say how much of a long prompt the model has read, in place of "…" until the answer's first text."""
        self._progress = f"Reading the conversation: {read:,} / {total:,} tokens"
        if self._streaming and not self._text:
            self._render()

    @property
    def progress_text(self) -> str:
        """What an answer with no text yet shows ("" for "…")."""
        return self._progress

    def set_streaming(self, streaming: bool) -> None:
        self._streaming = streaming
        if streaming:
            warm_up_code_highlighting()  # already started by the window, if there is one
        self.copy_button.setEnabled(not streaming)
        self._progress = ""
        if not streaming:
            # The last render waits its turn too: answers streamed side by side also end together.
            self._render_timer.stop()
            _RENDER_QUEUE.add(self)

    def set_stats(self, stats: dict[str, Any]) -> None:
        self.is_cut = self.role == "assistant" and cut_at_limit(stats)
        self.documents.set_stats(stats)
        line = format_stats(stats)
        self.stats_label.setText(line)
        self.stats_label.setVisible(bool(line))

    def set_actions(self, *, can_edit: bool, can_regenerate: bool, can_continue: bool = False) -> None:
        """Which buttons apply now; Continue shows only on an answer cut at its token limit."""
        self.edit_button.setVisible(self.role == "user")
        self.edit_button.setEnabled(can_edit)
        self.regenerate_button.setVisible(can_regenerate)
        self.continue_button.setVisible(can_continue and self.is_cut)

    def copy_text(self) -> None:
        QGuiApplication.clipboard().setText(self.answer_text)

    def _split(self, text: str) -> tuple[str, str]:
        """(thinking, answer) of a whole text; only an assistant's text with a reasoning format has thinking."""
        if self.role != "assistant" or self._reasoning is None or not text:
            return "", text
        return split(text, self._reasoning, self._inside)

    def _time_thinking(self) -> None:
        """Thinking runs from its first streamed text to the first text of the answer after it."""
        if self._think_started is None and self._thinking_text:
            self._think_started = time.monotonic()
        if self._think_started is not None and self._answer:
            self.thinking_seconds = time.monotonic() - self._think_started

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        if self._stale:
            self._render()

    def _render(self) -> None:
        self._stale = False
        started = time.perf_counter()
        if self.role == "user":
            self.body.setPlainText(self._text)  # what the user typed, exactly
        else:
            reasoning, answer = self._thinking_text, self._answer
            thinking = self._streaming and self._think_started is not None and self.thinking_seconds is None
            self.thinking.set_reasoning(reasoning, thinking, self.thinking_seconds)
            # Code blocks carry their own colours (pygments), so they are picked for the scheme in use.
            waiting = f"<i>{self._progress or '…'}</i>"
            self.body.setHtml(markdown_to_html(answer, dark=is_dark()) or ("" if reasoning else waiting))
        # Rendering the whole text grows with it: space the next streaming render so it takes RENDER_SHARE.
        spent_ms = (time.perf_counter() - started) * 1000
        self._render_timer.setInterval(max(RENDER_INTERVAL_MS, math.ceil(spent_ms / RENDER_SHARE)))

    def _link_clicked(self, url: QUrl) -> None:
        if url.scheme() == COPY_CODE_SCHEME:
            blocks = code_blocks(self.answer_text)
            index = int(url.path() or 0)
            if 0 <= index < len(blocks):
                QGuiApplication.clipboard().setText(blocks[index])
        elif url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)


class MessageView(QScrollArea):
    """A scrolling column of MessageWidgets that follows new text while it is scrolled to the bottom."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setObjectName("messageView")
        inner = QWidget()
        inner.setObjectName("messageColumn")
        self._layout = QVBoxLayout(inner)
        self._layout.setContentsMargins(12, 12, 12, 12)
        self._layout.setSpacing(10)
        self._layout.addStretch()
        self.setWidget(inner)
        self._follow = True
        self.divider: ContextDivider | None = None  # above the first message the model still sees, when any
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(lambda value: setattr(self, "_follow", value >= bar.maximum() - 8))
        bar.rangeChanged.connect(lambda _lo, hi: self._follow and bar.setValue(hi))

    def add_message(self, widget: MessageWidget) -> MessageWidget:
        self._layout.insertWidget(self._layout.count() - 1, widget)
        self._follow = True
        return widget

    def message_widgets(self) -> list[MessageWidget]:
        items = (self._layout.itemAt(i).widget() for i in range(self._layout.count()))
        return [w for w in items if isinstance(w, MessageWidget)]

    def remove_from(self, message_id: int) -> None:
        """Remove the widget of `message_id` and every later one (edit-and-resend, regenerate)."""
        found = False
        for widget in self.message_widgets():
            found = found or widget.message_id == message_id
            if found:
                if self.divider_before() == widget.message_id:
                    self.set_view_start(None)
                self._layout.removeWidget(widget)
                widget.deleteLater()

    def clear(self) -> None:
        self.set_view_start(None)
        for widget in self.message_widgets():
            self._layout.removeWidget(widget)
            widget.deleteLater()

    def set_view_start(self, message_id: int | None) -> None:
        """Put the "no longer seen" divider above the message `message_id` (None, or one not shown: none)."""
        target = next((w for w in self.message_widgets() if w.message_id == message_id), None)
        if target is None:
            if self.divider is not None:
                self._layout.removeWidget(self.divider)
                self.divider.deleteLater()
                self.divider = None
            return
        if self.divider is None:
            self.divider = ContextDivider()
        else:
            self._layout.removeWidget(self.divider)
        self._layout.insertWidget(self._layout.indexOf(target), self.divider)

    def divider_before(self) -> int | None:
        """The message id the divider sits above (None: no divider)."""
        if self.divider is None:
            return None
        item = self._layout.itemAt(self._layout.indexOf(self.divider) + 1)
        widget = item.widget() if item is not None else None
        return widget.message_id if isinstance(widget, MessageWidget) else None
