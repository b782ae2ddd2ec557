"""User-facing errors of the engine.

Each message says what was wrong (naming the file or value) and what to do about it;
the app shows them verbatim.
"""

from __future__ import annotations


class ModelLoadError(Exception):
    """A model could not be loaded: missing, corrupt, mismatched or unsupported files."""


class MissingFileError(ModelLoadError, FileNotFoundError):
    """A path or a file the model needs does not exist."""


class CorruptFileError(ModelLoadError):
    """A checkpoint or config file exists but cannot be parsed (truncated, wrong format)."""


class TensorMismatchError(ModelLoadError):
    """A tensor is missing from the checkpoint or has a shape the config does not allow."""


class UnsupportedArchitectureError(ModelLoadError):
    """The checkpoint names an architecture the engine has no implementation for (`architecture`, when known,
    lets the loader name the supported ones beside it)."""

    def __init__(self, message: str, architecture: str | None = None):
        super().__init__(message)
        self.architecture = architecture


class TokenizerLoadError(ModelLoadError):
    """No usable tokenizer could be built from the model's files."""


class ChatTemplateError(Exception):
    """A chat template failed to render: a syntax error, a raised exception, or a sandbox breach."""


class StarterFetchError(Exception):
    """The starter model could not be obtained (no network, pip failure, checksum mismatch)."""


class ImageError(ValueError):
    """An image could not be used: not an image, truncated, too large, or in a form that cannot be read."""
