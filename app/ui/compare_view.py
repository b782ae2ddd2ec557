"""The compare view: one prompt, 2 to 4 columns, each with its own sampler settings and seed.

Run asks the view's backend (app.service.backend: the local engine or a remote server) for every column's
answer at once, so they reach the engine together: the generator prefills the shared prompt pages once and
the later columns reuse them (they report `cached_tokens`). Each column then streams its own
`async for result in job` on the GUI loop. `set_backend` hands the view another backend for the next run.

    prompt ──┬─ start_answer(prompt, column 0 GenerationSettings) ──> column 0 text + stats
             ├─ start_answer(prompt, column 1 GenerationSettings) ──> column 1 text + stats
             └─ ... up to 4 columns, all decoding in the same batch
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.service.answer_stats import tokens_per_second
from app.service.backend import AnswerJob, Backend
from app.service.generation import COMPARE_MAX_NEW_TOKENS, GenerationSettings, complete_settings, sampler_part
from app.ui.sampler_panel import SamplerPanel
from app.ui.tasks import spawn

log = logging.getLogger(__name__)

MIN_COLUMNS, MAX_COLUMNS = 2, 4
_ERROR_STYLE = "color: #b00020;"
_EOS_WORDS = {"stop_token": "done", "stop_string": "stop string", "max_new_tokens": "length limit"}


class CompareColumn(QFrame):
    """One column: its settings (a SamplerPanel), the streamed text, and the numbers of its last run."""

    def __init__(self, index: int, store, parent: QWidget | None = None):
        super().__init__(parent)
        self.index = index
        self.store = store
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.title = QLabel(f"<b>Column {index + 1}</b>")
        self.panel = SamplerPanel(store)
        self.output = QPlainTextEdit()
        self.output.setReadOnly(True)
        self.output.setPlaceholderText("The answer streams here.")
        self.stats_label = QLabel("—")
        self.stats_label.setWordWrap(True)
        self.stats_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # Settings above, answer below; the user drags the handle to see more of either.
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.addWidget(self.panel)
        self.splitter.addWidget(self.output)
        self.splitter.setSizes([260, 340])
        self.panel.settings_changed.connect(lambda _settings: self._show_preset())
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.title)
        layout.addWidget(self.splitter, 1)
        layout.addWidget(self.stats_label)
        self.reset()

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
        for preset in self.store.list_presets():
            if sampler_part(preset.settings) == mine:
                return preset.name
        return "custom"

    def _show_preset(self) -> None:
        # The panel's combo is a chooser; here it also tells which preset a column runs.
        combo = self.panel.preset_combo
        combo.setCurrentIndex(max(0, combo.findData(self.preset_name())))

    # --- a run ---------------------------------------------------------------------------------------------

    def begin(self, run_settings: dict) -> None:
        self.reset()
        self.run_settings = run_settings
        self.output.clear()
        self.stats_label.setStyleSheet("")
        self.stats_label.setText(f"seed {run_settings.get('seed')} · waiting for the prompt…")

    def add_result(self, result: dict) -> None:
        """Take one streaming result: append its text, count its tokens, refresh the live numbers."""
        text = result.get("text", "")
        ids = result.get("token_ids")
        n = int(ids.shape[-1]) if ids is not None else 0
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

    def finish(self, result: dict) -> None:
        """The job's last result: keep the engine's numbers for this column."""
        generate_s = float(result.get("time_generate", 0.0))
        new_tokens = int(result.get("new_tokens", self.num_tokens))
        self.stats = {
            "new_tokens": new_tokens,
            "prompt_tokens": int(result.get("prompt_tokens", 0)),
            "cached_tokens": int(result.get("cached_tokens", 0)),
            "tokens_per_second": tokens_per_second(new_tokens, generate_s),
            "time_prefill": float(result.get("time_prefill", 0.0)),
            "time_generate": generate_s,
            "eos_reason": result.get("eos_reason"),
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
        self.stats_label.setStyleSheet(_ERROR_STYLE)
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
        self.stats_label.setStyleSheet("")
        self.stats_label.setText(" · ".join(parts))


class _Answer:
    """One column's answer from the moment it is asked for: `started` (the backend building the prompt off
    the GUI thread, then starting the job) resolves to its AnswerJob; `cancel()` stops it at either stage.

    It starts once the column before it (`after`) has: the jobs reach the engine in column order, so the
    first column prefills the shared prompt and the later ones find its pages (their `cached_tokens`).
    """

    def __init__(self, start: Callable[[], Coroutine[Any, Any, AnswerJob]], after: _Answer | None = None):
        self.started: asyncio.Task[AnswerJob] = asyncio.ensure_future(self._start(start, after))

    @staticmethod
    async def _start(start: Callable[[], Coroutine[Any, Any, AnswerJob]], after: _Answer | None) -> AnswerJob:
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


class CompareView(QWidget):
    """Runs one prompt under 2 to 4 settings side by side; saves the comparison to history and exports it.

    Driven by its buttons, or directly: `set_prompt`, `set_column_count`, `columns[i].set_settings`,
    `await run()`, `await stop()`, `save_to_history()`, `export(path)`, `open_comparison(chat_id)`.
    """

    run_finished = Signal()
    saved = Signal(int)  # chat id of the saved comparison

    def __init__(self, store, backend: Backend, parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        self.backend = backend  # read afresh for every run: set_backend switches it
        self.columns: list[CompareColumn] = []
        self._jobs: list[_Answer] = []  # the running columns' answers, from the moment they are asked for
        self._task: asyncio.Task | None = None
        self._saved_chat_id: int | None = None
        self._run_prompt: tuple[str, str] | None = None  # (prompt, system prompt) of the results shown
        self.setWindowTitle("Compare")

        self.prompt_edit = QPlainTextEdit()
        self.prompt_edit.setPlaceholderText("One prompt, answered by every column")
        self.prompt_edit.setMaximumHeight(100)
        self.system_edit = QLineEdit()
        self.system_edit.setPlaceholderText("System prompt (optional)")
        self.columns_spin = QSpinBox()
        self.columns_spin.setRange(MIN_COLUMNS, MAX_COLUMNS)
        self.columns_spin.setValue(3)
        self.columns_spin.valueChanged.connect(self.set_column_count)
        self.saved_combo = QComboBox()
        self.saved_combo.setToolTip("Open a comparison saved earlier")
        self.saved_combo.activated.connect(self._saved_chosen)
        self.run_button = QPushButton("Run")
        self.run_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.save_button = QPushButton("Save to history")
        self.export_button = QPushButton("Export…")
        self.run_button.clicked.connect(self.start)
        self.stop_button.clicked.connect(lambda: spawn(self.stop(), name="compare-stop"))
        self.save_button.clicked.connect(self.save_to_history)
        self.export_button.clicked.connect(self._choose_export)
        self.message_label = QLabel()
        self.message_label.setWordWrap(True)

        bar = QHBoxLayout()
        bar.addWidget(QLabel("Columns"))
        bar.addWidget(self.columns_spin)
        bar.addWidget(self.saved_combo, 1)
        bar.addStretch(1)
        for b in (self.run_button, self.stop_button, self.save_button, self.export_button):
            bar.addWidget(b)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setChildrenCollapsible(False)
        layout = QVBoxLayout(self)
        layout.addWidget(self.prompt_edit)
        layout.addWidget(self.system_edit)
        layout.addLayout(bar)
        layout.addWidget(self.message_label)
        layout.addWidget(self.splitter, 1)
        self.set_column_count(self.columns_spin.value())
        self.reload_saved()
        self._update_buttons()

    # --- columns -------------------------------------------------------------------------------------------

    def set_column_count(self, count: int) -> None:
        """Show `count` columns (2..4); a new column starts from the next preset, with a fixed seed 0."""
        if not MIN_COLUMNS <= count <= MAX_COLUMNS:
            raise ValueError(f"the compare view shows {MIN_COLUMNS} to {MAX_COLUMNS} columns, not {count}")
        if self.is_running():
            self.show_message("Stop the running comparison before changing the number of columns.")
            self.columns_spin.setValue(len(self.columns))
            return
        presets = self.store.list_presets()
        while len(self.columns) < count:
            column = CompareColumn(len(self.columns), self.store)
            # Fixed seeds by default: a comparison is about settings, and a re-run should repeat it.
            base = dict(presets[len(self.columns) % len(presets)].settings) if presets else {}
            column.set_settings({**base, "seed": 0, "max_new_tokens": COMPARE_MAX_NEW_TOKENS})
            self.columns.append(column)
            self.splitter.addWidget(column)
        while len(self.columns) > count:
            column = self.columns.pop()
            column.hide()
            column.deleteLater()  # the splitter owns it; Qt frees it once pending events are done
        if self.columns_spin.value() != count:
            self.columns_spin.setValue(count)

    def set_prompt(self, text: str, system_prompt: str = "") -> None:
        self.prompt_edit.setPlainText(text)
        self.system_edit.setText(system_prompt)
        self.system_edit.setCursorPosition(0)  # show how the system prompt starts, not how it ends

    def set_max_new_tokens(self, n: int) -> None:
        """Give every column the same answer length."""
        for column in self.columns:
            column.set_settings({**column.settings(), "max_new_tokens": n})

    # --- running -------------------------------------------------------------------------------------------

    def is_running(self) -> bool:
        return bool(self._jobs)

    def start(self) -> asyncio.Task | None:
        """The Run button: start `run()` on the event loop and return its task."""
        if self.is_running():
            return None
        self._task = spawn(self.run(), name="compare-run")
        return self._task

    async def run(self) -> bool:
        """Run every column on the prompt; returns True when all of them finished normally."""
        if self.is_running():
            self.show_message("A comparison is already running.")
            return False
        prompt, system = self.prompt_edit.toPlainText(), self.system_edit.text()
        if not prompt.strip():
            self.show_message("Write a prompt first.", error=True)
            return False
        backend = self.backend
        if not backend.is_loaded:
            self.show_message("No model is loaded yet. Open the model manager to load one.", error=True)
            return False
        plans = []
        for column in self.columns:
            try:
                # A random seed is drawn here and recorded, so a saved run can be repeated exactly.
                plans.append((column, GenerationSettings.from_dict(column.settings()).seeded()))
            except ValueError as e:
                self.show_message(f"Column {column.index + 1}: {e}", error=True)
                return False
            context = backend.context_length  # 0: unknown (a server that does not say)
            if context and plans[-1][1].max_new_tokens >= context:
                # A backend caps an answer to the room its prompt leaves; a comparison whose columns would be
                # cut at different lengths compares nothing, so the view refuses it instead.
                self.show_message(
                    f"Column {column.index + 1}: {plans[-1][1].max_new_tokens} answer tokens do not fit the model's "
                    f"context of {context} tokens with the prompt; lower Max answer tokens.",
                    error=True,
                )
                return False
        messages = [{"role": "user", "content": prompt}]
        # Ask for every answer before awaiting any (each column starts after the one before): the first
        # prefills the shared prompt, the later ones reuse its pages.
        answers: list[_Answer] = []
        for column, settings in plans:
            start = functools.partial(
                backend.start_answer, messages, system, [], settings, identifier=("compare", column.index)
            )
            answers.append(_Answer(start, after=answers[-1] if answers else None))
        self._jobs = answers
        self._update_buttons()
        started = await asyncio.gather(*(answer.started for answer in answers), return_exceptions=True)
        failed = next(((i, e) for i, e in enumerate(started) if isinstance(e, BaseException)), None)
        if failed is not None:  # stopped, a template error or a prompt that can never fit: nothing runs
            await asyncio.gather(*(answer.cancel() for answer in answers), return_exceptions=True)
            self._jobs = []
            self._update_buttons()
            index, error = failed
            if not isinstance(error, asyncio.CancelledError):
                self.show_message(f"Column {index + 1}: could not start: {error}", error=True)
            return False
        jobs = list(started)
        self._saved_chat_id = None
        self._run_prompt = (prompt, system)
        self.show_message("")
        for column, settings in plans:
            column.begin(settings.to_dict())
        self._update_buttons()
        try:
            outcomes = await asyncio.gather(*(self._stream(c, job) for (c, _), job in zip(plans, jobs)))
        finally:
            self._jobs = []
            self._update_buttons()
            self.run_finished.emit()
        return all(outcomes)

    async def _stream(self, column: CompareColumn, job) -> bool:
        try:
            async for result in job:
                if result.get("stage") == "streaming":
                    column.add_result(result)
                if result.get("eos"):
                    column.finish(result)
        except Exception as e:  # one column's failure must not stop the others
            log.warning("compare column %d failed: %s", column.index + 1, e)
            column.fail(str(e))
            return False
        if not column.complete:
            column.stopped()
        return column.complete

    async def stop(self) -> None:
        """Cancel every running column; what they wrote so far stays."""
        await asyncio.gather(*(answer.cancel() for answer in list(self._jobs)), return_exceptions=True)

    # --- history and export --------------------------------------------------------------------------------

    def save_to_history(self):
        """Save the comparison shown as a chat of kind "compare", one message per column; returns the Chat."""
        if self._run_prompt is None:
            self.show_message("Run a comparison first; there is nothing to save yet.")
            return None
        if self.is_running():
            self.show_message("Wait for the comparison to finish (or stop it) before saving.")
            return None
        if self._saved_chat_id is not None:
            return self.store.get_chat(self._saved_chat_id)
        prompt, system = self._run_prompt
        first_line = prompt.strip().splitlines()[0]
        title = "Compare: " + (first_line[:48] + "…" if len(first_line) > 48 else first_line)
        chat = self.store.create_chat(title=title, system_prompt=system, settings={}, kind="compare")
        if self.backend.name:
            self.store.update_chat(chat.id, model=self.backend.name)
        self.store.add_message(chat.id, "user", prompt)
        for column in self.columns:
            stats = {**column.stats, "preset": column.preset_name(), "seed": column.run_settings.get("seed")}
            self.store.add_message(
                chat.id,
                "assistant",
                column.text,
                stats=stats,
                settings=column.run_settings,
                column=column.index,
                complete=column.complete,
            )
        self._saved_chat_id = chat.id
        self.show_message(f"Saved to history as “{title}”.")
        self.reload_saved()
        self.saved.emit(chat.id)
        return self.store.get_chat(chat.id)

    def export(self, path: str | Path) -> Path | None:
        """Write the comparison as Markdown (.md) or JSON (.json), saving it to history first if needed."""
        path = Path(path)
        if path.suffix.lower() not in (".md", ".markdown", ".json"):
            self.show_message(f"{path.name}: export as .md (Markdown) or .json.", error=True)
            return None
        chat = self.save_to_history()
        if chat is None:
            return None
        if path.suffix.lower() == ".json":
            text = json.dumps(self.store.export_json(chat.id), indent=2, ensure_ascii=False)
        else:
            text = self.store.export_markdown(chat.id)
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as e:
            self.show_message(f"Could not write {path}: {e.strerror or e}. Choose another folder.", error=True)
            return None
        self.show_message(f"Exported to {path}.")
        return path

    def _choose_export(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Export comparison", "comparison.md", "Markdown (*.md);;JSON (*.json)"
        )
        if path:
            self.export(path)

    def reload_saved(self) -> None:
        """Refill the list of saved comparisons (the sidebar lists plain chats only)."""
        self.saved_combo.clear()
        self.saved_combo.addItem("Open a saved comparison…", None)
        for chat in self.store.list_chats():
            if chat.kind == "compare":
                self.saved_combo.addItem(chat.title, chat.id)

    def _saved_chosen(self, index: int) -> None:
        chat_id = self.saved_combo.itemData(index)
        if chat_id is not None:
            self.open_comparison(chat_id)
        self.saved_combo.setCurrentIndex(0)

    def open_comparison(self, chat_id: int) -> None:
        """Show a saved comparison: its prompt and each column's settings, text and numbers."""
        if self.is_running():
            self.show_message("Stop the running comparison first.")
            return
        chat = self.store.get_chat(chat_id)
        messages = self.store.messages(chat_id)
        prompt = next((m.text for m in messages if m.role == "user"), "")
        answers = sorted((m for m in messages if m.column is not None), key=lambda m: m.column)[:MAX_COLUMNS]
        self.set_column_count(max(MIN_COLUMNS, len(answers)))
        self.set_prompt(prompt, chat.system_prompt)
        for i, m in enumerate(answers):
            self.columns[i].show_saved(m.text, m.settings, m.stats, m.complete)
        self._run_prompt = (prompt, chat.system_prompt)
        self._saved_chat_id = chat_id
        self.show_message(f"Showing “{chat.title}”. Run repeats it with the same seeds.")
        self._update_buttons()

    # --- state ---------------------------------------------------------------------------------------------

    def show_message(self, text: str, error: bool = False) -> None:
        if text:
            log.info("compare view: %s", text)
        self.message_label.setStyleSheet(_ERROR_STYLE if error else "")
        self.message_label.setText(text)

    def _update_buttons(self) -> None:
        running = self.is_running()
        has_results = self._run_prompt is not None
        self.run_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        self.columns_spin.setEnabled(not running)
        self.saved_combo.setEnabled(not running)
        self.save_button.setEnabled(not running and has_results)
        self.export_button.setEnabled(not running and has_results)
        for column in self.columns:
            column.panel.setEnabled(not running)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt's name)
        if self.is_running():
            spawn(self.stop(), name="compare-stop-on-close")
        super().closeEvent(event)
