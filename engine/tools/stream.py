"""ToolCallParser: one answer's streamed text -> the user's text and the tool calls in it, as they arrive.

Each family (engine.tools.hermes, llama3, mistral, harmony_calls, gemma) reads its own call syntax; this base
keeps the bookkeeping they share. `feed(text)` returns a ToolDelta: the text that is surely content (a chunk
ending in "<tool_ca" holds those characters back until the next chunk says whether they begin a marker) and the
call deltas (a call's id and name first, then its arguments' fragments). `finish()` gives what was held back
once the answer ends. Whitespace between and after calls is not content.

    parser = tool_format.parser()
    for chunk in answer_chunks:
        delta = parser.feed(chunk)      # delta.content, delta.calls
    delta = parser.finish()
    parser.content, parser.calls        # the whole answer's text and ToolCalls

or, from a job's results, `delta = parser.read_result(result)` (which finishes at the eos result).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from engine.tools.calls import CallDelta, ToolCall, ToolDelta, new_call_id
from engine.tools.jsonscan import JsonCallBody


class ToolCallParser:
    """The base of every family's parser: content and calls out, held text in between.

    Subclasses implement `_read(text)` (all the text not yet read, held text first; whatever may begin a marker
    goes back to `self._held`) and `_end()` (the answer has ended). `reads_raw_text`: the parser reads the job's
    whole text, reasoning and special tokens included (harmony), rather than the answer part only.
    """

    reads_raw_text: ClassVar[bool] = False

    def __init__(self, id_style: str = "openai"):
        self.calls: list[ToolCall] = []
        self.content = ""
        self._id_style = id_style
        self._held = ""
        self._pending = ""  # whitespace after a call, content only if text follows it
        self._out = ToolDelta()

    def feed(self, text: str) -> ToolDelta:
        self._out = ToolDelta()
        held, self._held = self._held, ""
        if held or text:
            self._read(held + text)
        return self._out

    def finish(self) -> ToolDelta:
        self._out = ToolDelta()
        self._end()
        self._pending = ""
        return self._out

    def read_result(self, result: Mapping[str, Any]) -> ToolDelta:
        """Feed one of a job's streaming results: its answer part (its whole text for a parser that reads the
        raw text, or a job that does not split reasoning), finishing at the eos result."""
        raw = self.reads_raw_text or "answer" not in result
        delta = self.feed(result.get("text", "") if raw else result["answer"])
        if result.get("eos"):
            delta.extend(self.finish())
        return delta

    # --- for subclasses ----------------------------------------------------------------------------------

    def _read(self, text: str) -> None:
        raise NotImplementedError

    def _end(self) -> None:
        held, self._held = self._held, ""
        self._text(held)

    def _text(self, text: str) -> None:
        """Content for the user (whitespace right after a call waits to see whether text follows)."""
        if not text:
            return
        if self.calls and not (self._pending + text).strip():
            self._pending += text
            return
        text, self._pending = self._pending + text, ""
        self.content += text
        self._out.content += text

    def _open(self, name: str) -> None:
        call = ToolCall(new_call_id(self._id_style), name)
        self.calls.append(call)
        self._pending = ""
        self._out.add(CallDelta(len(self.calls) - 1, call.id, name, ""))

    def _arguments(self, fragment: str) -> None:
        if fragment and self.calls:
            self.calls[-1].arguments += fragment
            self._out.add(CallDelta(len(self.calls) - 1, arguments=fragment))

    def _take(self, found: tuple[str | None, str]) -> None:
        """What a JsonCallBody gave: a name opens a call, text adds to its arguments."""
        name, args = found
        if name is not None:
            self._open(name)
        self._arguments(args)

    def _end_body(self, body: JsonCallBody, raw: str) -> None:
        """A call's text has ended: take what is left of it; a body that was no call is content after all (`raw`:
        its whole text, markers included)."""
        self._take(body.finish())
        if body.failed:
            self._text(raw)
