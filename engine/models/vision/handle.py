"""What every model's vision handle shares: its image processor, read from the model folder on first use."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class VisionHandle:
    """Base of the `model.vision` objects. Subclasses say how to read their processor (`read_processor`) and
    may check one set by hand (`check_processor`)."""

    def __init__(self, model: Any):
        self.model = model
        self._processor = None

    def read_processor(self, folder: Path) -> Any:
        raise NotImplementedError

    def check_processor(self, value: Any) -> None:
        """Raise ValueError when `value` cannot serve this model; any processor by default."""

    @property
    def processor(self) -> Any:
        """The model's image processor, read from its folder on first use (settable)."""
        if self._processor is None:
            source = self.model.source_path
            if source is None:
                raise RuntimeError(
                    "this model was not loaded from a folder, so it has no preprocessor_config.json; "
                    "set model.vision.processor to an image processor built with from_dict(...)"
                )
            self.processor = self.read_processor(Path(source))
        return self._processor

    @processor.setter
    def processor(self, value: Any) -> None:
        self.check_processor(value)
        self._processor = value
