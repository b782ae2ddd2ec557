"""Reading an image processor's options: where a model folder keeps them, and the checks every option shares.

A Hugging Face folder keeps the options in `preprocessor_config.json`, or (newer transformers, which save every
sub-processor of a model into one file) under the `image_processor` key of `processor_config.json`. Each
check raises ValueError naming the file (`source`), the key and the bad value.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from pathlib import Path
from typing import Any

from PIL import Image

from engine.errors import CorruptFileError, MissingFileError

logger = logging.getLogger(__name__)

CONFIG_NAME = "preprocessor_config.json"
PROCESSOR_CONFIG_NAME = "processor_config.json"

_PIL_RESAMPLE_CODES = {int(r): r.name.lower() for r in Image.Resampling}


def read_processor_config(folder: str | Path, purpose: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """(the image processor's options, the file they came from, processor_config.json's whole dict or {}).

    `purpose` finishes the message when neither file has them: "its images cannot be {purpose}".
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingFileError(f"model folder {folder} does not exist: check the path")
    nested = folder / PROCESSOR_CONFIG_NAME
    combined = read_json(nested) if nested.is_file() else {}
    if isinstance(combined.get("image_processor"), dict):
        return combined["image_processor"], str(nested), combined
    path = folder / CONFIG_NAME
    if not path.is_file():
        raise MissingFileError(
            f"{folder} has no {CONFIG_NAME}, so its images cannot be {purpose}: copy {CONFIG_NAME} from the "
            "model's original repository into the folder"
        )
    config = read_json(path)
    if isinstance(config.get("image_processor"), dict):
        config = config["image_processor"]
    return config, str(path), combined


def processor_options(
    config: Any,
    source: str,
    *,
    family: str,
    kinds: Collection[str],
    defaults: dict[str, Any],
    ignored: Collection[str] = (),
    unsupported: Collection[str] = (),
) -> dict[str, Any]:
    """Every option of `defaults` from a processor config dict, a null or absent one taking its default (as
    transformers treats None). The config must name one of `kinds` (class names of `family`'s processor) if
    it names a class, and enable none of `unsupported`; keys known to none of these lists are logged."""
    if not isinstance(config, dict):
        raise ValueError(f"{source} should be a JSON object of options, got {type(config).__name__}")
    class_name = config.get("image_processor_type")
    if class_name is not None and class_name not in kinds:
        raise ValueError(
            f"{source}: image_processor_type {class_name!r} is not a {family} image processor; expected one of "
            f"{', '.join(sorted(kinds))}"
        )
    for key in unsupported:
        if config.get(key):
            raise ValueError(
                f"{source}: {key}={config[key]!r} is not supported by Tandem's {family} image processor "
                "(skipping it would change the pixels the model was trained on); use a model without it"
            )
    if config.get("data_format") not in (None, "channels_first"):
        raise ValueError(f"{source}: data_format={config['data_format']!r} is not supported; use 'channels_first'")
    unknown = sorted(set(config) - set(defaults) - set(ignored) - set(unsupported) - {"image_processor_type"})
    if unknown:
        logger.debug("%s: ignoring keys %s", source, unknown)
    return {key: defaults[key] if config.get(key) is None else config[key] for key in defaults}


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; CorruptFileError for anything else."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFileError(f"{path} is not valid JSON ({exc}): re-download it") from None
    if not isinstance(config, dict):
        found = type(config).__name__
        raise CorruptFileError(f"{path} should hold a JSON object, found {found}: re-download it")
    return config


def bool_option(opts: dict[str, Any], key: str, source: str) -> bool:
    value = opts[key]
    if not isinstance(value, bool):
        raise ValueError(f"{source}: {key} should be true or false, got {value!r}")
    return value


def positive_int(value: Any, key: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{source}: {key} should be a positive whole number, got {value!r}")
    return value


def positive_float(value: Any, key: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{source}: {key} should be a positive number, got {value!r}")
    return float(value)


def resample_code(value: Any, source: str) -> int:
    """A PIL resampling filter's number (`resample` in the options)."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in _PIL_RESAMPLE_CODES:
        codes = ", ".join(f"{code} ({name})" for code, name in sorted(_PIL_RESAMPLE_CODES.items()))
        raise ValueError(f"{source}: resample={value!r} is not a PIL resampling code; use one of {codes}")
    return int(value)


def three_numbers(value: Any, key: str, source: str, *, positive: bool) -> tuple[float, float, float]:
    """Per-channel (R, G, B) values such as image_mean, from one number or three."""
    numbers = [value] * 3 if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if (
        not isinstance(numbers, (list, tuple))
        or len(numbers) != 3
        or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers)
        or (positive and not all(x > 0 for x in numbers))
    ):
        need = "three positive numbers" if positive else "three numbers"
        raise ValueError(f"{source}: {key} should be one number or {need} (R, G, B), got {value!r}")
    return float(numbers[0]), float(numbers[1]), float(numbers[2])
