"""The harmony chat format of OpenAI's gpt-oss models: recognising it, and splitting a streamed reply into the
thinking and the answer its channels hold.

Every message is `<|start|>{header}<|message|>{content}<|end|>`. An assistant's header names its channel, and a
tool call's its recipient and content type:

    <|start|>assistant<|channel|>analysis<|message|>The user wants colours ...<|end|>
    <|start|>assistant<|channel|>final<|message|>Red, green and blue.<|return|>
    <|start|>assistant<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{"q": 1}<|call|>

The prompt ends with `<|start|>assistant`, so the model writes its first header itself. The analysis channel is
its thinking; final, and commentary addressed to no one (a preamble), the answer; a message with a recipient is
a tool call, kept apart in `HarmonyParser.calls`. <|return|> and <|call|> end the reply (HARMONY_STOPS), <|end|>
only a message. The markers are special tokens: a job decodes them so this parser sees them, and the parts it
gives leave them out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
RETURN, CALL, CONSTRAIN = "<|return|>", "<|call|>", "<|constrain|>"
MARKERS = (START, CHANNEL, MESSAGE, END, RETURN, CALL, CONSTRAIN)
MESSAGE_ENDS = (END, RETURN, CALL)
HARMONY_STOPS = (RETURN, CALL)  # end the whole reply; <|end|> between analysis and final must not
ANALYSIS_OPEN = CHANNEL + "analysis" + MESSAGE  # what a reply that thinks begins with

# A header is a few words ("assistant<|channel|>final"); text running on this long without <|message|> is a model
# writing plain text under a harmony template, shown as the answer rather than held back for ever.
MAX_HEADER_CHARS = 160

_MARKER = re.compile("|".join(map(re.escape, MARKERS)))
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CONTENT_TYPE = re.compile(re.escape(CONSTRAIN) + r"\s*([^\s<]+)")


def is_harmony(template_source: str | None, vocabulary: Iterable[str] = ()) -> bool:
    """Whether a model speaks harmony: its chat template writes channels, or its vocabulary has the channel and
    message markers as tokens (o200k_harmony)."""
    if CHANNEL in (template_source or ""):
        return True
    pieces = set(vocabulary)
    return CHANNEL in pieces and MESSAGE in pieces


def opens_analysis(prompt_text: str) -> bool:
    """Whether generation after `prompt_text` begins inside an analysis message (the prompt opened it)."""
    header = _open_header(prompt_text)
    return header is not None and _channel(header) == "analysis"


@dataclass
class HarmonyCall:
    """A message addressed to a tool: its recipient ("functions.lookup"), channel, content type ("json" after
    <|constrain|>, None when the header names none) and its text so far."""

    recipient: str
    channel: str | None
    content_type: str | None
    arguments: str = ""


class HarmonyParser:
    """Splits one harmony reply's streamed text into reasoning and answer (the interface of
    engine.reasoning.ReasoningParser).

    `feed(chunk)` returns the (reasoning, answer) text the chunk completes, markers and headers left out;
    `finish()` the rest held back once the stream ends. A marker split across chunks is held until it is
    whole. Messages of one kind are set apart by a blank line. `state` is "reasoning" inside an analysis
    message and "answer" otherwise; `ended_reasoning` is True once an analysis message has closed.
    """

    def __init__(self, prompt_text: str = ""):
        self.calls: list[HarmonyCall] = []
        self.ended_reasoning = False
        self._held = ""  # text that may begin a marker
        self._header: str | None = ""  # the header being read; None inside a message's content
        self._channel: str | None = None
        self._call: HarmonyCall | None = None
        self._has_text = False  # the open message has emitted text
        self._wrote: set[str] = set()  # "reasoning" / "answer" once text went there
        self._seen_marker = False  # a reply without any marker is plain text: its "header" is the answer
        header = _open_header(prompt_text)
        if header is not None:  # the prompt opened a message: the reply begins in its content
            self._seen_marker = True
            self._open(header)

    @property
    def state(self) -> str:
        return "reasoning" if self._header is None and self._destination() == "reasoning" else "answer"

    def feed(self, chunk: str) -> tuple[str, str]:
        out: dict[str, list[str]] = {"reasoning": [], "answer": []}
        text = self._held + chunk
        self._held = ""
        while text:
            found = _MARKER.search(text)
            if found is None:
                keep = held_suffix(text, MARKERS)
                self._text(text[: len(text) - keep], out)
                self._held = text[len(text) - keep :]
                break
            self._text(text[: found.start()], out)
            self._marker(found.group(), out)
            text = text[found.end() :]
        return "".join(out["reasoning"]), "".join(out["answer"])

    def finish(self) -> tuple[str, str]:
        """The text held back at the end of the stream: a partial marker (text after all), and a reply that
        never wrote a marker (plain text, not a header). A header cut off by the token limit is dropped."""
        out: dict[str, list[str]] = {"reasoning": [], "answer": []}
        held, self._held = self._held, ""
        self._text(held, out)
        if self._header and not self._seen_marker:
            self._plain_reply(out)
        return "".join(out["reasoning"]), "".join(out["answer"])

    # --- text and markers ------------------------------------------------------------------------------------

    def _text(self, text: str, out: dict[str, list[str]]) -> None:
        if not text:
            return
        if self._header is not None:
            self._header += text
            if len(self._header) > MAX_HEADER_CHARS:
                self._plain_reply(out)
            return
        if self._call is not None:
            self._call.arguments += text
            return
        where = self._destination()
        if not self._has_text and where in self._wrote:
            out[where].append("\n\n")  # a second message of the same kind
        self._has_text = True
        self._wrote.add(where)
        out[where].append(text)

    def _marker(self, marker: str, out: dict[str, list[str]]) -> None:
        self._seen_marker = True
        if self._header is not None:  # reading a header
            if marker == MESSAGE:
                self._open(self._header)
            elif marker in (CHANNEL, CONSTRAIN):
                self._header += marker  # part of the header: the channel and content type follow it
            else:  # <|start|> begins the header afresh; an end marker closes a message that had no content
                self._header = ""
            return
        if marker in MESSAGE_ENDS or marker in (START, CHANNEL):
            # <|start|> or <|channel|> without <|end|> before it: the model began the next message anyway
            self._close()
            self._header = CHANNEL if marker == CHANNEL else ""
        # <|message|> or <|constrain|> inside content: stray markers, left out

    def _open(self, header: str) -> None:
        """Content begins after `header` (the text between <|start|> and <|message|>)."""
        self._header = None
        self._channel = _channel(header)
        self._has_text = False
        recipient = _RECIPIENT.search(header)
        if recipient is not None:
            content_type = _CONTENT_TYPE.search(header)
            self._call = HarmonyCall(recipient.group(1), self._channel, content_type and content_type.group(1))
            self.calls.append(self._call)

    def _close(self) -> None:
        if self._call is None and self._destination() == "reasoning":
            self.ended_reasoning = True
        self._call = None
        self._channel = None

    def _destination(self) -> str:
        return "reasoning" if self._channel == "analysis" else "answer"

    def _plain_reply(self, out: dict[str, list[str]]) -> None:
        """What was read as a header is answer text: the model is not writing harmony (here)."""
        text = _MARKER.sub("", self._header or "")
        self._header = None
        self._channel = None
        self._has_text = False
        self._text(text, out)


def held_suffix(text: str, markers: Iterable[str]) -> int:
    """Length of the longest end of `text` that is a proper beginning of one of `markers` (0 when none)."""
    markers = tuple(markers)
    for n in range(min(max(map(len, markers)) - 1, len(text)), 0, -1):
        if any(m.startswith(text[-n:]) for m in markers):
            return n
    return 0


def _channel(header: str) -> str | None:
    found = _CHANNEL.search(header)
    return found.group(1) if found else None


def _open_header(prompt_text: str) -> str | None:
    """The header of the message `prompt_text` leaves open for the model to write the content of, or None when
    it leaves none open (it ends with `<|start|>assistant`, or not in harmony at all)."""
    at = prompt_text.rfind(MESSAGE)
    if at < 0 or any(m in prompt_text[at:] for m in (START, CHANNEL, *MESSAGE_ENDS)):
        return None
    begin = max(prompt_text.rfind(m, 0, at) for m in (START, *MESSAGE_ENDS))
    return prompt_text[max(begin, 0) : at]
