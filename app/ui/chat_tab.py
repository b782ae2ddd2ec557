"""ChatTab: one conversation — its messages, system prompt, settings, attachments, and its own streaming job.

A send stores the user message, then hands the conversation, its image files and the chat's GenerationSettings
to the tab's backend (`backend.start_answer`, the app.service.backend protocol: the local engine or a remote
server), whose results arrive with `async for` on the GUI loop; every tab runs its own, so several stream at
once. The answer is stored as soon as it starts (complete=False), saved every second while it streams, and once
more when it ends or is stopped. With "JSON mode" on (saved in the chat's settings dict as "json_mode"), every
answer is held to one JSON object. `set_backend` hands the tab another backend; the next answer uses it.

The backend builds the prompt off the GUI thread, and the context meter counts on a worker thread
(app.service.workers): a chat template is the model's own code, and a hostile one runs for up to its time limit
(engine.chat_template.RENDER_SECONDS) before it fails, which must not freeze the window. Its error is shown
above the input like any other reason an answer could not start.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import shiboken6
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QImage
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.service.answer_stats import eos_stats
from app.service.backend import (
    AnswerJob,
    Backend,
    ChatTemplateError,
    ContextFull,
    ImageError,
    ModelSwapped,
    user_message,
)
from app.service.generation import GenerationSettings, complete_settings, has_json_mode, with_json_mode
from app.service.workers import PROMPT, in_worker
from app.store import StoreError
from app.ui.answer_saves import RETRY_INTERVAL_MS, PendingSaves
from app.ui.attachments import (
    IMAGE_FILE_FILTER,
    AttachmentError,
    AttachmentStrip,
    load_image_file_async,
    load_qimage_async,
)
from app.ui.chat_input import ChatInput
from app.ui.message_view import MessageView, MessageWidget
from app.ui.tasks import spawn

log = logging.getLogger(__name__)

SAVE_INTERVAL_MS = 1000  # a streaming answer reaches the database at least this often
DEFAULT_TITLE = "New chat"
_TITLE_LENGTH = 48


@dataclass
class _Stream:
    """What one running answer has produced so far."""

    message_id: int
    widget: MessageWidget
    prompt_tokens: int  # the meter's last count until the backend says (None: it cannot count)
    json_mode: bool = False
    text: str = ""
    num_tokens: int = 0
    saved_text: str = ""
    eos: dict[str, Any] = field(default_factory=dict)


class ChatTab(QWidget):
    """One open chat. `send()` / `stop()` / `regenerate()` / `begin_edit()` drive it; signals tell the window."""

    title_changed = Signal(int, str)
    streaming_changed = Signal(int, bool)
    chat_changed = Signal(int)  # something was saved: the sidebar re-sorts
    chunk_received = Signal(int, str)
    generation_finished = Signal(int)
    save_interval_ms = SAVE_INTERVAL_MS
    save_retry_ms = RETRY_INTERVAL_MS  # a save the store refused is tried again this often

    def __init__(self, store: Any, backend: Backend, chat_id: int, parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        self.backend = backend  # read afresh for every answer and count: set_backend switches it
        self.chat = store.get_chat(chat_id)
        self.chat_id = chat_id
        self._job: Any = None
        self._task: asyncio.Task | None = None
        self._stream: _Stream | None = None
        self._stopping = False
        self._preparing = False  # images are being embedded or the prompt built before the answer's job starts
        self._meter_request = 0  # numbers context counts: only the newest one is shown
        self._counted: int | None = 0  # the newest count shown (None: the backend cannot count)
        self._editing_id: int | None = None
        self._num_attaching = 0
        self.setAcceptDrops(True)

        self._save_timer = QTimer(self)
        self._save_timer.timeout.connect(self._save_partial)
        self._saves = PendingSaves(store, self, self.save_retry_ms)  # saves the store refused (a full disk)
        self._saves.failed.connect(self._save_failed)
        self._saves.saved.connect(self._save_recovered)
        self._save_notice = ""
        self._system_timer = QTimer(self)
        self._system_timer.setSingleShot(True)
        self._system_timer.setInterval(400)
        self._system_timer.timeout.connect(self._save_system_prompt)

        self._build()
        self.reload()

    # --- layout ---------------------------------------------------------------------------------------------

    def _build(self) -> None:
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        self.system_prompt_edit = QPlainTextEdit(self.chat.system_prompt)
        self.system_prompt_edit.setObjectName("systemPrompt")
        self.system_prompt_edit.setPlaceholderText("System prompt for this chat (optional)")
        self.system_prompt_edit.setFixedHeight(self.fontMetrics().lineSpacing() * 2 + 14)
        self.system_prompt_edit.textChanged.connect(self._system_timer.start)
        layout.addWidget(self.system_prompt_edit)

        self.view = MessageView()
        layout.addWidget(self.view, 1)

        self.notice = QWidget()
        self.notice.setObjectName("notice")
        notice_row = QHBoxLayout(self.notice)
        notice_row.setContentsMargins(8, 4, 4, 4)
        self.notice_label = QLabel()
        self.notice_label.setObjectName("noticeLabel")
        self.notice_label.setWordWrap(True)
        notice_row.addWidget(self.notice_label, 1)
        close = QToolButton(text="✕")
        close.setAutoRaise(True)
        close.setToolTip("Dismiss")
        close.clicked.connect(self.clear_notice)
        notice_row.addWidget(close)
        self.notice.setVisible(False)
        layout.addWidget(self.notice)

        self.edit_bar = QWidget()
        edit_row = QHBoxLayout(self.edit_bar)
        edit_row.setContentsMargins(8, 0, 4, 0)
        edit_row.addWidget(QLabel("Editing an earlier message: sending replaces it and every message after it."), 1)
        cancel_edit = QPushButton("Cancel edit")
        cancel_edit.clicked.connect(self.cancel_edit)
        edit_row.addWidget(cancel_edit)
        self.edit_bar.setVisible(False)
        layout.addWidget(self.edit_bar)

        self.strip = AttachmentStrip()
        layout.addWidget(self.strip)

        self.input = ChatInput()
        self.input.setFixedHeight(self.fontMetrics().lineSpacing() * 4 + 16)
        self.input.send_requested.connect(self.send)
        self.input.image_pasted.connect(self.attach_image)
        self.input.files_dropped.connect(self.attach_files)
        self.json_mode_box = QCheckBox("JSON mode")
        self.json_mode_box.setObjectName("jsonMode")
        self.json_mode_box.setToolTip(
            "Answers in this chat are one JSON object: the engine allows only tokens that keep the answer "
            "valid JSON, and ends it when the object closes. Ask for the fields you want in your message. "
            "Saved with the chat."
        )
        self.json_mode_box.setChecked(self.json_mode)
        self.json_mode_box.toggled.connect(self.set_json_mode)
        # Beside the input rather than in the button row below, which sets the window's minimum width.
        input_row = QHBoxLayout()
        input_row.addWidget(self.input, 1)
        input_row.addWidget(self.json_mode_box, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(input_row)

        row = QHBoxLayout()
        self.attach_button = QPushButton("Attach image…")
        self.attach_button.clicked.connect(self._pick_files)
        row.addWidget(self.attach_button)
        self.context_meter = QProgressBar()
        self.context_meter.setObjectName("contextMeter")
        self.context_meter.setTextVisible(True)
        self.context_meter.setFormat("context: %v / %m tokens")
        self.context_meter.setRange(0, 1)
        self.context_meter.setValue(0)
        row.addWidget(self.context_meter, 1)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop the answer (Esc); what it wrote so far is kept")
        self.stop_button.clicked.connect(self.stop)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.send_button.setToolTip("Send (Enter)")
        self.send_button.clicked.connect(self.send)
        row.addWidget(self.stop_button)
        row.addWidget(self.send_button)
        layout.addLayout(row)
        self._update_controls()

    # --- state ----------------------------------------------------------------------------------------------

    def set_backend(self, backend: Backend) -> None:
        """Answer with `backend` from the next send on (an answer streaming now ends on its own job)."""
        self.backend = backend
        self.refresh_context_meter()

    @property
    def is_streaming(self) -> bool:
        """Whether an answer is on its way: its images being embedded, its prompt built, or its job streaming."""
        return self._job is not None or self._preparing

    @property
    def title(self) -> str:
        return self.chat.title

    @property
    def streamed_text(self) -> str:
        """The answer streaming now (empty when none)."""
        return self._stream.text if self._stream else ""

    def settings(self) -> dict[str, Any]:
        """The chat's sampler settings dict (every field, "seed", "max_new_tokens"; JSON mode is separate)."""
        return complete_settings(self.chat.settings)

    def set_settings(self, settings: dict[str, Any]) -> None:
        """Use and save `settings` for this chat's next answers; the chat keeps its JSON mode."""
        self.store.update_chat(self.chat_id, settings=with_json_mode(settings, self.json_mode))
        self.chat = self.store.get_chat(self.chat_id)

    @property
    def json_mode(self) -> bool:
        """Whether this chat's answers are held to one JSON object."""
        return has_json_mode(self.chat.settings)

    def set_json_mode(self, on: bool) -> None:
        """Turn JSON mode on or off for this chat's next answers and save it with the chat."""
        on = bool(on)
        if on != self.json_mode:
            self.store.update_chat(self.chat_id, settings=with_json_mode(self.chat.settings, on))
            self.chat = self.store.get_chat(self.chat_id)
        if self.json_mode_box.isChecked() != on:
            self.json_mode_box.setChecked(on)  # called from code: keep the box in step

    def rename(self, title: str) -> None:
        title = " ".join(title.split())
        if not title:
            return
        self.store.rename_chat(self.chat_id, title)
        self.chat = self.store.get_chat(self.chat_id)
        self.title_changed.emit(self.chat_id, title)
        self.chat_changed.emit(self.chat_id)

    def message_widgets(self) -> list[MessageWidget]:
        return self.view.message_widgets()

    def reload(self) -> None:
        """Show the chat as stored."""
        self.view.clear()
        for message in self.store.messages(self.chat_id):
            if message.role in ("user", "assistant") and message.column is None:
                self._add_widget(message)
        self._update_controls()
        self.refresh_context_meter()

    def _add_widget(self, message: Any) -> MessageWidget:
        widget = MessageWidget(
            message.id,
            message.role,
            message.text,
            image_paths=[self.store.attachment_path(sha) for sha in message.images],
            stats=message.stats,
        )
        widget.edit_requested.connect(self.begin_edit)
        widget.regenerate_requested.connect(self.regenerate)
        return self.view.add_message(widget)

    def _update_controls(self) -> None:
        streaming = self.is_streaming
        self.send_button.setEnabled(not streaming)
        self.stop_button.setEnabled(streaming)
        widgets = self.view.message_widgets()
        for i, widget in enumerate(widgets):
            last = i == len(widgets) - 1
            widget.set_actions(
                can_edit=not streaming, can_regenerate=not streaming and last and widget.role == "assistant"
            )

    # --- notices --------------------------------------------------------------------------------------------

    def show_notice(self, text: str) -> None:
        """Show a message above the input (an error the user should read); it stays until dismissed."""
        log.info("chat %s: %s", self.chat_id, text)
        self.notice_label.setText(text)
        self.notice.setVisible(True)

    def clear_notice(self) -> None:
        self.notice_label.clear()
        self.notice.setVisible(False)

    def notice_text(self) -> str:
        return "" if self.notice.isHidden() else self.notice_label.text()

    # --- sending --------------------------------------------------------------------------------------------

    def send(self) -> bool:
        """Send the typed message (and attached images) and start the answer; False when refused."""
        self._saves.retry()  # the user's next action tries an unsaved answer again
        text = self.input.toPlainText().strip()
        attachments = self.strip.attachments()
        if self.is_streaming:
            self.show_notice("This chat is still answering. Wait for it, or stop it (Esc) first.")
            return False
        if not text and not attachments:
            return False
        if self._num_attaching:
            self.show_notice("Images are still being checked; send again in a moment.")
            return False
        if not self.backend.is_loaded:
            self.show_notice("No model is loaded yet. Wait for it to load, or open one from the Model menu.")
            return False
        if attachments and not self.backend.can_see_images:
            self.show_notice(
                f"Not sent: the loaded model ({self.backend.name}) cannot see images. Remove the images "
                "to send the text alone, or load a vision model such as the bundled demo vision model "
                "(Model menu)."
            )
            return False
        try:
            if self._editing_id is not None:
                self.store.delete_messages_from(self.chat_id, self._editing_id)
                self.view.remove_from(self._editing_id)
                self._end_edit()
            shas = [self.store.add_attachment(a.data, a.suffix) for a in attachments]
            message = self.store.add_message(self.chat_id, "user", text, images=shas)
        except StoreError as e:
            self.show_notice(f"Not sent: {e}\nYour message is still in the box: send it again once this is fixed.")
            return False
        self._add_widget(message)
        self.input.clear()
        self.strip.clear()
        self.clear_notice()
        if self.chat.title == DEFAULT_TITLE and text:
            first_line = text.splitlines()[0]
            self.rename(first_line[:_TITLE_LENGTH] + ("…" if len(first_line) > _TITLE_LENGTH else ""))
        self.chat_changed.emit(self.chat_id)
        self._start_answer()
        return True

    def regenerate(self, message_id: int | None = None) -> bool:
        """Write the last answer (or answer `message_id` and everything after it) again."""
        self._saves.retry()
        if self.is_streaming:
            return False
        if not self.backend.is_loaded:
            self.show_notice("No model is loaded yet. Wait for it to load, or open one from the Model menu.")
            return False
        widgets = self.view.message_widgets()
        if message_id is None:
            if not widgets or widgets[-1].role != "assistant":
                return False
            message_id = widgets[-1].message_id
        try:
            self.store.delete_messages_from(self.chat_id, message_id)
        except StoreError as e:
            self.show_notice(f"Could not regenerate: {e}")
            return False
        self.view.remove_from(message_id)
        self.clear_notice()
        self._start_answer()
        return True

    def begin_edit(self, message_id: int) -> None:
        """Put an earlier user message back into the input; sending replaces it and every later message."""
        if self.is_streaming:
            return
        message = next((m for m in self.store.messages(self.chat_id) if m.id == message_id), None)
        if message is None or message.role != "user":
            return
        self._editing_id = message_id
        self.input.setPlainText(message.text)
        self.input.setFocus()
        self.strip.clear()
        if message.images:
            self.attach_files([str(self.store.attachment_path(sha)) for sha in message.images])
        self.edit_bar.setVisible(True)

    def cancel_edit(self) -> None:
        self._end_edit()
        self.input.clear()
        self.strip.clear()

    def _end_edit(self) -> None:
        self._editing_id = None
        self.edit_bar.setVisible(False)

    def _conversation(self) -> tuple[list[dict[str, Any]], list[str]]:
        """The chat's messages for the prompt, and the shas of their images in prompt order.

        A model that cannot see images gets the text alone (images sent to an earlier vision model stay
        stored and shown, but are left out of its prompt).
        """
        see = self.backend.can_see_images
        messages: list[dict[str, Any]] = []
        shas: list[str] = []
        for m in self.store.messages(self.chat_id):
            if m.role not in ("user", "assistant") or m.column is not None:
                continue
            if see and m.role == "user" and m.images:
                messages.append(user_message(m.text, len(m.images)))
                shas += m.images
            else:
                messages.append({"role": m.role, "content": m.text})
        return messages, shas

    def _start_answer(self) -> None:
        self._save_system_prompt()  # typed just now: the answer must already use it
        messages, shas = self._conversation()
        # Until the job starts (images embedded, prompt built, both off the GUI thread) the tab counts as answering.
        self._preparing = True
        self._stopping = False
        self._update_controls()
        self.streaming_changed.emit(self.chat_id, True)
        self._task = spawn(self._prepare_and_begin(messages, shas), name=f"prompt-{self.chat_id}")

    async def _prepare_and_begin(self, messages: list[dict[str, Any]], shas: list[str]) -> None:
        backend = self.backend
        job = None
        error = None
        restart = False
        try:
            settings = GenerationSettings.from_dict(self.chat.settings).seeded()
            paths = [self.store.attachment_path(sha) for sha in shas]
            job = await backend.start_answer(
                messages, self.chat.system_prompt, paths, settings, identifier=self.chat_id
            )
        except ModelSwapped:  # another model was loaded meanwhile: its own rows, its prompt
            restart = True
        except ImageError as e:  # names the file
            log.info("chat %s: an image could not be used: %s", self.chat_id, e)
            error = (
                f"Could not use an image of this conversation: {e}\n"
                "Your messages are saved. Edit the message to attach the image again or remove it."
            )
        except ChatTemplateError as e:  # a chat template can fail in many ways; the message says which
            log.info("chat %s: building the prompt failed: %s", self.chat_id, e)
            error = f"Could not build the prompt for {backend.name}: {e}"
        except ContextFull as e:
            error = str(e)
        except Exception as e:  # anything else still must not break the tab
            log.info("chat %s: the answer could not start: %s", self.chat_id, e)
            error = f"Could not start the answer: {str(e) or type(e).__name__}"
        finally:
            self._preparing = False
            self._task = None
        stopped = self._stopping
        self._stopping = False
        if job is not None and stopped:
            spawn(job.cancel(), name=f"stopped-before-start-{self.chat_id}")
        elif job is not None:
            self._begin_job(job, settings)
        elif restart and not stopped:
            self._start_answer()
            return
        if self._job is None:  # nothing started: the tab is idle again
            if error is not None:
                self.show_notice(error)
            self._update_controls()
            self.streaming_changed.emit(self.chat_id, False)
            self.generation_finished.emit(self.chat_id)

    def _begin_job(self, job: AnswerJob, settings: GenerationSettings) -> None:
        try:
            answer = self.store.add_message(self.chat_id, "assistant", "", settings=settings.to_dict(), complete=False)
        except StoreError as e:
            spawn(job.cancel(), name=f"unsaved-chat-{self.chat_id}")
            self.show_notice(f"Could not start the answer: {e}")
            return
        widget = self._add_widget(answer)
        widget.set_streaming(True)
        self._job = job
        self._stopping = False
        self._stream = _Stream(answer.id, widget, self._counted, settings.json_mode)
        self._update_controls()
        self._save_timer.start(self.save_interval_ms)
        self.streaming_changed.emit(self.chat_id, True)
        self._task = spawn(self._run(job, self._stream), name=f"chat-{self.chat_id}")

    async def _run(self, job: Any, stream: _Stream) -> None:
        error: str | None = None
        try:
            async for result in job:
                if result.get("stage") != "streaming":
                    continue
                token_ids = result.get("token_ids")
                stream.num_tokens += int(token_ids.shape[-1]) if token_ids is not None else 0
                chunk = result.get("text", "")
                if chunk:
                    stream.text += chunk
                    self.chunk_received.emit(self.chat_id, chunk)
                if result.get("eos"):
                    stream.eos = eos_stats(result, stream.json_mode)
                    stream.text = result.get("full_completion", stream.text)  # the engine's own account
                stream.widget.set_text(stream.text)
                if "prompt_tokens" in result:
                    stream.prompt_tokens = int(result["prompt_tokens"])
                if stream.prompt_tokens is not None:
                    self._meter_request += 1  # a count still on its way is older than this
                    self._show_context(stream.prompt_tokens + stream.num_tokens)
        except Exception as e:  # the engine failed this job: keep what arrived, say what happened
            log.exception("chat %s: the answer failed", self.chat_id)
            error = str(e) or type(e).__name__
        finally:
            self._finish(stream, error)

    def _finish(self, stream: _Stream, error: str | None) -> None:
        self._save_timer.stop()
        complete = bool(stream.eos) and error is None
        if complete:
            stats = stream.eos
        else:
            stats = {"new_tokens": stream.num_tokens, "stopped": error is None}
            if error is not None:
                stats["error"] = error
        self._write(stream, stats=stats, complete=complete)
        stream.widget.set_streaming(False)
        stream.widget.set_stats(stats)
        if error is not None:
            self.show_notice(f"The answer stopped with an error: {error}")
        self._job = None
        self._stream = None
        self._task = None
        self._update_controls()
        self.refresh_context_meter()
        self.streaming_changed.emit(self.chat_id, False)
        self.chat_changed.emit(self.chat_id)
        self.generation_finished.emit(self.chat_id)

    def _write(self, stream: _Stream, **fields: Any) -> None:
        """Save the answer; what the store refuses stays in memory (and on screen) and is retried."""
        if self._saves.save(stream.message_id, text=stream.text, **fields):
            stream.saved_text = stream.text

    @property
    def save_error(self) -> str | None:
        """Why an answer of this tab is not saved yet (it is being retried); None when all is saved."""
        return self._saves.problem

    def _save_failed(self, problem: str) -> None:
        seconds = max(1, round(self._saves.retry_interval_ms / 1000))
        self._save_notice = (
            f"Could not save this answer: {problem}\n"
            f"It stays here, and Tandem tries again every {seconds} s until it is saved (free some disk space)."
        )
        self.show_notice(self._save_notice)

    def _save_recovered(self) -> None:
        if self.notice_text() == self._save_notice:
            self.clear_notice()
        self._save_notice = ""
        self.chat_changed.emit(self.chat_id)

    def _save_partial(self) -> None:
        stream = self._stream
        if stream is not None and stream.text != stream.saved_text:
            self._write(stream)

    def stop(self) -> None:
        """Stop the answer now; the text so far stays (Esc, the Stop button, closing the tab)."""
        if self._preparing:
            self._stopping = True  # the job is not started once the images are embedded
        elif self._job is not None and not self._stopping:
            self._stopping = True
            spawn(self._job.cancel(), name=f"stop-chat-{self.chat_id}")

    async def shutdown(self) -> None:
        """Stop any answer and wait until it is saved."""
        self.stop()
        while self._task is not None and not self._task.done():
            await asyncio.wait({self._task})
        self._saves.retry()

    def flush(self) -> None:
        """Save the answer streaming now as it stands (the window is closing and the loop may not run again)."""
        self._save_system_prompt()
        stream = self._stream
        if stream is not None:
            self._write(stream, stats={"new_tokens": stream.num_tokens, "stopped": True}, complete=False)
        else:
            self._saves.retry()

    # --- context meter --------------------------------------------------------------------------------------

    def refresh_context_meter(self) -> asyncio.Task | None:
        """Count the tokens the conversation takes in the loaded model's context (on a worker thread: it
        renders the chat template); returns the counting task, None when no model is loaded."""
        self._meter_request += 1
        if not self.backend.is_loaded:
            self.context_meter.setRange(0, 1)
            self.context_meter.setValue(0)
            self.context_meter.setFormat("context: no model loaded")
            return None
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # the tab is built before the loop runs (the window opening): count once it does
            QTimer.singleShot(0, self, self.refresh_context_meter)
            return None
        try:
            messages, shas = self._conversation()
            pictures = [self.store.attachment_path(sha) for sha in shas]  # headers only: sizes decide the count
        except StoreError as e:  # a deferred count that fires after the store closed (the app shutting down)
            log.info("chat %s: context not counted: %s", self.chat_id, e)
            return None
        request, system_prompt = self._meter_request, self.chat.system_prompt
        return spawn(self._count(request, messages, system_prompt, pictures), name=f"count-{self.chat_id}")

    async def _count(
        self, request: int, messages: list[dict[str, Any]], system_prompt: str, pictures: list[Path]
    ) -> None:
        count = self.backend.count_tokens
        try:
            used = await in_worker(lambda: count(messages, system_prompt, image_sources=pictures), pool=PROMPT)
        except Exception as e:  # shown, not raised: the meter must never break the tab
            log.warning("chat %s: cannot count tokens: %s", self.chat_id, e)
            return
        # Shown only if nothing newer was counted or streamed meanwhile, and the tab still exists.
        if request == self._meter_request and shiboken6.isValid(self):
            self._counted = used
            if used is None:  # the backend cannot count (a remote server): no meter rather than a wrong one
                self.context_meter.hide()
            else:
                self._show_context(used)

    def _show_context(self, used: int) -> None:
        self.context_meter.show()
        context = max(1, int(self.backend.context_length))
        self.context_meter.setFormat("context: %v / %m tokens")
        self.context_meter.setRange(0, context)
        self.context_meter.setValue(min(used, context))

    def _save_system_prompt(self) -> None:
        self._system_timer.stop()
        text = self.system_prompt_edit.toPlainText()
        if text != self.chat.system_prompt:
            self.store.update_chat(self.chat_id, system_prompt=text)
            self.chat = self.store.get_chat(self.chat_id)
            self.refresh_context_meter()

    # --- attachments ----------------------------------------------------------------------------------------

    def attach_files(self, paths: list[str]) -> asyncio.Task:
        """Check image files off the GUI thread and add them to the next message."""
        self._num_attaching += 1
        return spawn(self._attach([Path(p) for p in paths], None), name=f"attach-{self.chat_id}")

    def attach_image(self, image: QImage) -> asyncio.Task:
        """Add a pasted image to the next message."""
        self._num_attaching += 1
        return spawn(self._attach([], image), name=f"paste-{self.chat_id}")

    async def _attach(self, paths: list[Path], image: QImage | None) -> None:
        problems = []
        try:
            for path in paths:
                try:
                    self.strip.add(await load_image_file_async(path))
                except AttachmentError as e:
                    problems.append(str(e))
            if image is not None:
                try:
                    self.strip.add(await load_qimage_async(image))
                except AttachmentError as e:
                    problems.append(str(e))
        finally:
            self._num_attaching -= 1
        if problems:
            self.show_notice("\n".join(problems))

    def _pick_files(self) -> None:
        dialog = QFileDialog(self, "Attach images", "", IMAGE_FILE_FILTER)
        dialog.setFileMode(QFileDialog.FileMode.ExistingFiles)
        dialog.filesSelected.connect(self.attach_files)
        dialog.open()

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 (Qt's name)
        if event.mimeData().hasUrls() or event.mimeData().hasImage():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802
        mime = event.mimeData()
        files = [u.toLocalFile() for u in mime.urls() if u.isLocalFile()]
        if files:
            self.attach_files(files)
        elif mime.hasImage():
            self.attach_image(QImage(mime.imageData()))
        else:
            self.show_notice("Only image files can be attached.")
        event.acceptProposedAction()
