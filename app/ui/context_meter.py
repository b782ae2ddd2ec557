"""The context meter: how much of the model's context a chat takes.

Counted by the backend on a prompt worker (rendering the chat template may take seconds), or moved on as an
answer streams; only the newest count is shown. Hidden when the backend cannot count (a remote server).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import shiboken6
from PySide6.QtWidgets import QProgressBar

from app.service.backend import Backend
from app.service.workers import PROMPT, in_worker
from app.ui.tasks import spawn

log = logging.getLogger(__name__)


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

    def show_no_model(self) -> None:
        self._request += 1
        self.show()
        self.setRange(0, 1)
        self.setValue(0)
        self.setFormat("context: no model loaded")

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
        self.setFormat("context: %v / %m tokens")
        self.setRange(0, context)
        self.setValue(min(used, context))
