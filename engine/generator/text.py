"""Per-job output text: stop strings, banned strings and held text, at token granularity.

Text that could still turn into a stop or banned string is held back. The held region always starts at a
token boundary, so a banned string can be undone by dropping whole tokens that were never shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TextUpdate:
    emitted: str = ""  # text safe to show now
    stop_string: str | None = None  # a stop string completed: the job ends, the string is not shown
    banned: tuple[int, str] | None = None  # (token index to rewind to, the banned string matched)


@dataclass
class TextTracker:
    """Follows one job's generated text; `tokens` are indices into the job's generated tokens."""

    stop_strings: tuple[str, ...] = ()
    banned_strings: tuple[str, ...] = ()
    held: str = ""
    held_tokens: list[tuple[int, int]] = field(default_factory=list)  # (token index, offset in `held`)
    emitted: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._watch = tuple(s for s in self.stop_strings + self.banned_strings if s)
        self._lower_banned = tuple(s.lower() for s in self.banned_strings if s)

    @property
    def text(self) -> str:
        return "".join(self.emitted)

    def add(self, token_index: int, chunk: str) -> TextUpdate:
        """Take the text of generated token `token_index` (possibly empty while a character is incomplete)."""
        self.held_tokens.append((token_index, len(self.held)))
        self.held += chunk
        buf = self.held
        # Stop strings end the job: everything before the earliest one is shown.
        first_stop = None
        for s in self.stop_strings:
            if s and (i := buf.find(s)) >= 0 and (first_stop is None or i < first_stop[0]):
                first_stop = (i, s)
        # Banned strings (case-insensitive) rewind to the token where they began.
        low = buf.lower()
        first_ban = None
        for s in self._lower_banned:
            if (i := low.find(s)) >= 0 and (first_ban is None or i < first_ban[0]):
                first_ban = (i, s)
        if first_ban is not None and (first_stop is None or first_ban[0] < first_stop[0]):
            idx = self._token_at(first_ban[0])
            return TextUpdate(banned=(idx, buf[first_ban[0] : first_ban[0] + len(first_ban[1])]))
        if first_stop is not None:
            out = buf[: first_stop[0]]
            self.emitted.append(out)
            self.held = buf[first_stop[0] + len(first_stop[1]) :]
            self.held_tokens = []
            return TextUpdate(emitted=out, stop_string=first_stop[1])
        keep_from = self._hold_start(buf, low)
        out = buf[:keep_from]
        self.held = buf[keep_from:]
        self.held_tokens = [(t, o - keep_from) for t, o in self.held_tokens if o >= keep_from]
        if out:
            self.emitted.append(out)
        return TextUpdate(emitted=out)

    def rewind(self, token_index: int) -> None:
        """Forget held text from generated token `token_index` on (those tokens are being undone)."""
        for t, off in self.held_tokens:
            if t >= token_index:
                self.held = self.held[:off]
                break
        self.held_tokens = [(t, o) for t, o in self.held_tokens if t < token_index]

    def flush(self) -> str:
        """The job ended without a stop string: everything held is complete output."""
        out, self.held, self.held_tokens = self.held, "", []
        if out:
            self.emitted.append(out)
        return out

    def _hold_start(self, buf: str, low: str) -> int:
        """Offset from which `buf` must be held: the earliest suffix that a watched string could start."""
        start = len(buf)
        for s in self._watch:
            target, hay = (s.lower(), low) if s.lower() in self._lower_banned else (s, buf)
            for k in range(min(len(target) - 1, len(hay)), 0, -1):
                if hay.endswith(target[:k]):
                    start = min(start, len(buf) - k)
                    break
        if start == len(buf):
            return start
        # Snap back to the start of the token that holds `start`, so held text is whole tokens.
        for _t, off in reversed(self.held_tokens):
            if off <= start:
                return off
        return 0

    def _token_at(self, offset: int) -> int:
        """The first token whose text covers `offset` (tokens that completed no character share an offset)."""
        best_off, idx = -1, self.held_tokens[0][0]
        for t, off in self.held_tokens:
            if best_off < off <= offset:
                best_off, idx = off, t
        return idx
