"""One chat's answer on its way: asked of the backend, streamed into its message, saved as it goes.

    start(backend, conversation, settings)       the tab counts as answering from here; the answer's widget is built
      backend.start_answer(...)                  images and prompt off the GUI thread (app.service.backend)
      message stored (complete=False), shown     began (answers ready together begin one per event-loop pass)
      async for chunk in job                     chunk_received, tokens_used; saved every save_interval_ms
      eos / stop / error                         saved with its stats; ended(notice, answered)

Past the context the backend's overflow policy drops old turns: `view_began` names the first message the model
still sees, and an answer the context's end cut (not its own token limit) is marked `filled_context`, so the tab
writes it on (Continue) once the policy has freed room.

A save the store refuses (a full disk) stays in memory and on screen and is retried by the tab's
PendingSaves (app/ui/answer_saves.py). The window's reactions (controls, notices, signals) are the tab's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.documents.prompt import prompt_documents
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
from app.service.generation import DEFAULT_OVERFLOW, OVERFLOW_SETTING, GenerationSettings
from app.service.reasoning import THINK, answer_only, format_stats
from app.store import StoreError
from app.ui.answer_saves import PendingSaves
from app.ui.message_view import MessageWidget
from app.ui.tasks import OnePerPass, spawn

log = logging.getLogger(__name__)

# Tabs sent together get their prompts back together; each answer's beginning waits for GIL hand-offs while the
# engine thread runs Python, so several in one pass of the event loop stalled the window (app/ui/tasks.py).
_BEGIN_TURNS = OnePerPass()
PREFILL_POLL_MS = 150  # how often an answer with no text yet shows how much of its prompt has been read


@dataclass(frozen=True)
class Extension:
    """An answer cut at its token limit that Continue writes on, in the same message: its widget, its stored
    text and token count, and whether its prompt opened a reasoning block."""

    widget: MessageWidget
    text: str
    num_tokens: int
    inside: bool = False


@dataclass
class _Stream:
    """What one running answer has produced so far."""

    message_id: int
    widget: MessageWidget
    prompt_tokens: int | None  # the meter's last count until the backend says (None: it cannot count)
    json_mode: bool = False
    text: str = ""  # as the model wrote it, reasoning tags included: what is stored
    thinking: str = ""  # the text split by the backend as it streamed, tags left out
    answer: str = ""
    num_tokens: int = 0
    saved_text: str = ""
    eos: dict[str, Any] = field(default_factory=dict)
    reasoning: Any = None  # the backend's ReasoningFormat (app.service.reasoning), None: no thinking in tags
    inside: bool = False  # the prompt opened the reasoning block: the answer began as thinking
    prefix: str = ""  # a continued answer's text before this job: the job's full_completion follows it
    base_tokens: int = 0  # ...and its tokens
    overflow: str = "stop"
    first_seen: int | None = None  # the message the model's view begins at, as last told to the chat
    sources: list[dict[str, str]] = field(default_factory=list)  # the documents' passages in its prompt


def conversation(
    store: Any, chat_id: int, see_images: bool, before: int | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Chat `chat_id`'s visible thread for the prompt (`before`: the thread leading to that message, for a new
    version of it), and the shas of their images in prompt order.

    A model that cannot see images gets the text alone (images sent to an earlier vision model stay
    stored and shown, but are left out of its prompt). A user message's documents go before its text, whole
    or by the passages that best match the last question (app.documents.prompt).
    """
    messages: list[dict[str, Any]] = []
    shas: list[str] = []
    thread = _prompt_messages(store, chat_id, before)
    documents = prompt_documents(store, thread)
    for m in thread:
        if see_images and m.role == "user" and m.images:
            messages.append(user_message(documents.text_of(m), len(m.images)))
            shas += m.images
        elif m.role == "assistant":  # its thinking stays out of the next prompt, as reasoning templates expect
            messages.append({"role": m.role, "content": answer_only(m.text, m.stats)})
        else:
            messages.append({"role": m.role, "content": documents.text_of(m)})
    return messages, shas


def conversation_sources(store: Any, chat_id: int, before: int | None = None) -> list[dict[str, str]]:
    """The documents' passages `conversation(...)` puts into the prompt: the answer's sources."""
    return prompt_documents(store, _prompt_messages(store, chat_id, before)).sources


def conversation_ids(store: Any, chat_id: int, before: int | None = None) -> list[int]:
    """The message ids of `conversation(...)`'s messages, in the same order."""
    return [m.id for m in _prompt_messages(store, chat_id, before)]


def _prompt_messages(store: Any, chat_id: int, before: int | None) -> list[Any]:
    """The stored messages a prompt is made of: the thread's user and assistant turns, not compare columns'."""
    return [m for m in store.messages(chat_id, before=before) if m.role in ("user", "assistant") and m.column is None]


class ChatAnswer(QObject):
    """Runs chat `chat_id`'s answers, one at a time; see the module docstring."""

    began = Signal()  # the job runs: its message is stored and shown
    chunk_received = Signal(str)
    tokens_used = Signal(int)  # prompt + answer tokens so far, when the prompt's length is known
    ended = Signal(str, bool)  # the notice to show ("" for none), and whether an answer ran (and was saved)
    model_swapped = Signal()  # the model changed before the job started: build the conversation again
    view_began = Signal(int)  # index of the first message the model sees after dropped turns; -1: it sees all

    def __init__(
        self,
        store: Any,
        chat_id: int,
        saves: PendingSaves,
        new_widget: Callable[[], MessageWidget],
        show_widget: Callable[[MessageWidget], Any],
        save_interval_ms: Callable[[], int],
        parent: QObject | None = None,
    ):
        """`new_widget()` builds an answer's MessageWidget (its message id still None) without showing it;
        `show_widget(widget)` puts it at the end of the conversation once its message is stored."""
        super().__init__(parent)
        self.store, self.chat_id, self._saves = store, chat_id, saves
        self._new_widget, self._show_widget = new_widget, show_widget
        self._save_interval_ms = save_interval_ms
        self._widget: MessageWidget | None = None  # the next answer's, built when it is asked for
        self._job: AnswerJob | None = None
        self._task: asyncio.Task | None = None
        self._stream: _Stream | None = None
        self._stopping = False
        self._preparing = False  # images are being embedded or the prompt built before the answer's job starts
        self._version_of: int | None = None  # the answer being written again: this one is a new version of it
        self._extension: Extension | None = None  # the answer being written on (Continue)
        self._sources: list[dict[str, str]] = []  # the documents' passages its prompt holds
        self._save_timer = QTimer(self)
        self._save_timer.timeout.connect(self._save_partial)
        self.filled_context = False  # the last answer met the context's end and its overflow policy frees room
        self._prefill_timer = QTimer(self)  # while a long prompt is read: how far, from the job's progress
        self._prefill_timer.setInterval(PREFILL_POLL_MS)
        self._prefill_timer.timeout.connect(self._show_prefill)

    @property
    def is_running(self) -> bool:
        """Whether an answer is on its way: its images being embedded, its prompt built, or its job streaming."""
        return self._job is not None or self._preparing

    @property
    def text(self) -> str:
        """The answer streaming now (empty when none)."""
        return self._stream.text if self._stream else ""

    def start(
        self,
        backend: Backend,
        messages: list[dict[str, Any]],
        images: Sequence[Path],
        system_prompt: str,
        settings: Mapping[str, Any] | None,
        prompt_tokens: int | None,
        version_of: int | None = None,
        extension: Extension | None = None,
    ) -> None:
        """Ask `backend` for the answer to `messages` (images: the files of their image parts, in order) under
        the chat's stored `settings`; `prompt_tokens` is the meter's count, until the backend says. `version_of`:
        the answer is stored as a new version of that message (regenerate), not after the visible thread.
        `extension`: write on that answer instead (`messages` end with its text as the assistant's turn)."""
        self._preparing = True
        self.filled_context = False
        self._version_of = version_of
        self._extension = extension
        self._stopping = False
        # the same thread the tab built `messages` from (before the answer written again or on)
        before = extension.widget.message_id if extension is not None else version_of
        self._sources = conversation_sources(self.store, self.chat_id, before)
        if extension is not None:
            extension.widget.set_streaming(True)
        else:
            # Built now, in the pass that asked (the user's click), not when the job starts: answers whose prompts
            # come back together start together, and a widget costs tens of Qt calls, each a GIL hand-off while the
            # engine runs.
            self._widget = self._new_widget()
            self._widget.set_streaming(True)
        coro = self._prepare_and_begin(backend, messages, images, system_prompt, settings, prompt_tokens)
        self._task = spawn(coro, name=f"prompt-{self.chat_id}")

    async def _prepare_and_begin(
        self,
        backend: Backend,
        messages: list[dict[str, Any]],
        images: Sequence[Path],
        system_prompt: str,
        stored: Mapping[str, Any] | None,
        prompt_tokens: int | None,
    ) -> None:
        job = None
        error = ""
        try:
            settings = GenerationSettings.from_dict(stored).seeded()
            if settings.overflow is None:  # the chat has no policy of its own: the app's
                settings = settings.replace(overflow=self.store.get_setting(OVERFLOW_SETTING, DEFAULT_OVERFLOW))
            job = await backend.start_answer(messages, system_prompt, images, settings, identifier=self.chat_id)
            await _BEGIN_TURNS.take()
        except ModelSwapped:
            pass
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
        stopped, self._stopping = self._stopping, False
        if job is not None and stopped:
            spawn(job.cancel(), name=f"stopped-before-start-{self.chat_id}")
        elif job is not None:
            error = self._begin(job, settings, prompt_tokens, getattr(backend, "reasoning_format", THINK))
        self._drop_widget()  # an answer that did not begin never shows its widget (a model swap builds another)
        if self._job is None and self._extension is not None:
            self._extension.widget.set_streaming(False)  # not continued: the answer stands as it was
        if job is None and not error and not stopped:
            self.model_swapped.emit()
            return
        if self._job is None:  # nothing started: the tab is idle again
            self.ended.emit(error, False)

    def _begin(self, job: AnswerJob, settings: GenerationSettings, prompt_tokens: int | None, reasoning: Any) -> str:
        """Store and show the answer's message and stream the job into it; a notice when it cannot be stored."""
        if self._extension is not None:
            return self._begin_extension(job, settings, prompt_tokens, reasoning, self._extension)
        try:
            answer = self.store.add_message(
                self.chat_id,
                "assistant",
                "",
                settings=settings.to_dict(),
                stats={"sources": self._sources} if self._sources else None,
                complete=False,
                version_of=self._version_of,
            )
        except StoreError as e:
            spawn(job.cancel(), name=f"unsaved-chat-{self.chat_id}")
            return f"Could not start the answer: {e}"
        widget, self._widget = self._widget, None
        widget.message_id = answer.id
        self._show_widget(widget)
        self._job = job
        self._stopping = False
        self._stream = _Stream(answer.id, widget, prompt_tokens, settings.json_mode, reasoning=reasoning)
        self._stream.sources = self._sources
        if self._sources:
            widget.set_stats({"sources": self._sources})  # shown under the answer while it streams
        self._track(self._stream, settings, job)
        widget.set_reasoning_format(reasoning)
        self._save_timer.start(self._save_interval_ms())
        self.began.emit()
        self._task = spawn(self._run(job, self._stream), name=f"chat-{self.chat_id}")
        return ""

    def _begin_extension(
        self, job: AnswerJob, settings: GenerationSettings, prompt_tokens: int | None, reasoning: Any, ext: Extension
    ) -> str:
        """Stream the job on at the end of an answer already stored and shown (Continue)."""
        widget = ext.widget
        self._job = job
        self._stopping = False
        self._stream = _Stream(
            widget.message_id,
            widget,
            prompt_tokens,
            settings.json_mode,
            text=ext.text,
            thinking=widget.thinking_text,
            answer=widget.answer_text,
            num_tokens=ext.num_tokens,
            saved_text=ext.text,
            reasoning=reasoning,
            inside=ext.inside,
            prefix=ext.text,
            base_tokens=ext.num_tokens,
            sources=self._sources,
        )
        self._track(self._stream, settings, job)
        self._save_timer.start(self._save_interval_ms())
        self.began.emit()
        self._task = spawn(self._run(job, self._stream), name=f"chat-{self.chat_id}")
        return ""

    def _track(self, stream: _Stream, settings: GenerationSettings, job: AnswerJob) -> None:
        stream.overflow = settings.overflow or "stop"
        self._prefill_timer.start()
        # Both backends apply the policy and say where the model's view begins (a remote one may move it on a
        # retry after the server's refusal, before the first chunk: _run reads it again then).
        stream.first_seen = getattr(job, "first_seen", None)
        self.view_began.emit(-1 if stream.first_seen is None else int(stream.first_seen))

    def _show_prefill(self) -> None:
        stream, progress = self._stream, getattr(self._job, "prefill", None)  # the local engine's answers have it
        if stream is None or stream.num_tokens > stream.base_tokens:
            self._prefill_timer.stop()  # the answer is writing: its text says the rest
        elif progress is not None:
            stream.widget.set_prefill(*progress)

    async def _run(self, job: AnswerJob, stream: _Stream) -> None:
        error: str | None = None
        try:
            async for chunk in job:
                if (first_seen := getattr(job, "first_seen", None)) != stream.first_seen:
                    stream.first_seen = first_seen
                    self.view_began.emit(-1 if first_seen is None else int(first_seen))
                stream.num_tokens += chunk["num_tokens"]
                text = chunk["text"]
                if chunk["thinking"] and not stream.thinking and stream.reasoning is not None:
                    # thinking came without its opening tag: the prompt's template opened the block
                    stream.inside = not (stream.text + text).lstrip().startswith(stream.reasoning.start)
                    if stream.inside:
                        stream.widget.set_reasoning_format(stream.reasoning, inside=True)
                stream.thinking += chunk["thinking"]
                stream.answer += chunk["answer"]
                if text:
                    stream.text += text
                    self.chunk_received.emit(text)
                if chunk["eos"]:
                    stream.eos = eos_stats(chunk, stream.json_mode)
                    if "full_completion" in chunk:  # the backend's own account (of this job's part)
                        stream.text = stream.prefix + chunk["full_completion"]
                stream.widget.set_text(stream.text, stream.thinking, stream.answer)  # shown as the backend split it
                if "prompt_tokens" in chunk:
                    stream.prompt_tokens = int(chunk["prompt_tokens"])
                if stream.prompt_tokens is not None:
                    self.tokens_used.emit(stream.prompt_tokens + stream.num_tokens)
        except Exception as e:  # the engine failed this job: keep what arrived, say what happened
            log.exception("chat %s: the answer failed", self.chat_id)
            error = str(e) or type(e).__name__
        finally:
            self._finish(stream, error)

    def _finish(self, stream: _Stream, error: str | None) -> None:
        self._save_timer.stop()
        self._prefill_timer.stop()
        complete = bool(stream.eos) and error is None
        if complete:
            stats = {**stream.eos, "new_tokens": stream.eos["new_tokens"] + stream.base_tokens}
        else:
            stats = {"new_tokens": stream.num_tokens, "stopped": error is None}
            if error is not None:
                stats["error"] = error
        if stream.reasoning is not None and stream.thinking:
            stats = {**stats, **format_stats(stream.reasoning, stream.inside)}  # shown apart when reopened
            if stream.widget.thinking_seconds is not None:
                stats["thinking_seconds"] = round(stream.widget.thinking_seconds, 2)
        stats = _with_sources(stats, stream)
        self._write(stream, stats=stats, complete=complete)
        self.filled_context = (  # only the local engine's answers know: a server's "length" may be either limit
            complete
            and stream.eos.get("eos_reason") == "max_new_tokens"
            and getattr(self._job, "context_capped", False)
            and stream.overflow != "stop"
        )
        stream.widget.set_streaming(False)
        stream.widget.set_stats(stats)
        self._job = None
        self._stream = None
        self._task = None
        self.ended.emit(f"The answer stopped with an error: {error}" if error is not None else "", True)

    def _write(self, stream: _Stream, **fields: Any) -> None:
        """Save the answer; what the store refuses stays in memory (and on screen) and is retried."""
        if self._saves.save(stream.message_id, text=stream.text, **fields):
            stream.saved_text = stream.text

    def _drop_widget(self) -> None:
        if self._widget is not None:
            self._widget.deleteLater()  # parentless: Python owns it, but its signal lambdas would keep it alive
            self._widget = None

    def _save_partial(self) -> None:
        stream = self._stream
        if stream is not None and stream.text != stream.saved_text:
            self._write(stream)

    def stop(self) -> None:
        """Stop the answer now; the text so far stays."""
        if self._preparing:
            self._stopping = True  # the job is not started once the prompt is built
        elif self._job is not None and not self._stopping:
            self._stopping = True
            spawn(self._job.cancel(), name=f"stop-chat-{self.chat_id}")

    async def shutdown(self) -> None:
        """Stop any answer and wait until it is saved."""
        self.stop()
        while self._task is not None and not self._task.done():
            await asyncio.wait({self._task})

    def flush(self) -> bool:
        """Save the answer streaming now as it stands (the loop may not run again); False when none streams."""
        stream = self._stream
        if stream is None:
            return False
        stats = _with_sources({"new_tokens": stream.num_tokens, "stopped": True}, stream)
        self._write(stream, stats=stats, complete=False)
        return True


def _with_sources(stats: dict[str, Any], stream: _Stream) -> dict[str, Any]:
    """An answer's stats with the passages it was given, which show under it (app/ui/message_documents.py)."""
    return {**stats, "sources": stream.sources} if stream.sources else stats
