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
from pathlib import Path

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
    QScrollArea,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.service.backend import Backend
from app.service.generation import COMPARE_MAX_NEW_TOKENS, GenerationSettings
from app.ui.compare_column import ColumnAnswer, CompareColumn
from app.ui.tasks import spawn
from app.ui.theme import mark

log = logging.getLogger(__name__)

MIN_COLUMNS, MAX_COLUMNS = 2, 4


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
        self._jobs: list[ColumnAnswer] = []  # the running columns' answers, from the moment they are asked for
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
        # Folded columns shrink to share the window (their summary lines cut short); unfolded settings keep the
        # width they need, and on a narrow screen the columns then scroll instead of widening the window past it.
        self.columns_area = QScrollArea()
        self.columns_area.setWidgetResizable(True)
        self.columns_area.setFrameShape(QFrame.Shape.NoFrame)
        self.columns_area.setWidget(self.splitter)
        layout.addWidget(self.columns_area, 1)
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
        presets = self.store.presets.all()
        while len(self.columns) < count:
            column = CompareColumn(len(self.columns), self.store)
            column.settings_section.toggle.setMinimumWidth(1)  # the summary line may be cut; its tooltip is whole
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

    def columns_width(self) -> int:
        """The window width that shows every column with its summary line whole (the window opens at it, or at
        the screen's width where that is less)."""
        margins = self.layout().contentsMargins()
        return self.splitter.sizeHint().width() + margins.left() + margins.right()

    def set_backend(self, backend: Backend) -> None:
        """Run the next comparison on `backend` (a running one ends on its own jobs)."""
        self.backend = backend

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
        answers: list[ColumnAnswer] = []
        for column, settings in plans:
            start = functools.partial(
                backend.start_answer, messages, system, [], settings, identifier=("compare", column.index)
            )
            answers.append(ColumnAnswer(start, after=answers[-1] if answers else None))
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
        try:
            if path.suffix.lower() == ".json":
                path.write_text(json.dumps(self.store.export.json(chat.id), indent=2, ensure_ascii=False), "utf-8")
            else:
                self.store.export.write_markdown(chat.id, path)  # with its images in a folder beside it
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
        mark(self.message_label, "error" if error else None)
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
