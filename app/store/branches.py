"""A chat's messages as a tree: each message's parent, the versions of a message, and the visible thread.

    u1 ─┬─ a1               Regenerating a1 wrote a2 beside it; editing u1 and sending wrote u1' beside it,
        └─ a2 ── u2 ── a3   with a continuation of its own. Messages with the same parent are versions of one
    u1' ── a4               another. Among them the one chosen last is shown (a message is chosen when it is
                            written, and again when the user switches to it).

The visible thread starts at the chosen first message and follows each message's chosen child down to one
without children: it is what the chat shows, what is sent to the model and what Markdown export writes.

Stored in two columns of ``messages`` (schema version 3, app/store/migrations.py):

- ``parent_id``: the message this one answers or follows; 0 for a first message. NULL means "the message
  before it in the chat": every message written before branches existed, so the upgrade rewrites no row
  and a history of a million messages upgrades as fast as a small one.
- ``selected_at``: when the user last switched to this version; NULL: when it was written (``created_at``).

A message whose parent is gone (a row lost with a damaged page, app/store/recovery.py) follows the message
before it, as a NULL does: what survives of a thread still reads as one thread, only the lost rows missing.
Parents always come before their children in id order, so the tree can have no cycle.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

ROOT = 0  # parent_id of a first message (SQLite rowids start at 1)


class Tree:
    """The shape of one chat, from ``(id, parent_id, chosen_at)`` rows in id order (``parent_id`` as stored)."""

    def __init__(self, rows: Iterable[tuple[int, int | None, float]]) -> None:
        rows = list(rows)
        known = {row[0] for row in rows}
        self.parent: dict[int, int | None] = {}  # None: a first message
        self.children: dict[int | None, list[int]] = defaultdict(list)  # each in id order: oldest version first
        self._chosen_at: dict[int, float] = {}
        previous = None
        for message_id, stored, chosen_at in rows:
            if stored == ROOT:
                parent = None
            elif stored in known and stored < message_id:  # (a parent is always written before its child)
                parent = stored
            else:  # NULL: written before branches; or its parent was lost: it follows the message before it
                parent = previous
            self.parent[message_id] = parent
            self.children[parent].append(message_id)
            self._chosen_at[message_id] = chosen_at
            previous = message_id

    def __contains__(self, message_id: object) -> bool:
        return message_id in self.parent

    def _chosen(self, parent: int | None) -> int | None:
        versions = self.children.get(parent)
        if not versions:
            return None
        return max(versions, key=lambda message_id: (self._chosen_at[message_id], message_id))

    def is_chosen(self, message_id: int) -> bool:
        """Whether ``message_id`` is the version of its message shown under its parent."""
        return self._chosen(self.parent[message_id]) == message_id

    def thread(self) -> list[int]:
        """The visible thread: message ids from the first message to the last."""
        path: list[int] = []
        node = self._chosen(None)
        while node is not None:  # ends: each message has one parent, so the walk down never comes back
            path.append(node)
            node = self._chosen(node)
        return path

    def leaf(self) -> int | None:
        """The last message of the visible thread (where a new message goes), None for an empty chat."""
        thread = self.thread()
        return thread[-1] if thread else None

    def path_to(self, message_id: int) -> list[int]:
        """The thread that leads to ``message_id`` and ends with it, first message first."""
        path = [message_id]
        seen = {message_id}
        parent = self.parent[message_id]
        while parent is not None and parent not in seen:  # (seen: a damaged file must not loop forever)
            path.append(parent)
            seen.add(parent)
            parent = self.parent[parent]
        return path[::-1]

    def versions(self, message_id: int) -> list[int]:
        """``message_id`` and the other versions of it (the same parent), oldest first."""
        return list(self.children[self.parent[message_id]])

    def descendants(self, message_id: int) -> list[int]:
        """``message_id`` and every message below it, on every branch."""
        found = [message_id]
        seen = {message_id}
        for node in found:  # grows while it is read: breadth first
            for child in self.children.get(node, ()):
                if child not in seen:
                    seen.add(child)
                    found.append(child)
        return found
