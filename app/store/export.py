"""Export a chat as Markdown (the visible thread, to read or share) or as a JSON-able dict (everything: every
version on every branch, to re-import or inspect)."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from typing import Any

from app.store.messages import MessagesMixin
from app.store.records import Message

EXPORT_FORMAT = "tandem-chat"
EXPORT_VERSION = 2  # 2: every version, each message with its parent_id, and the visible thread


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).astimezone().isoformat(timespec="seconds")


def _stat_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _heading(message: Message, versions: list[int]) -> str:
    heading = f"## {message.role.capitalize()}"
    if message.column is not None:
        heading += f" (column {message.column + 1})"
    if len(versions) > 1:  # the reader learns that other versions exist (the JSON export has them)
        heading += f" (version {versions.index(message.id) + 1} of {len(versions)})"
    return heading


class ExportMixin(MessagesMixin):
    """Export methods of :class:`app.store.Store`."""

    def export_markdown(self, chat_id: int) -> str:
        """The chat's visible thread as Markdown: title, system prompt, each message under its role (with
        "version 2 of 3" where it has others), images as file links, answer stats in italics, answers cut
        short marked as such."""
        chat = self.get_chat(chat_id)
        lines = [f"# {chat.title}", ""]
        about = [f"created {_when(chat.created_at)}"] + ([f"model {chat.model}"] if chat.model else [])
        lines += [f"*Tandem {chat.kind}, {', '.join(about)}*", ""]
        if chat.system_prompt:
            lines += ["## System prompt", "", chat.system_prompt, ""]
        versions = self.message_versions(chat_id)
        for message in self.messages(chat_id):
            lines += [_heading(message, versions[message.id]), "", message.text, ""]
            for number, sha in enumerate(message.images, start=1):
                lines += [f"![image {number}]({self.attachment_path(sha).as_uri()})", ""]
            if not message.complete:
                lines += ["*(stopped before the end)*", ""]
            if message.stats:
                lines += [
                    "*" + ", ".join(f"{key}: {_stat_text(value)}" for key, value in message.stats.items()) + "*",
                    "",
                ]
        return "\n".join(lines).rstrip("\n") + "\n"

    def export_json(self, chat_id: int) -> dict[str, Any]:
        """The chat, all its messages (every version on every branch, with stats, settings and parent_id,
        None for a first message), the ids of the visible thread, and where each attachment file is, as a
        JSON-serialisable dict."""
        chat = self.get_chat(chat_id)
        messages = self.all_messages(chat_id)
        shas = {sha for message in messages for sha in message.images}
        return {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "chat": asdict(chat),
            "messages": [asdict(message) for message in messages],
            "visible_thread": [message.id for message in self.messages(chat_id)],
            "attachments": {sha: str(self.attachment_path(sha)) for sha in sorted(shas)},
        }
