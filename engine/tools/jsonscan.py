"""Reading JSON as it streams: where a value ends, and a call object's name and arguments as they arrive.

A call written as `{"name": "get_weather", "arguments": {"city": "Paris"}}` gives its name as soon as the name's
string closes and its arguments' text as it grows, so a stream can send `function.arguments` fragments while
the model still writes them. The grammar writes the name first; a model free of it may write the arguments
first, and such a call comes out whole when its object closes.
"""

from __future__ import annotations

import json
import re

_SCALAR = frozenset("0123456789+-.eEtruefalsn")  # what numbers, true, false and null are spelled with
_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGUMENTS = re.compile(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*')


class ValueScanner:
    """Follows one JSON value character by character and says where it ends.

    `feed(text)` returns the index in `text` just past the value's last character once it ends (an object's
    closing brace, a string's closing quote, or, for a number or literal, the first character that is not part
    of it), else None. Whitespace before the value is skipped. Text after the end is not read.
    """

    def __init__(self) -> None:
        self.started = False
        self.done = False
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._scalar = False

    def feed(self, text: str) -> int | None:
        for i, c in enumerate(text):
            if self.done:
                return i
            if not self.started:
                if c.isspace():
                    continue
                self.started = True
                if c in "{[":
                    self._depth = 1
                elif c == '"':
                    self._in_string = True
                else:
                    self._scalar = True
                continue
            if self._scalar:
                if c not in _SCALAR:
                    self.done = True
                    return i
            elif self._in_string:
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == '"':
                    self._in_string = False
                    if self._depth == 0:
                        self.done = True
                        return i + 1
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self.done = True
                    return i + 1
        return None

    def end(self) -> None:
        """The text has ended: a number or literal at the end is complete."""
        if self._scalar:
            self.done = True


class JsonCallBody:
    """One call written as a JSON object with "name" and "arguments" (or Llama's "parameters").

    `feed(chunk)` returns (the name, when this chunk completed it; the arguments' new text) and reads no further
    than the object's closing brace: `rest` is whatever came after it, and `done` is True from then on. A body
    whose keys came in another order gives nothing until it closes and then its name and arguments at once
    (`json.loads`); one that is not a call at all gives nothing, and `failed` says so when it ends.
    """

    def __init__(self) -> None:
        self.text = ""
        self.name: str | None = None
        self.done = False
        self.failed = False
        self.rest = ""
        self._outer = ValueScanner()
        self._args_at: int | None = None  # where the arguments' value begins in `text`
        self._args = ValueScanner()
        self._name_end = 0  # where the name's string ends in `text` (0: not read yet); the arguments follow
        self._sent = 0  # characters of the arguments given so far

    def feed(self, chunk: str) -> tuple[str | None, str]:
        if self.done:
            self.rest += chunk
            return None, ""
        end = self._outer.feed(chunk)
        if end is not None:
            chunk, self.rest = chunk[:end], chunk[end:]
        self.text += chunk
        name = None
        if self.name is None and not self._name_end:
            found = _NAME.match(self.text)
            if found is not None:
                self.name = name = json.loads(f'"{found.group(1)}"')
                self._name_end = found.end()
        if self._name_end and self._args_at is None:
            found = _ARGUMENTS.match(self.text, self._name_end)
            if found is not None and found.end() < len(self.text):
                self._args_at = found.end()
        args = ""
        if self._args_at is not None and not self._args.done:
            begin = self._args_at + self._sent
            stop = self._args.feed(self.text[begin:])
            args = self.text[begin:] if stop is None else self.text[begin : begin + stop]
            self._sent += len(args)
        if end is not None:
            self.done = True
            return self._close(name, args)
        return name, args

    def finish(self) -> tuple[str | None, str]:
        """The text has ended (the format's end marker, or the answer's end) with the object still open or not
        streamed: what is left to give."""
        if self.done:
            return None, ""
        self.done = True
        self._args.end()
        return self._close(None, "")

    @property
    def arguments_done(self) -> bool:
        return self._args.done

    def _close(self, name: str | None, args: str) -> tuple[str | None, str]:
        if self._args_at is not None:  # streamed: the arguments went out as they came
            return name, args
        try:
            call = json.loads(self.text)
        except ValueError:
            call = None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            self.failed = self.name is None
            return name, "" if self.failed else "{}"
        values = call.get("arguments", call.get("parameters"))
        text = values if isinstance(values, str) else json.dumps({} if values is None else values, ensure_ascii=False)
        if self.name is None:
            self.name = name = call["name"]
        return name, text
