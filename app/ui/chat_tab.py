"""ChatTab: one conversation — its messages, system prompt, settings, attachments, and its own streaming job.

A send stores the user message, then hands the conversation, its image files and the chat's GenerationSettings
to the tab's backend (`backend.start_answer`, the app.service.backend protocol: the local engine or a remote
server), whose results arrive with `async for` on the GUI loop; every tab runs its own, so several stream at
once. The answer is stored as soon as it starts (complete=False), saved every second while it streams, and once
more when it ends or is stopped. The message being typed (text and images) is the chat's draft in the store:
saved a moment after each edit and when the window closes, put back when the chat opens, cleared when sent.
With "JSON mode" on (saved in the chat's settings dict as "json_mode"), every
answer is held to one JSON object. `set_backend` hands the tab another backend; the next answer uses it.

The backend builds the prompt off the GUI thread, and the context meter counts on a worker thread
(app.service.workers): a chat template is the model's own code, and a hostile one runs for up to its time limit
(engine.chat_template.RENDER_SECONDS) before it fails, which must not freeze the window. Its error is shown
above the input like any other reason an answer could not start.

Versions and branches: regenerate writes a new version of an answer, and the ←/→ switch on a message (or
Alt+Left / Alt+Right) shows another version, with the continuation that version had. The store keeps the tree
and which version is shown (app/store/branches.py); the tab shows the visible thread and sends exactly it to the
model, so a switch changes what the next answer sees. A switch runs no model: the prompt of the next answer
shares its prefix with what that branch sent before, and the engine's prefix cache finds those pages by content.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QApplication, QWidget

from app.service.backend import Backend, KnownImage
from app.service.generation import (
    DEFAULT_OVERFLOW,
    OVERFLOW_SETTING,
    complete_settings,
    has_json_mode,
    overflow_of,
    thinking_of,
    with_chat_switches,
    with_json_mode,
    with_overflow,
    with_thinking,
)
from app.service.reasoning import stored_format
from app.store import StoreError
from app.ui.answer_saves import RETRY_INTERVAL_MS, PendingSaves
from app.ui.chat_answer import ChatAnswer, Extension, conversation, conversation_ids
from app.ui.chat_attaching import AttachingImages
from app.ui.chat_draft import KeepingDraft
from app.ui.chat_effort import ChoosingEffort
from app.ui.chat_tab_ui import build_chat_tab
from app.ui.message_view import MessageWidget

log = logging.getLogger(__name__)

SAVE_INTERVAL_MS = 1000  # a streaming answer reaches the database at least this often
DRAFT_SAVE_MS = 600  # a typed message is saved once typing pauses this long
DEFAULT_TITLE = "New chat"
_TITLE_LENGTH = 48


class ChatTab(AttachingImages, KeepingDraft, ChoosingEffort, QWidget):
    """One open chat. `send()` / `stop()` / `regenerate()` / `begin_edit()` drive it; signals tell the window."""

    title_changed = Signal(int, str)
    streaming_changed = Signal(int, bool)
    chat_changed = Signal(int)  # something was saved: the sidebar re-sorts
    chunk_received = Signal(int, str)
    generation_finished = Signal(int)
    vision_model_wanted = Signal()  # the user asked to load a model that sees this chat's images
    save_interval_ms = SAVE_INTERVAL_MS
    draft_save_ms = DRAFT_SAVE_MS
    save_retry_ms = RETRY_INTERVAL_MS  # a save the store refused is tried again this often

    def __init__(self, store: Any, backend: Backend, chat_id: int, parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        self.backend = backend  # read afresh for every answer and count: set_backend switches it
        self.chat = store.get_chat(chat_id)
        self.chat_id = chat_id
        self._editing_id: int | None = None
        self._regenerating: int | None = None  # the answer being written again until its new version is stored
        self._num_attaching = 0
        self.setAcceptDrops(True)

        self._saves = PendingSaves(store, self, self.save_retry_ms)  # saves the store refused (a full disk)
        self.answer = ChatAnswer(
            store,
            chat_id,
            self._saves,
            self._new_answer_widget,
            lambda widget: self.view.add_message(widget),  # (the view is built below)
            lambda: self.save_interval_ms,
            self,
        )
        self.answer.began.connect(self._answer_began)
        self.answer.chunk_received.connect(lambda chunk: self.chunk_received.emit(self.chat_id, chunk))
        self.answer.tokens_used.connect(lambda used: self.context_meter.show_used(used, self.backend.context_length))
        self.answer.ended.connect(self._answer_ended)
        self.answer.model_swapped.connect(self._start_answer)
        self.answer.view_began.connect(self._view_began)
        self._prompt_ids: list[int] = []  # the message ids of the prompt being answered, in prompt order
        self._view_start_id: int | None = None  # the first message the model still saw in the last answer
        self._saves.failed.connect(self._save_failed)
        self._saves.saved.connect(self._save_recovered)
        self._save_notice = ""
        self._just_attached: dict[str, KnownImage] = {}  # the message being sent's checked pictures
        self._system_timer = QTimer(self)
        self._system_timer.setSingleShot(True)
        self._system_timer.setInterval(400)
        self._system_timer.timeout.connect(self._save_system_prompt)
        self._draft_timer = QTimer(self)
        self._draft_timer.setSingleShot(True)
        self._draft_timer.setInterval(self.draft_save_ms)
        self._draft_timer.timeout.connect(self.save_draft)
        self._notice_action: Callable[[], Any] | None = None

        build_chat_tab(self)
        self.context_meter.follow(self.input, self.refresh_context_meter)  # the message being typed counts too
        self.reload()
        self._restore_draft()

    # --- state ----------------------------------------------------------------------------------------------

    def set_backend(self, backend: Backend) -> None:
        """Answer with `backend` from the next send on (an answer streaming now ends on its own job)."""
        self.backend = backend
        self.refresh_context_meter()

    @property
    def is_streaming(self) -> bool:
        """Whether an answer is on its way: its images being embedded, its prompt built, or its job streaming."""
        return self.answer.is_running

    @property
    def title(self) -> str:
        return self.chat.title

    @property
    def streamed_text(self) -> str:
        """The answer streaming now (empty when none)."""
        return self.answer.text

    def settings(self) -> dict[str, Any]:
        """The chat's sampler settings dict (every field, "seed", "max_new_tokens"; JSON mode is separate)."""
        return complete_settings(self.chat.settings)

    def set_settings(self, settings: dict[str, Any]) -> None:
        """Use and save `settings` for this chat's next answers; the chat keeps its own switches (JSON mode etc.)."""
        kept = with_chat_switches(settings, self.chat.settings)
        self.store.update_chat(self.chat_id, settings=kept)
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

    @property
    def thinking(self) -> bool | None:
        """This chat's thinking switch for reasoning models (None: the model's default, which is on)."""
        return thinking_of(self.chat.settings)

    def set_thinking(self, on: bool) -> None:
        """Let a reasoning model think (on) or answer at once (off) in this chat's next answers; saved."""
        on = bool(on)
        if on != (self.thinking is not False):
            self.store.update_chat(self.chat_id, settings=with_thinking(self.chat.settings, on))
            self.chat = self.store.get_chat(self.chat_id)
        if self.thinking_box.isChecked() != on:
            self.thinking_box.setChecked(on)

    @property
    def overflow(self) -> str | None:
        """This chat's context-overflow policy (None: the app's default)."""
        return overflow_of(self.chat.settings)

    def set_overflow(self, policy: str | None) -> None:
        """What this chat's next answers do past the context ("stop", "truncate-middle", "rolling-window"); saved."""
        self.store.update_chat(self.chat_id, settings=with_overflow(self.chat.settings, policy))
        self.chat = self.store.get_chat(self.chat_id)

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
        for message in self.store.messages(self.chat_id):  # the visible thread
            if self.shows(message):
                self._add_widget(message)
        self.view.set_view_start(self._view_start_id)
        self._update_controls()
        self.refresh_context_meter()

    def _add_widget(self, message: Any) -> MessageWidget:
        """Show a stored message at the end of the conversation."""
        images = [self.store.attachment_path(sha) for sha in message.images]
        return self.view.add_message(self._new_widget(message.id, message.role, message.text, images, message.stats))

    def _new_widget(
        self, message_id: int | None, role: str, text: str = "", images: Sequence[Path] = (), stats: dict | None = None
    ) -> MessageWidget:
        widget = MessageWidget(message_id, role, text, image_paths=images, stats=stats)
        widget.edit_requested.connect(self.begin_edit)
        widget.regenerate_requested.connect(self.regenerate)
        widget.continue_requested.connect(self.continue_answer)
        widget.version_requested.connect(self.switch_version)
        return widget

    def _new_answer_widget(self) -> MessageWidget:
        """The widget of an answer asked for, shown once the answer begins (ChatAnswer); its buttons are set as
        they stay while it streams, so beginning touches no other widget."""
        widget = self._new_widget(None, "assistant")
        widget.set_actions(can_edit=False, can_regenerate=False)
        return widget

    def _update_thinking_box(self) -> None:
        fmt = getattr(self.backend, "reasoning_format", None)
        self.thinking_box.setVisible(bool(fmt is not None and fmt.toggle))  # only where the template reads it
        self._update_effort_box()

    def _update_controls(self) -> None:
        streaming = self.is_streaming
        self._update_thinking_box()
        self.send_button.setEnabled(not streaming)
        self.stop_button.setEnabled(streaming)
        widgets = self.view.message_widgets()
        self.view.setVisible(not self.welcome.show_for(self.backend, has_messages=bool(widgets)))
        for i, widget in enumerate(widgets):
            last_answer = i == len(widgets) - 1 and widget.role == "assistant" and not streaming
            widget.set_actions(can_edit=not streaming, can_regenerate=last_answer, can_continue=last_answer)
        self._show_versions(streaming)

    # --- notices --------------------------------------------------------------------------------------------

    def show_notice(self, text: str, action: tuple[str, Callable[[], Any]] | None = None) -> None:
        """Show a message above the input (an error the user should read); it stays until dismissed. `action`:
        a button's text and what it does, beside the message."""
        log.info("chat %s: %s", self.chat_id, text)
        self.notice_label.setText(text)
        self._notice_action = action[1] if action else None
        self.notice_button.setText(action[0] if action else "")
        self.notice_button.setVisible(action is not None)
        self.notice.setVisible(True)

    def clear_notice(self) -> None:
        self.notice_label.clear()
        self._notice_action = None
        self.notice_button.setVisible(False)
        self.notice.setVisible(False)

    def _notice_action_clicked(self) -> None:
        action = self._notice_action
        self.clear_notice()
        if action is not None:
            action()

    def notice_text(self) -> str:
        return "" if self.notice.isHidden() else self.notice_label.text()

    # --- sending --------------------------------------------------------------------------------------------

    def send(self) -> bool:
        """Send the typed message (and attached images and documents) and start the answer; False when refused."""
        self._saves.retry()  # the user's next action tries an unsaved answer again
        text = self.input.toPlainText().strip()
        attachments = self.strip.attachments()
        if self.is_streaming:
            self.show_notice("This chat is still answering. Wait for it, or stop it (Esc) first.")
            return False
        if not text and not attachments and not self.strip.documents():
            return False
        if self._num_attaching:
            self.show_notice("Attachments are still being read; send again in a moment.")
            return False
        if not self.backend.is_loaded:
            self.show_notice("No model is loaded yet. Wait for it to load, or open one from the Model menu.")
            return False
        if attachments and not self.backend.can_see_images:
            reason = self.backend.images_off_reason  # a GGUF whose projector did not pair: say why
            self.show_notice(
                f"Not sent: the loaded model ({self.backend.name}) cannot see images."
                + (f" {reason}" if reason else "")
                + " Remove the images to send the text alone, or load a vision model such as the bundled "
                "demo vision model (Model menu)."
            )
            return False
        try:
            shas = [self.store.add_attachment(a.data, a.suffix, a.sha256) for a in attachments]
            # An edited message is a new version of it: the old one and its branch stay, behind ←/→.
            message = self.store.add_message(self.chat_id, "user", text, images=shas, version_of=self._editing_id)
            message = self.store_documents(message)  # taken back if its documents cannot be kept
        except StoreError as e:
            self.show_notice(f"Not sent: {e}\nYour message is still in the box: send it again once this is fixed.")
            return False
        if self._editing_id is not None:
            self.view.remove_from(self._editing_id)
            self._end_edit()
        # Sent with the bytes and digest the check already has: the picture is read and hashed once.
        self._just_attached = {a.sha256: KnownImage(a.data, a.sha256, a.name) for a in attachments}
        self._add_widget(message)
        self.input.clear()
        self.strip.clear()
        self._clear_draft()
        self.clear_notice()
        if self.chat.title == DEFAULT_TITLE and text:
            first_line = text.splitlines()[0]
            self.rename(first_line[:_TITLE_LENGTH] + ("…" if len(first_line) > _TITLE_LENGTH else ""))
        self.chat_changed.emit(self.chat_id)
        self._start_answer()
        return True

    def begin_edit(self, message_id: int) -> None:
        """Put an earlier user message back into the input; sending makes a new version of it (a new branch)."""
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

    def continue_answer(self, message_id: int | None = None) -> bool:
        """Write on the last answer from where its token limit cut it, in the same message (its Continue button);
        False when the last message is not such an answer or the chat is answering."""
        self._saves.retry()
        widgets = self.view.message_widgets()
        last = widgets[-1] if widgets else None
        if self.is_streaming or last is None or last.role != "assistant" or not last.is_cut:
            return False
        if message_id is not None and message_id != last.message_id:
            return False
        if not self.backend.is_loaded:
            self.show_notice("No model is loaded yet. Wait for it to load, or open one from the Model menu.")
            return False
        message = next((m for m in self.store.messages(self.chat_id) if m.id == last.message_id), None)
        if message is None:
            return False
        self._end_edit()
        self.clear_notice()
        _fmt, inside = stored_format(message.stats)
        self._start_answer(Extension(last, message.text, int(message.stats.get("new_tokens", 0)), inside))
        return True

    def _start_answer(self, extension: Extension | None = None) -> None:
        self._save_system_prompt()  # typed just now: the answer must already use it
        # A regenerated answer's prompt is the thread that led to it, a continued one's the thread before it with
        # its text as the assistant's unfinished turn; otherwise the whole visible thread.
        before = extension.widget.message_id if extension is not None else self._regenerating
        messages, shas = conversation(self.store, self.chat_id, self.backend.can_see_images, before)
        self._prompt_ids = conversation_ids(self.store, self.chat_id, before)
        if extension is not None:
            messages.append({"role": "assistant", "content": extension.text})
        if not self.backend.can_see_images:
            self._say_images_left_out()
        pictures = [self._just_attached.get(sha) or self.store.attachment_path(sha) for sha in shas]
        self._just_attached = {}
        counted = self.context_meter.counted
        system, settings = self.chat.system_prompt, self.chat.settings
        self.answer.start(self.backend, messages, pictures, system, settings, counted, self._regenerating, extension)
        # Until the job starts (images embedded, prompt built, both off the GUI thread) the tab counts as answering.
        self._update_controls()
        self.streaming_changed.emit(self.chat_id, True)

    def _answer_began(self) -> None:
        # The controls were set for answering when the answer was asked for (_start_answer), and its widget came
        # with its buttons set: only a new version of an answer changes a switch ("3/3"), so only it reads the tree.
        if self._regenerating is not None:
            self._regenerating = None  # its new version is stored: the visible thread runs through it now
            self._show_versions(streaming=True)
        self.view.set_view_start(self._view_start_id)

    def _view_began(self, index: int) -> None:
        self._view_start_id = self._prompt_ids[index] if 0 <= index < len(self._prompt_ids) else None

    def _answer_ended(self, notice: str, answered: bool) -> None:
        self._branch_answer_ended(answered)
        if notice:
            self.show_notice(notice)
        self._update_controls()
        if answered:
            self.refresh_context_meter()
        self.streaming_changed.emit(self.chat_id, False)
        if answered:
            self.chat_changed.emit(self.chat_id)
        self.generation_finished.emit(self.chat_id)
        if answered and self.answer.filled_context:  # the policy frees room: write on instead of stopping mid-sentence
            QTimer.singleShot(0, self.continue_answer)

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

    def stop(self) -> None:
        """Stop the answer now; the text so far stays (Esc, the Stop button, closing the tab)."""
        self.answer.stop()

    async def shutdown(self) -> None:
        """Stop any answer and wait until it is saved."""
        await self.answer.shutdown()
        self._saves.retry()

    def flush(self) -> None:
        """Save the answer streaming now as it stands, and the draft (the window is closing and the loop may not
        run again)."""
        self._save_system_prompt()
        self.save_draft()
        if not self.answer.flush():
            self._saves.retry()

    # --- versions and branches ------------------------------------------------------------------------------

    def regenerate(self, message_id: int | None = None) -> bool:
        """Write the last answer (or answer `message_id`) again as a new version of it; the old one is kept."""
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
        if message_id not in [w.message_id for w in widgets if w.role == "assistant"]:
            return False
        self._end_edit()
        self.view.remove_from(message_id)  # still stored: it comes back as a version beside the new answer
        self.clear_notice()
        self._regenerating = message_id
        self._start_answer()
        return True

    def _branch_answer_ended(self, answered: bool) -> None:
        """An answer ended; one that never started leaves the old version on screen where it was."""
        regenerating, self._regenerating = self._regenerating, None
        if regenerating is not None and not answered:
            self.reload()

    def switch_version(self, message_id: int, step: int) -> bool:
        """Show the version `step` (-1, +1) away from message `message_id`, and the rest of the thread as that
        version left it; False when there is none or the chat is answering."""
        if self.is_streaming:
            return False
        try:
            versions = self.store.message_versions(self.chat_id).get(message_id, [])
            index = versions.index(message_id) + step if message_id in versions else -1
            if not 0 <= index < len(versions):
                return False
            self.store.select_version(versions[index])
            thread = [m for m in self.store.messages(self.chat_id) if self.shows(m)]
        except StoreError as e:
            self.show_notice(f"Could not switch versions: {e}")
            return False
        self._end_edit()  # the message being edited may be on the branch that leaves the screen
        kept = [w.message_id for w in self.view.message_widgets()]
        kept = kept[: kept.index(message_id)] if message_id in kept else kept
        self.view.remove_from(message_id)
        for message in thread[len(kept) :]:
            self._add_widget(message)
        self.refresh_context_meter()  # the conversation changed: count it again (this also updates the controls)
        return True

    def step_version(self, step: int) -> bool:
        """Alt+Left / Alt+Right: switch the message that has the keyboard focus, else the lowest message that
        has other versions; the focus then stays on the version shown, so the keys can be pressed again."""
        widgets = self.view.message_widgets()
        focus = QApplication.focusWidget()
        target = next((w for w in widgets if focus is not None and (w is focus or w.isAncestorOf(focus))), None)
        if target is None or target.versions.count < 2:
            target = next((w for w in reversed(widgets) if w.versions.count > 1), None)
        if target is None:
            return False
        position = widgets.index(target)
        if not self.switch_version(target.message_id, step):
            return False
        self.view.message_widgets()[position].body.setFocus()
        return True

    def _show_versions(self, streaming: bool) -> None:
        """Put each message's "2/3" and its ←/→ (off while the chat answers) in step with the store."""
        try:
            versions = self.store.message_versions(self.chat_id)
        except (StoreError, KeyError) as e:  # a deferred refresh after the store closed or the chat went
            log.info("chat %s: versions not shown: %s", self.chat_id, e)
            return
        for widget in self.view.message_widgets():
            ids = versions.get(widget.message_id, [widget.message_id])
            index = ids.index(widget.message_id) if widget.message_id in ids else 0
            widget.versions.set_versions(index, len(ids), enabled=not streaming)

    @staticmethod
    def shows(message: object) -> bool:
        """Whether the tab shows this message (the compare view's columns and system turns are not)."""
        return message.role in ("user", "assistant") and message.column is None

    # --- context meter --------------------------------------------------------------------------------------

    def refresh_context_meter(self) -> asyncio.Task | None:
        """Count the tokens the conversation takes in the model's context (on a worker thread: it renders the
        chat template); returns the counting task, None when no model is loaded."""
        self._update_controls()  # the model (or backend) may have changed: the Think box and welcome follow it
        if not self.backend.is_loaded:
            self.context_meter.show_no_model()
            return None
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # the tab is built before the loop runs (the window opening): count once it does
            QTimer.singleShot(0, self, self.refresh_context_meter)
            return None
        try:
            messages, shas = conversation(self.store, self.chat_id, self.backend.can_see_images)
            pictures = [self.store.attachment_path(sha) for sha in shas]  # headers only: sizes decide the count
            policy = self.overflow or self.store.get_setting(OVERFLOW_SETTING, DEFAULT_OVERFLOW)
            self.context_meter.stops_at_limit = policy == "stop"
        except StoreError as e:  # a deferred count that fires after the store closed (the app shutting down)
            log.info("chat %s: context not counted: %s", self.chat_id, e)
            return None
        draft = self.input.toPlainText() if self._editing_id is None and not self.is_streaming else ""
        messages += [{"role": "user", "content": draft}] if draft.strip() else []
        return self.context_meter.count(self.backend, messages, self.chat.system_prompt, pictures)

    def _save_system_prompt(self) -> None:
        self._system_timer.stop()
        text = self.system_prompt_edit.toPlainText()
        if text != self.chat.system_prompt:
            self.store.update_chat(self.chat_id, system_prompt=text)
            self.chat = self.store.get_chat(self.chat_id)
            self.refresh_context_meter()

    # --- images a text model leaves out ---------------------------------------------------------------------

    def _say_images_left_out(self) -> None:
        """Tell the user the pictures of this conversation are not in the prompt, and offer a model that sees."""
        thread = self.store.messages(self.chat_id, before=self._regenerating)
        count = sum(len(m.images) for m in thread if m.role == "user" and m.column is None)
        if not count:
            return
        pictures = "the 1 image" if count == 1 else f"the {count} images"
        left_out = "it was left out" if count == 1 else "they were left out"
        self.show_notice(
            f"The loaded model cannot see {pictures} in this conversation; {left_out}.",
            ("Load a vision model…", self.vision_model_wanted.emit),
        )
