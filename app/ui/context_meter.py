"""The context meter: how much of the model's context a chat takes.

Counted by the backend on a prompt worker (rendering the chat template may take seconds), the message being
typed included (a moment after the last keystroke), or moved on as an answer streams; only the newest count is
shown. Its "level" property ("ok", "near", "full") colours it in the stylesheet; "full" under the stop policy
says the message will not fit before it is sent. Hidden when the backend cannot count (a remote server).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import shiboken6
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QPlainTextEdit, QProgressBar

from app.service.backend import Backend
from app.service.workers import PROMPT, in_worker
from app.ui.tasks import spawn

log = logging.getLogger(__name__)

NEAR_LIMIT = 0.85  # the share of the context from which the meter warns
DRAFT_COUNT_MS = 400  # a typed message is counted this long after the last keystroke
TOO_LONG = "too long for the context: shorten it, or let the chat drop old turns (its context-overflow setting)"


class ContextMeter(QProgressBar):
    """A progress bar of tokens used out of the backend's context."""

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("contextMeter")
        self.setTextVisible(True)
        self.setFormat("context: %v / %m tokens")
        self.setRange(0, 1)
        self.setValue(0)
        self._request = 0  # numbers counts: only the newest one is shown
        self.counted: int | None = 0  # the newest count shown (None: the backend cannot count)
        self.stops_at_limit = False  # the chat's overflow policy is "stop": a conversation past the context is refused
        self.setProperty("level", "ok")
        self._draft_timer = QTimer(self)
        self._draft_timer.setSingleShot(True)
        self._draft_timer.setInterval(DRAFT_COUNT_MS)

    def follow(self, edit: QPlainTextEdit, recount: Callable[[], object]) -> None:
        """Count again (`recount`) a moment after each edit of `edit`, the message being typed."""
        edit.textChanged.connect(self._draft_timer.start)
        self._draft_timer.timeout.connect(recount)

    @property
    def level(self) -> str:
        """The meter's colour: "ok", "near" (from NEAR_LIMIT of the context) or "full" (the context is used up)."""
        return str(self.property("level"))

    @property
    def will_not_fit(self) -> bool:
        """The conversation and the message being typed fill the context and the chat stops there."""
        return self.stops_at_limit and self.level == "full"

    def show_no_model(self) -> None:
        self._request += 1
        self.show()
        self.setRange(0, 1)
        self.setValue(0)
        self.setFormat("context: no model loaded")
        self._set_level("ok")

    def count(
        self, backend: Backend, messages: Sequence[Mapping[str, Any]], system_prompt: str, pictures: list[Path]
    ) -> asyncio.Task:
        """Count the conversation's tokens on a prompt worker (pictures: their headers decide their count)."""
        self._request += 1
        return spawn(self._count(self._request, backend, messages, system_prompt, pictures), name="count")

    async def _count(
        self,
        request: int,
        backend: Backend,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str,
        pictures: list[Path],
    ) -> None:
        count = backend.count_tokens
        try:
            used = await in_worker(lambda: count(messages, system_prompt, image_sources=pictures), pool=PROMPT)
        except Exception as e:  # shown, not raised: the meter must never break the tab
            log.warning("cannot count tokens: %s", e)
            return
        # Shown only if nothing newer was counted or streamed meanwhile, and the meter still exists.
        if request == self._request and shiboken6.isValid(self):
            self.counted = used
            if used is None:  # the backend cannot count: no meter rather than a wrong one
                self.hide()
            else:
                self.show_used(used, backend.context_length)

    def show_used(self, used: int, context: int) -> None:
        """Show `used` tokens of `context` now (a count still on its way is older than this)."""
        self._request += 1
        context = max(1, int(context))
        self.show()
        self.setRange(0, context)
        self.setValue(min(used, context))
        self._set_level("full" if used >= context else "near" if used >= NEAR_LIMIT * context else "ok")
        text = f"context: {used:,} / {context:,} tokens"  # the real count, also past the bar's end
        self.setFormat(f"{text}, {TOO_LONG}" if self.will_not_fit else text)
        self.setToolTip(TOO_LONG if self.will_not_fit else "")

    def _set_level(self, level: str) -> None:
        if self.property("level") != level:
            self.setProperty("level", level)
            self.style().unpolish(self)  # a dynamic property's stylesheet rule applies once re-polished
            self.style().polish(self)
