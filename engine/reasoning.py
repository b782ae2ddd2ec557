"""Reasoning in an answer: which part of the streamed text is the model thinking, and which is the answer.

Reasoning models (Qwen3, the DeepSeek-R1 distills, QwQ) write their thinking between tags before the answer:

    <think>\\nThe user wants three colours ...\\n</think>\\n\\nRed, green and blue.

Some templates open the block themselves, so the generated text starts inside it with no opening tag
(the DeepSeek-R1 distills end the prompt with "<think>\\n"); Qwen3's template, with enable_thinking off,
writes an empty block into the prompt, so everything generated is answer. Which of these applies is read
from the rendered prompt, not guessed from the model's name.

OpenAI's gpt-oss models write theirs in harmony's analysis channel instead (engine.harmony): HarmonyFormat
is their format, with a parser of the same interface.

One parser serves the app (a "Thinking" block apart from the answer) and the server (`reasoning_content`).
It works on text chunks as they stream, however the tags are split across them: a chunk ending in "</th"
holds those characters back until the next chunk says whether they begin the tag. Only a block at the
start counts: once the answer has begun, a "<think>" in it is text (a model explaining the tags, say).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

from engine.harmony import ANALYSIS_OPEN, END, HARMONY_STOPS, HarmonyParser, is_harmony, opens_analysis

# Tag pairs reasoning models use, most common first. A template or vocabulary naming the closing tag declares
# the pair.
KNOWN_TAGS = (("<think>", "</think>"), ("<thinking>", "</thinking>"), ("<reasoning>", "</reasoning>"))
# The reasoning efforts a template's `reasoning_effort` takes (gpt-oss's "Reasoning: low|medium|high").
REASONING_EFFORTS = ("low", "medium", "high")


@dataclasses.dataclass(frozen=True)
class ReasoningFormat:
    """How a model marks its reasoning: the tags around it, whether its template reads `enable_thinking` (so a
    chat can switch thinking off) and `reasoning_effort` (so a chat can ask for more or less of it, one of
    REASONING_EFFORTS). `decodes_special_tokens`: the marks are special tokens, which a job must decode for
    the parser to see them; `stop_markers`: tokens that end a reply in this format, beside the eos tokens."""

    start: str = "<think>"
    end: str = "</think>"
    toggle: bool = False
    effort: bool = False
    decodes_special_tokens: ClassVar[bool] = False
    stop_markers: ClassVar[tuple[str, ...]] = ()

    def starts_inside(self, prompt_text: str) -> bool:
        """Whether generation after `prompt_text` begins inside the reasoning block: the prompt's last tag
        is an opening one (the template opened the block for the model)."""
        opened, closed = prompt_text.rfind(self.start), prompt_text.rfind(self.end)
        return opened >= 0 and opened > closed and not prompt_text[opened + len(self.start) :].strip()

    def parser(self, prompt_text: str = "") -> ReasoningParser:
        """A parser for one answer generated after `prompt_text`."""
        return ReasoningParser(self, inside=self.starts_inside(prompt_text))


@dataclasses.dataclass(frozen=True)
class HarmonyFormat(ReasoningFormat):
    """gpt-oss's harmony channels (engine.harmony): the thinking is the analysis channel's messages, the answer
    the final channel's. `start` and `end` are what an analysis message begins and ends with."""

    start: str = ANALYSIS_OPEN
    end: str = END
    decodes_special_tokens: ClassVar[bool] = True
    stop_markers: ClassVar[tuple[str, ...]] = HARMONY_STOPS

    def starts_inside(self, prompt_text: str) -> bool:
        return opens_analysis(prompt_text)

    def parser(self, prompt_text: str = "") -> HarmonyParser:
        return HarmonyParser(prompt_text)


def reasoning_format(template_source: str | None, vocabulary: Any = ()) -> ReasoningFormat | None:
    """How a model marks its reasoning, from its chat template's source and its vocabulary (token strings; a
    tokenizer's added tokens are enough): harmony's channels, or tags; None for a model that does neither."""
    source = template_source or ""
    pieces = set(vocabulary)
    effort = bool(re.search(r"\breasoning_effort\b", source))
    if is_harmony(source, pieces):
        return HarmonyFormat(effort=effort)
    for start, end in KNOWN_TAGS:
        if end in source or (start in pieces and end in pieces):
            toggle = bool(re.search(r"\benable_thinking\b", source))
            return ReasoningFormat(start, end, toggle=toggle, effort=effort)
    return None


def reasoning_format_of(template: Any, tokenizer: Any = None) -> ReasoningFormat | None:
    """reasoning_format from a ChatTemplate (its `source`) and a Tokenizer (its added tokens, where reasoning
    tags live in Qwen3's and the R1 distills' vocabularies, and harmony's markers in gpt-oss's)."""
    added = getattr(getattr(tokenizer, "backend", None), "get_added_tokens_decoder", None)
    pieces = [t.content for t in added().values()] if callable(added) else []
    return reasoning_format(getattr(template, "source", None), pieces)


class ReasoningParser:
    """Splits one answer's streamed text into reasoning and answer.

    `feed(chunk)` returns the (reasoning, answer) text the chunk completes; `finish()` the rest held back
    once the stream ends. Concatenated, the reasoning pieces are the text between the tags and the answer
    pieces everything else, tags left out; whitespace between the closing tag and the answer is dropped.
    `state` is "reasoning" or "answer" (where the next text goes); `ended_reasoning` is True once a
    reasoning block has closed.
    """

    def __init__(self, fmt: ReasoningFormat, inside: bool = False):
        self.format = fmt
        self.state = "reasoning" if inside else "answer"
        self.ended_reasoning = False
        self._held = ""  # text that may begin a tag
        self._answer_started = False  # answer text other than whitespace was emitted: no tag opens after it
        self._reasoning_started = False
        self._lead = ""  # whitespace before anything else: the answer's, unless a block opens after it

    def feed(self, chunk: str) -> tuple[str, str]:
        reasoning: list[str] = []
        answer: list[str] = []
        text = self._held + chunk
        self._held = ""
        while text:
            tag = self._tag()
            if tag is None:  # past the block: all answer
                self._emit(text, reasoning, answer)
                break
            at = text.find(tag)
            keep = 0 if at >= 0 else _partial_tag_suffix(text, tag)  # may begin the tag: wait for more
            before = text[:at] if at >= 0 else text[: len(text) - keep]
            if self.state == "answer" and before.strip():  # the answer began without a block
                self._emit(text, reasoning, answer)
                break
            self._emit(before, reasoning, answer)
            if at < 0:
                self._held = text[len(before) :]
                break
            text = text[at + len(tag) :]
            self._switch()
        return "".join(reasoning), "".join(answer)

    def finish(self) -> tuple[str, str]:
        """The text held back at the end of the stream (a partial tag that never completed)."""
        reasoning: list[str] = []
        answer: list[str] = []
        self._emit(self._held, reasoning, answer)
        self._held = ""
        if self._lead and not self._answer_started:  # an answer of whitespace alone
            answer.append(self._lead)
            self._lead = ""
        return "".join(reasoning), "".join(answer)

    def _tag(self) -> str | None:
        """The tag that would change state next, or None when none can any more."""
        if self.state == "reasoning":
            return self.format.end
        if self.ended_reasoning or self._answer_started:
            return None
        return self.format.start

    def _switch(self) -> None:
        if self.state == "reasoning":
            self.state, self.ended_reasoning = "answer", True
        else:
            self.state, self._lead = "reasoning", ""

    def _emit(self, text: str, reasoning: list[str], answer: list[str]) -> None:
        if not text:
            return
        if self.state == "reasoning":
            if not self._reasoning_started:
                text = text.lstrip()
                self._reasoning_started = bool(text)
            reasoning.append(text)
            return
        if not self._answer_started:
            if self.ended_reasoning:
                text = text.lstrip()  # "</think>\n\n" then the answer
                if not text:
                    return
            elif not text.strip():
                self._lead += text  # whitespace before a block that may still open: held until we know
                return
            else:
                text, self._lead = self._lead + text, ""
            self._answer_started = True
        answer.append(text)


def split_reasoning(text: str, fmt: ReasoningFormat | None, prompt_text: str = "") -> tuple[str, str]:
    """(reasoning, answer) of a whole answer: what a parser gives the text in one chunk. With no format,
    no reasoning."""
    if fmt is None:
        return "", text
    parser = fmt.parser(prompt_text)
    reasoning, answer = parser.feed(text)
    rest_reasoning, rest_answer = parser.finish()
    return (reasoning + rest_reasoning).rstrip(), answer + rest_answer


def _partial_tag_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `tag` (0 when none)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
