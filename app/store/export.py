"""Export a chat as Markdown (the visible thread, to read or share) or as a JSON-able dict (everything: every
version on every branch, to re-import or inspect)."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from app.store.attachments import Attachments
from app.store.chats import Chats
from app.store.messages import Messages
from app.store.records import Message

EXPORT_FORMAT = "tandem-chat"
EXPORT_VERSION = 2  # 2: every version, each message with its parent_id, and the visible thread


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).astimezone().isoformat(timespec="seconds")


def _stat_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def images_folder_name(markdown_path: Path) -> str:
    """The folder beside an exported .md that holds its images ("Cats_images" for "Cats.md"): one per export,
    so the .md and its folder travel together."""
    return f"{markdown_path.stem}_images"


def _heading(message: Message, versions: list[int]) -> str:
    heading = f"## {message.role.capitalize()}"
    if message.column is not None:
        heading += f" (column {message.column + 1})"
    if len(versions) > 1:  # the reader learns that other versions exist (the JSON export has them)
        heading += f" (version {versions.index(message.id) + 1} of {len(versions)})"
    return heading


class Export:
    """A chat written out for reading (Markdown) or for keeping (JSON), as ``store.export``."""

    def __init__(self, chats: Chats, messages: Messages, attachments: Attachments) -> None:
        self._chats = chats
        self._messages = messages
        self._attachments = attachments

    def markdown(self, chat_id: int, include_stats: bool = False, images_folder: str = "images") -> str:
        """The chat's visible thread as Markdown: title, system prompt, each message under its role (with
        "version 2 of 3" where it has others), images linked as `images_folder/<file>` relative to the .md
        (write_markdown copies them there), answers cut short marked as such, and with `include_stats` each
        answer's statistics in italics."""
        chat = self._chats.get(chat_id)
        lines = [f"# {chat.title}", ""]
        about = [f"created {_when(chat.created_at)}"] + ([f"model {chat.model}"] if chat.model else [])
        lines += [f"*Tandem {chat.kind}, {', '.join(about)}*", ""]
        if chat.system_prompt:
            lines += ["## System prompt", "", chat.system_prompt, ""]
        versions = self._messages.versions(chat_id)
        for message in self._messages.thread(chat_id):
            lines += [_heading(message, versions[message.id]), "", message.text, ""]
            for number, sha in enumerate(message.images, start=1):
                link = quote(f"{images_folder}/{self._attachments.path(sha).name}")  # a space in a link ends it
                lines += [f"![image {number}]({link})", ""]
            if not message.complete:
                lines += ["*(stopped before the end)*", ""]
            if include_stats and message.stats:
                lines += [
                    "*" + ", ".join(f"{key}: {_stat_text(value)}" for key, value in message.stats.items()) + "*",
                    "",
                ]
        return "\n".join(lines).rstrip("\n") + "\n"

    def write_markdown(self, chat_id: int, path: str | Path, include_stats: bool = False) -> Path:
        """Write the chat as Markdown to `path` and its images into the folder beside it that the links name
        (images_folder_name), so the export reads the same wherever the two are copied. Returns `path`;
        OSError when either cannot be written."""
        path = Path(path)
        folder = images_folder_name(path)
        text = self.markdown(chat_id, include_stats=include_stats, images_folder=folder)
        shas = {sha for message in self._messages.thread(chat_id) for sha in message.images}
        if shas:
            (path.parent / folder).mkdir(exist_ok=True)
        for sha in sorted(shas):
            source = self._attachments.path(sha)
            shutil.copyfile(source, path.parent / folder / source.name)
        path.write_text(text, encoding="utf-8")
        return path

    def json(self, chat_id: int) -> dict[str, Any]:
        """The chat, all its messages (every version on every branch, with stats, settings and parent_id,
        None for a first message), the ids of the visible thread, and where each attachment file is, as a
        JSON-serialisable dict."""
        chat = self._chats.get(chat_id)
        messages = self._messages.all(chat_id)
        shas = {sha for message in messages for sha in message.images}
        return {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "chat": asdict(chat),
            "messages": [asdict(message) for message in messages],
            "visible_thread": [message.id for message in self._messages.thread(chat_id)],
            "attachments": {sha: str(self._attachments.path(sha)) for sha in sorted(shas)},
        }
