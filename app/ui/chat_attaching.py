"""Attaching images and documents to a chat's next message: files (picked, dropped) and pasted or dropped
pictures, each checked off the GUI thread (app/ui/attachments.py) before it joins the tab's strip; a sent
message's documents are stored with it (app.documents.attach)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import QTimer
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QImage
from PySide6.QtWidgets import QFileDialog

from app.documents.attach import keep_documents
from app.documents.prompt import estimate_tokens, room_for_documents
from app.store import StoreError
from app.ui.attachments import ATTACH_FILE_FILTER, AttachmentError, DocumentError, load_file_async, load_qimage_async
from app.ui.chat_answer import conversation
from app.ui.tasks import spawn

log = logging.getLogger(__name__)


class AttachingImages:
    """Mixed into ChatTab (before QWidget, so the drag and drop handlers are Qt's overrides); uses the tab's
    `strip`, `chat_id`, `store`, `backend`, `context_meter`, `settings()`, `show_notice` and `_num_attaching`
    (files still being checked: a send waits)."""

    def attach_files(self, paths: list[str]) -> asyncio.Task:
        """Check image and document files off the GUI thread and add them to the next message."""
        self._num_attaching += 1
        return spawn(self._attach([Path(p) for p in paths], None), name=f"attach-{self.chat_id}")

    def attach_image(self, image: QImage) -> asyncio.Task:
        """Add a pasted image to the next message."""
        self._num_attaching += 1
        return spawn(self._attach([], image), name=f"paste-{self.chat_id}")

    def attach_saved(self, files: list[tuple[Path, str]]) -> None:
        """Put a draft's stored images back in the strip under their own names, checked like any attachment
        (once the event loop runs: a tab is built before it starts)."""
        self._num_attaching += 1  # a send or a draft save waits for them from now on
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            QTimer.singleShot(0, self, lambda: self._spawn_saved(files))
            return
        self._spawn_saved(files)

    def _spawn_saved(self, files: list[tuple[Path, str]]) -> asyncio.Task:
        names = {str(path): name for path, name in files}
        return spawn(self._attach([p for p, _ in files], None, names), name=f"draft-images-{self.chat_id}")

    async def _attach(self, paths: list[Path], image: QImage | None, names: dict[str, str] | None = None) -> None:
        problems = []
        try:
            for path in paths:
                try:
                    attachment = await load_file_async(path, self.backend)
                    if names and str(path) in names:  # a draft's picture, stored by its digest: its own name back
                        attachment = dataclasses.replace(attachment, name=names[str(path)])
                    self.strip.add(attachment)
                    problems += getattr(attachment, "notes", ())  # a document's pages left out (scans)
                except (AttachmentError, DocumentError) as e:
                    problems.append(str(e))
            if image is not None:
                try:
                    self.strip.add(await load_qimage_async(image))
                except AttachmentError as e:
                    problems.append(str(e))
        finally:
            self._num_attaching -= 1
        if problems:
            self._attach_problem = "\n".join(problems)
            self.show_notice(self._attach_problem)
        elif getattr(self, "_attach_problem", "") and self.notice_text() == self._attach_problem:
            self.clear_notice()  # a good attach after a refused one: the refusal is old news
            self._attach_problem = ""

    def store_documents(self, message: Any) -> Any:
        """Keep the strip's documents with the user message just stored, each whole or by passages as it fits the
        context now (the meter's count of the conversation, the answer's token limit), and list them in the
        message's stats for its chips; returns the message as stored. On a refusal the message is taken back and
        StoreError raised, so a message is never sent without its documents."""
        documents = self.strip.documents()
        if not documents:
            return message
        used = self.context_meter.counted  # the conversation and the message, as the model counts them
        if used is None:  # a server whose tokenizer is not here: guessed from their length
            used = sum(estimate_tokens(str(m["content"])) for m in conversation(self.store, self.chat_id, False)[0])
        room = room_for_documents(self.backend.context_length, used, self.settings()["max_new_tokens"])
        try:
            stats = {**message.stats, "documents": keep_documents(self.store, message.id, documents, room)}
            self.store.update_message(message.id, stats=stats)
        except (StoreError, ValueError) as e:
            try:
                self.store.delete_messages_from(self.chat_id, message.id)
            except StoreError as again:
                log.warning("chat %s: a message without its documents stays: %s", self.chat_id, again)
            raise StoreError(f"its documents could not be saved: {e}") from e
        return dataclasses.replace(message, stats=stats)

    def _pick_files(self) -> None:
        dialog = QFileDialog(self, "Attach images or documents", "", ATTACH_FILE_FILTER)
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
            self._attach_problem = "Only files can be attached: images, and .txt, .md, .pdf or .docx documents."
            self.show_notice(self._attach_problem)
        event.acceptProposedAction()
