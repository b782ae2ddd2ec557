"""One column of the compare view: its settings, its streamed answer and its numbers; and ColumnAnswer, a
column's answer from the moment it is asked for (started in column order, so the first prefills the shared
prompt and the later ones reuse its pages)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QPlainTextEdit, QSplitter, QVBoxLayout, QWidget

from app.service.answer_stats import tokens_per_second
from app.service.backend import AnswerChunk, AnswerJob
from app.service.generation import COMPARE_MAX_NEW_TOKENS, complete_settings, sampler_part
from app.ui.collapsible_section import CollapsibleSection
from app.ui.sampler_panel import SamplerPanel
from app.ui.settings_summary import full_summary, summary
from app.ui.theme import mark

_EOS_WORDS = {"stop_token": "done", "stop_string": "stop string", "max_new_tokens": "length limit"}
# What a new column starts with besides its preset: the summary names a seed or a length only when it differs.
COLUMN_JOB_DEFAULTS = {"seed": 0, "max_new_tokens": COMPARE_MAX_NEW_TOKENS}
_OPEN_SIZES = [260, 340]  # settings above, answer below, when a column's settings are first unfolded


class CompareColumn(QFrame):
    """One column: its settings (a SamplerPanel), the streamed text, and the numbers of its last run.

    The settings start folded to one summary line (see app.ui.settings_summary) so the answer gets the column's
    height; a click on the line unfolds the panel above the answer, with a handle between them to drag.
    """

    def __init__(self, index: int, store, parent: QWidget | None = None):
        super().__init__(parent)
        self.index = index
        self.store = store
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.title = QLabel(f"<b>Column {index + 1}</b>")
        self.panel = SamplerPanel(store)
        self.settings_section = CollapsibleSection("", self.panel)
        self.settings_section.toggle.setObjectName("settingsSummary")
        self._open_sizes = list(_OPEN_SIZES)
        self.output = QPlainTextEdit()
        self.output.setReadOnly(True)
        self.output.setPlaceholderText("The answer streams here.")
        self.stats_label = QLabel("—")
        self.stats_label.setWordWrap(True)
        self.stats_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # Settings above, answer below; the user drags the handle to see more of either.
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.addWidget(self.settings_section)
        self.splitter.addWidget(self.output)
        self.splitter.setSizes(self._open_sizes)
        self.panel.settings_changed.connect(lambda _settings: self._show_preset())
        self.settings_section.toggled.connect(self._fold)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.title)
        layout.addWidget(self.splitter, 1)
        layout.addWidget(self.stats_label)
        self.reset()
        self._fold(False)

    def reset(self) -> None:
        self.text = ""
        self.stats: dict[str, Any] = {}
        self.run_settings: dict[str, Any] = {}  # what the last run used, seed resolved
        self.num_tokens = 0
        self.first_token_at: float | None = None  # perf_counter on the GUI thread, for the live tok/s
        self.last_token_at: float | None = None
        self.complete = False
        self.error: str | None = None

    # --- settings ------------------------------------------------------------------------------------------

    def settings(self) -> dict:
        """The panel's settings dict: every sampler field, "seed" (None = random) and "max_new_tokens"."""
        return self.panel.settings()

    def set_settings(self, settings: dict) -> None:
        """Show a settings dict (a preset's or a saved column's); missing fields take the defaults."""
        values = complete_settings(settings)
        if "seed" not in settings:
            values["seed"] = self.panel.settings()["seed"]
        if "max_new_tokens" not in settings:
            values["max_new_tokens"] = self.panel.settings()["max_new_tokens"]
        self.panel.set_settings(values)
        self._show_preset()

    def preset_name(self) -> str:
        """The preset whose sampler fields equal this column's, or "custom"."""
        mine = sampler_part(self.settings())
        for preset in self.store.presets.all():
            if sampler_part(preset.settings) == mine:
                return preset.name
        return "custom"

    def _show_preset(self) -> None:
        # The panel's combo is a chooser; here it also tells which preset a column runs, as the summary does.
        name = self.preset_name()
        combo = self.panel.preset_combo
        combo.setCurrentIndex(max(0, combo.findData(name)))
        preset = None if name == "custom" else name
        settings = self.settings()
        self.settings_section.set_title(summary(settings, preset, COLUMN_JOB_DEFAULTS))
        self.settings_section.toggle.setToolTip(
            full_summary(settings, preset, COLUMN_JOB_DEFAULTS) + "\n\nClick to show or hide this column's settings"
        )

    def is_folded(self) -> bool:
        return not self.settings_section.is_open

    def set_folded(self, folded: bool) -> None:
        """Fold the settings to their summary line (as a click on it does) or unfold them."""
        self.settings_section.set_open(not folded)

    def _fold(self, is_open: bool) -> None:
        # A splitter keeps a hidden panel's share of the height for it: the folded section is held to its line's
        # height so the answer takes the rest, and the sizes the user dragged to come back on unfolding.
        if is_open:
            self.settings_section.setMaximumHeight(16777215)  # QWIDGETSIZE_MAX: no limit
            self.splitter.setSizes(self._open_sizes)
        else:
            if self.splitter.sizes()[0] > self.settings_section.toggle.sizeHint().height():
                self._open_sizes = self.splitter.sizes()
            self.settings_section.setMaximumHeight(self.settings_section.toggle.sizeHint().height())
        self.splitter.handle(1).setEnabled(is_open)
        self._show_preset()  # a preset saved while unfolded may now be the column's name

    # --- a run ---------------------------------------------------------------------------------------------

    def begin(self, run_settings: dict) -> None:
        self.reset()
        self.run_settings = run_settings
        self.output.clear()
        mark(self.stats_label, None)
        self.stats_label.setText(f"seed {run_settings.get('seed')} · waiting for the prompt…")

    def add_result(self, chunk: AnswerChunk) -> None:
        """Take one chunk of the answer: append its text, count its tokens, refresh the live numbers."""
        text = chunk["text"]
        n = chunk["num_tokens"]
        now = time.perf_counter()
        if n:
            if self.first_token_at is None:
                self.first_token_at = now
            self.last_token_at = now
        self.num_tokens += n
        if text:
            self.text += text
            cursor = self.output.textCursor()
            cursor.movePosition(cursor.MoveOperation.End)
            cursor.insertText(text)
            self.output.setTextCursor(cursor)
        elapsed = now - self.first_token_at if self.first_token_at is not None else 0.0
        live = tokens_per_second(self.num_tokens, elapsed)
        rate = f"{live:.1f} tok/s · " if live is not None else ""
        self.stats_label.setText(f"{rate}{self.num_tokens} tokens · streaming")

    def finish(self, chunk: AnswerChunk) -> None:
        """The answer's last chunk: keep its numbers for this column."""
        generate_s = float(chunk.get("time_generate", 0.0))
        new_tokens = int(chunk.get("new_tokens", self.num_tokens))
        self.stats = {
            "new_tokens": new_tokens,
            "prompt_tokens": int(chunk.get("prompt_tokens", 0)),
            "cached_tokens": int(chunk.get("cached_tokens", 0)),
            "tokens_per_second": tokens_per_second(new_tokens, generate_s),
            "time_prefill": float(chunk.get("time_prefill", 0.0)),
            "time_generate": generate_s,
            "eos_reason": chunk.get("eos_reason"),
        }
        self.complete = True
        self._show_stats()

    def stopped(self) -> None:
        """The job ended without a final result: Stop, a model switch, or the service closing."""
        self.stats = {"new_tokens": self.num_tokens, "eos_reason": "stopped"}
        self._show_stats()

    def fail(self, message: str) -> None:
        self.error = message
        self.stats = {"new_tokens": self.num_tokens, "error": message}
        mark(self.stats_label, "error")
        self.stats_label.setText(message)

    def show_saved(self, text: str, settings: dict, stats: dict, complete: bool) -> None:
        """Show a column of a saved comparison."""
        self.reset()
        self.text, self.stats, self.run_settings, self.complete = text, dict(stats), dict(settings), complete
        self.num_tokens = int(stats.get("new_tokens", 0))
        self.output.setPlainText(text)
        self.set_settings(settings)
        self._show_stats()

    def _show_stats(self) -> None:
        s = self.stats
        parts = []
        if s.get("tokens_per_second"):
            parts.append(f"{s['tokens_per_second']:.1f} tok/s")
        parts.append(f"{s.get('new_tokens', 0)} tokens")
        if "cached_tokens" in s:
            parts.append(f"{s['cached_tokens']} of {s.get('prompt_tokens', 0)} prompt tokens cached")
        parts.append(f"seed {self.run_settings.get('seed')}")
        if s.get("eos_reason"):
            parts.append(_EOS_WORDS.get(s["eos_reason"], str(s["eos_reason"])))
        mark(self.stats_label, None)
        self.stats_label.setText(" · ".join(parts))


class ColumnAnswer:
    """One column's answer from the moment it is asked for: `started` (the backend building the prompt off
    the GUI thread, then starting the job) resolves to its AnswerJob; `cancel()` stops it at either stage.

    It starts once the column before it (`after`) has: the jobs reach the engine in column order, so the
    first column prefills the shared prompt and the later ones find its pages (their `cached_tokens`).
    """

    def __init__(self, start: Callable[[], Coroutine[Any, Any, AnswerJob]], after: ColumnAnswer | None = None):
        self.started: asyncio.Task[AnswerJob] = asyncio.ensure_future(self._start(start, after))

    @staticmethod
    async def _start(start: Callable[[], Coroutine[Any, Any, AnswerJob]], after: ColumnAnswer | None) -> AnswerJob:
        if after is not None:
            await asyncio.wait({after.started})  # its outcome is its own; this column starts either way
        return await start()

    async def cancel(self) -> None:
        if not self.started.done():
            self.started.cancel()
        try:
            job = await self.started
        except BaseException:  # cancelled or never started: nothing runs
            return
        await job.cancel()
