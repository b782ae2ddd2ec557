"""Reasoning in stored answers: how an answer marks its thinking, kept with it, and the split the window shows.

The engine's parser (engine.reasoning) does the splitting, the one the server uses too; this module is the
app's side of it. A streaming answer arrives split by its backend (AnswerChunk's thinking and answer); a
stored one is split here, once, when it is shown or sent again. An answer is stored as the model wrote it,
tags included, with its format in the stats:

    stats["reasoning"] = {"start": "<think>", "end": "</think>", "inside": false}   (inside: the prompt
    opened the block)   and   stats["thinking_seconds"] = 12.3

A gpt-oss answer is kept with harmony's markers (engine.harmony) and "kind": "harmony" beside them.

so a chat reopened under another model still shows its thinking apart, and the history sent next turn
leaves the thinking out, as reasoning models' templates expect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.reasoning import HarmonyFormat, ReasoningFormat, split_reasoning

THINK = ReasoningFormat()  # <think>...</think>, what reasoning models use unless their template says otherwise


def stored_format(stats: Mapping[str, Any] | None) -> tuple[ReasoningFormat, bool]:
    """(format, inside) kept with an answer; the <think> tags, not inside, for an answer that kept none."""
    kept = (stats or {}).get("reasoning")
    if isinstance(kept, Mapping) and kept.get("kind") == "harmony":
        return HarmonyFormat(), kept.get("inside") is True
    if isinstance(kept, Mapping) and isinstance(kept.get("start"), str) and isinstance(kept.get("end"), str):
        return ReasoningFormat(kept["start"], kept["end"]), kept.get("inside") is True
    return THINK, False


def format_stats(fmt: ReasoningFormat, inside: bool) -> dict[str, Any]:
    kind = {"kind": "harmony"} if isinstance(fmt, HarmonyFormat) else {}
    return {"reasoning": {"start": fmt.start, "end": fmt.end, "inside": inside, **kind}}


def split(text: str, fmt: ReasoningFormat | None, inside: bool = False) -> tuple[str, str]:
    """(thinking, answer) of a whole answer's text."""
    if fmt is None:
        return "", text
    return split_reasoning(text, fmt, fmt.start if inside else "")


def answer_only(text: str, stats: Mapping[str, Any] | None) -> str:
    """A stored answer without its thinking, for the next turn's prompt."""
    return split(text, *stored_format(stats))[1]
