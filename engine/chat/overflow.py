"""What a chat does when it outgrows the context: stop, truncate the middle, or keep a rolling window.

    stop             refuse (ContextOverflow), the conversation is the user's to shorten
    truncate-middle  keep the system prompt and the first exchange, drop the oldest turns after them
    rolling-window   keep the system prompt, drop the oldest turns

Turns are dropped a block at a time (a quarter of the budget), never one by one. Block k ends at the first turn
whose preceding middle weighs k blocks; those bounds depend only on the messages before them, so as a chat
grows the cut stays put until the kept part overflows again, and the kept prefix (and its cached pages) is the
same for every turn in between. After a jump about a quarter of the budget is free: with turns (question and
answer) of T tokens, about budget / (4 T) turns reuse the whole cached prefix and prefill only their new turn
(an 8k context, a 2k answer reserve and 300-token turns: about 5). A window sliding by one turn would change
the first kept token every turn and prefill the whole prompt each time.

    [system][first exchange] | dropped turns ... | [kept turns ...][last user message]
     head (truncate-middle)    `dropped`            the model's view resumes at dropped.stop
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

# The share of the budget one drop frees: larger keeps the prefix stable for more turns, smaller keeps more history.
BLOCK_FRACTION = 4

Messages = Sequence[Mapping[str, Any]]


class OverflowPolicy(str, Enum):
    """How a chat longer than the context is answered (LM Studio's three choices)."""

    STOP = "stop"
    TRUNCATE_MIDDLE = "truncate-middle"
    ROLLING_WINDOW = "rolling-window"

    @classmethod
    def parse(cls, value: str | OverflowPolicy) -> OverflowPolicy:
        """The policy named `value`; ValueError listing the names for anything else."""
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(p.value for p in cls)
            raise ValueError(f"unknown context-overflow policy {value!r}; use one of: {names}") from None


@dataclass(frozen=True)
class View:
    """The messages the model sees, and which of the given messages it no longer sees (an empty range: all)."""

    messages: tuple[Mapping[str, Any], ...]
    dropped: range

    @property
    def first_seen(self) -> int | None:
        """Index of the first message after the dropped ones (where a "no longer seen" divider goes); None when
        nothing was dropped."""
        return self.dropped.stop if self.dropped else None


def keep_messages(
    messages: Messages,
    policy: OverflowPolicy,
    budget: int,
    count: Callable[[Messages], int],
    measure: Callable[[Mapping[str, Any]], int],
) -> View:
    """The view of `messages` (system messages first, as the template gets them) that fits `budget` prompt tokens.

    `count` gives the exact prompt tokens of some messages; `measure` a message's own weight in tokens (only
    where block bounds fall depends on it). The last user message and what follows it are always kept; when
    even that does not fit, the smallest view is returned and the caller's context check refuses it. With
    `stop`, or a conversation that fits, all messages are kept.
    """
    messages = tuple(messages)
    head = _head_length(messages, policy)
    if policy is OverflowPolicy.STOP or count(messages) <= budget:
        return View(messages, range(head, head))
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user" and i >= head), default=len(messages))
    # Candidate starts of the kept part: a user message after the head, so the view resumes at a question.
    starts = [i for i in range(head + 1, last) if messages[i].get("role") == "user"] + [last]
    weights = [0]  # weights[j]: the middle's weight before message head + j
    for m in messages[head:last]:
        weights.append(weights[-1] + measure(m))
    block = max(1, budget // BLOCK_FRACTION)
    tried = head
    for k in range(1, weights[-1] // block + 2):
        start = next((i for i in starts if weights[i - head] >= k * block), last)
        if start == tried:
            continue
        tried = start
        view = View(messages[:head] + messages[start:], range(head, start))
        if start == last or count(view.messages) <= budget:
            return view
    return View(messages[:head] + messages[last:], range(head, last))


def _head_length(messages: Messages, policy: OverflowPolicy) -> int:
    """How many leading messages are never dropped: the system messages, and for truncate-middle the first
    exchange (up to the first assistant reply after the first user message)."""
    head = 0
    while head < len(messages) and messages[head].get("role") == "system":
        head += 1
    if policy is not OverflowPolicy.TRUNCATE_MIDDLE:
        return head
    first_user = next((i for i in range(head, len(messages)) if messages[i].get("role") == "user"), None)
    if first_user is None:
        return head
    reply = next((i for i in range(first_user, len(messages)) if messages[i].get("role") == "assistant"), None)
    return head if reply is None else reply + 1
