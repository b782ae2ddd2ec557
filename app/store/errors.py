"""Errors the store raises for the app to show: a file it cannot use, and an id that is not there."""

from __future__ import annotations


class StoreError(Exception):
    """The database cannot be opened or written: not an SQLite file, not Tandem's, from a newer Tandem,
    unreadable, or the disk refused a write. The message names the file and says what to do."""


class NotFoundError(KeyError):
    """No chat, message, preset, model or attachment with that id or name.

    A ``KeyError`` (the contract's type for unknown ids) whose ``str()`` is the plain message
    rather than ``KeyError``'s quoted repr, so the app can show it as is.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "not found"
