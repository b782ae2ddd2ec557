"""Where models come from: describing a model on disk and downloading one from the Hugging Face Hub.

No Qt here: these are blocking functions. The service (or a worker thread of the UI) calls them off the
GUI thread and turns `progress(fraction)` into signals.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from engine.loading.builtin import demo_vision_available, demo_vision_path
from engine.loading.starter import STARTER_NAME, starter_path
from engine.model_info import ModelInfo, read_model_info
from engine.models.registry import supported_architectures, vision_architectures
from engine.paths import models_dir

# The catalogue's engine facts, for the UI (which reaches the engine through app.service only).
__all__ = ["STARTER_NAME", "ModelInfo", "models_dir", "starter_path", "supported_architectures", "vision_architectures"]

log = logging.getLogger(__name__)

Progress = Callable[[float], None]

# Top-level files an HF folder needs: config, weights, tokenizer and chat template. Other weight formats
# (.bin, .onnx, .h5) and sub-folders (original/, onnx/) are skipped: the engine reads none of them.
_FOLDER_FILE = re.compile(r"[^/]+\.(json|safetensors|jinja)|tokenizer\.model")
_REPO_ID = re.compile(r"[\w.-]+/[\w.-]+")
_TRUTHY = {"1", "on", "yes", "true"}
# config.json architectures whose checkpoints hold a vision tower the engine runs (engine/models/llava.py).
VISION_ARCHITECTURES = frozenset(vision_architectures())
DEMO_VISION_NAME = "Demo vision model"


class HubDownloadError(Exception):
    """A model could not be downloaded from the Hugging Face Hub (offline, no such repo, gated, no usable files)."""


def model_display_name(path: str | Path) -> str:
    """A short name for a model: the .gguf file's stem or the folder's name."""
    path = Path(path)
    return path.stem if path.suffix.lower() == ".gguf" else path.name


# ----------------------------------------------------------------------------------------------- describe


def starter_info() -> ModelInfo:
    """The starter's card before it is downloaded. The file is pinned by its sha256 (STARTER_SHA256), so these
    figures are fixed; tests/app/service/test_catalog.py checks them against the file itself."""
    return ModelInfo(
        path=starter_path(),
        name=model_display_name(STARTER_NAME),
        format="gguf",
        architecture="llama",
        engine_architecture="LlamaForCausalLM",
        size_bytes=98_362_432,
        num_parameters=134_515_008,
        quantization="Q4_1",
        context_length=8192,
        can_see_images=False,
        num_layers=30,
        num_kv_heads=3,
        head_dim=64,
        packed_bytes=96_436_224,
        num_float_parameters=35_136,
    )


def model_info(path: str | Path) -> ModelInfo:
    """The card of a model: read from its headers (engine.model_info), or for the starter not downloaded yet,
    from this catalog. Raises as read_model_info does."""
    path = Path(path).expanduser()
    if not path.exists() and path == starter_path():
        return starter_info()
    return read_model_info(path)


def describe_model(path: str | Path) -> dict[str, Any]:
    """What a model file or folder is, read from its headers without loading weights.

    Returns {"path", "name", "format" ("gguf" or "huggingface"), "architecture", "supported",
    "size_bytes", "num_parameters", "context_length" (None when unknown), "quantization" (GGUF file type,
    else its dominant tensor type, or the checkpoint dtype; None when unknown), "can_see_images" (True for a
    Hugging Face folder of a vision-language architecture the engine runs, such as
    LlavaForConditionalGeneration; GGUF files are text-only here)}: `model_info(path)` as a dict.
    Raises MissingFileError when `path` does not exist, CorruptFileError when its header or
    config.json cannot be read, ModelLoadError when it is neither a .gguf file nor a model folder.
    """
    info = read_model_info(path)
    return {
        "path": str(Path(path).expanduser()),
        "name": info.name,
        "format": info.format,
        "architecture": info.architecture,
        "supported": info.supported,
        "size_bytes": info.size_bytes,
        "num_parameters": info.num_parameters,
        "context_length": info.context_length,
        "quantization": info.quantization,
        "can_see_images": info.can_see_images,
    }


# ----------------------------------------------------------------------------------------------- download


def choose_hub_files(files: Mapping[str, int | None], repo_id: str, filename: str | None = None) -> list[str]:
    """The files of a Hub repo to download: an HF folder's config, safetensors and tokenizer, or one .gguf.

    `files` maps each file in the repo to its size. A repo holding several .gguf files (one per
    quantization) needs `filename` to say which. Raises HubDownloadError when nothing usable is there.
    """
    if filename is not None:
        if filename not in files:
            raise HubDownloadError(f"{repo_id} has no file {filename!r}. Check the file name on the model's page.")
        if not filename.lower().endswith(".gguf"):
            raise HubDownloadError(f"{filename!r} is not a .gguf file; leave the file name empty for a model folder.")
        return [filename]
    names = sorted(files)
    if "config.json" in files and any(n.endswith(".safetensors") for n in names):
        return [n for n in names if _FOLDER_FILE.fullmatch(n)]
    ggufs = [n for n in names if n.lower().endswith(".gguf")]
    if len(ggufs) == 1:
        return ggufs
    if ggufs:
        listed = ", ".join(ggufs[:8]) + (", ..." if len(ggufs) > 8 else "")
        raise HubDownloadError(
            f"{repo_id} holds {len(ggufs)} GGUF files ({listed}). Give the file name of the one to download "
            "(smaller Q4/Q5 files need less memory)."
        )
    if "config.json" in files:
        raise HubDownloadError(
            f"{repo_id} has no .safetensors weights (only other formats such as PyTorch .bin), which Tandem "
            "cannot load. Look for a version of this model with safetensors or GGUF files."
        )
    raise HubDownloadError(
        f"{repo_id} holds neither a model folder (config.json + .safetensors) nor a .gguf file; "
        "check that the repo id names a model."
    )


def hub_is_offline() -> bool:
    """True when HF_HUB_OFFLINE asks huggingface_hub to stay offline (read now, not at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUTHY


def download_from_hub(
    repo_id: str,
    dest_dir: str | Path,
    progress: Progress | None = None,
    *,
    filename: str | None = None,
    token: str | None = None,
    timeout: float = 10.0,
) -> Path:
    """Download a model from the Hugging Face Hub into `dest_dir/<owner>--<name>/` and return what to load.

    Returns the folder for an HF model, or the .gguf file. `progress(fraction)` follows the bytes
    downloaded. The Hub is asked for the file list first, with a `timeout` in seconds, so being offline
    gives a HubDownloadError within that time instead of a long series of retries. HF_ENDPOINT and
    HF_HUB_OFFLINE are read when called. Files already complete in the folder are not downloaded again.
    """
    repo_id = repo_id.strip()
    if not _REPO_ID.fullmatch(repo_id):
        raise HubDownloadError(f"{repo_id!r} is not a Hub repo id; it looks like owner/name, e.g. Qwen/Qwen3-0.6B.")
    try:
        import huggingface_hub
        from huggingface_hub import constants
    except ImportError:
        raise HubDownloadError(
            "Downloading from the Hugging Face Hub needs the huggingface_hub package, which is not installed. "
            "Install it (pip install huggingface_hub) or add a model you already have on disk."
        ) from None
    endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    if hub_is_offline() or constants.HF_HUB_OFFLINE:
        raise HubDownloadError(
            f"Cannot download {repo_id}: Hugging Face Hub access is switched off (HF_HUB_OFFLINE is set). "
            "Unset it to download, or add a model you already have on disk."
        )
    report = progress or (lambda fraction: None)
    api = huggingface_hub.HfApi(endpoint=endpoint, token=token)
    try:
        info = api.model_info(repo_id, files_metadata=True, timeout=timeout)
    except Exception as e:
        raise _explain(e, repo_id, endpoint) from None
    sizes = {s.rfilename: s.size for s in info.siblings or ()}
    names = choose_hub_files(sizes, repo_id, filename)
    target = Path(dest_dir).expanduser() / repo_id.replace("/", "--")
    target.mkdir(parents=True, exist_ok=True)

    total = sum(sizes[n] or 0 for n in names) or 1
    done = 0  # bytes of finished files
    report(0.0)
    for name in names:
        size = sizes[name] or 0
        counted = [0]

        def on_bytes(n: int, before: int = done, size: int = size, counted: list[int] = counted) -> None:
            counted[0] += n  # resumed downloads may count back (negative n); clamp to this file's share
            report(min(1.0, (before + min(max(counted[0], 0), size)) / total))

        try:
            huggingface_hub.hf_hub_download(
                repo_id,
                name,
                revision=info.sha,
                local_dir=target,
                endpoint=endpoint,
                token=token,
                etag_timeout=timeout,
                tqdm_class=_counting_bar(on_bytes),
            )
        except Exception as e:
            raise _explain(e, repo_id, endpoint, name) from None
        done += size
        report(min(1.0, done / total))
    report(1.0)
    log.info("downloaded %s (%d files) to %s", repo_id, len(names), target)
    return target / names[0] if names[0].lower().endswith(".gguf") else target


def _explain(error: Exception, repo_id: str, endpoint: str, name: str | None = None) -> HubDownloadError:
    """A HubDownloadError saying what went wrong, in words a user can act on."""
    from huggingface_hub import errors

    what = f"{name} of {repo_id}" if name else repo_id
    if isinstance(error, errors.GatedRepoError):
        return HubDownloadError(
            f"{repo_id} is gated: accept its license on the model's page and log in with a Hub token, then try again."
        )
    status = getattr(getattr(error, "response", None), "status_code", None)
    if isinstance(error, errors.RepositoryNotFoundError) or (name is None and status == 404):
        return HubDownloadError(
            f"{repo_id} was not found on {endpoint}. Check the spelling; a private repo needs a Hub token."
        )
    if status in (401, 403):
        return HubDownloadError(
            f"The Hub at {endpoint} refused access to {what} (HTTP {status}); it needs a Hub token."
        )
    if isinstance(error, errors.RevisionNotFoundError | errors.EntryNotFoundError) and not isinstance(
        error, errors.LocalEntryNotFoundError
    ):
        return HubDownloadError(f"{what} is not on {endpoint} (it may have just changed); try again.")
    if isinstance(error, errors.OfflineModeIsEnabled):
        return HubDownloadError(
            f"Cannot download {what}: Hugging Face Hub access is switched off (HF_HUB_OFFLINE is set)."
        )
    if status is not None:
        return HubDownloadError(f"The Hub at {endpoint} refused to send {what}: {error}")
    # Connection refused, DNS failure, timeouts, a proxy dropping the line: the Hub is out of reach.
    log.info("hub request for %s failed: %r", what, error)
    return HubDownloadError(
        f"Cannot reach the Hugging Face Hub at {endpoint} to download {what}: you appear to be offline "
        f"({type(error).__name__}: {error}). Check the network connection, or add a model you already have "
        "on disk (a model folder or a .gguf file)."
    )


def _counting_bar(on_bytes: Callable[[int], None]) -> type:
    """A silent tqdm class for huggingface_hub's `tqdm_class` that hands each byte count to `on_bytes`."""
    from tqdm import tqdm

    class CountingBar(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("name", None)
            kwargs["disable"] = True  # nothing on the terminal: the counts go to the callback
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if n:
                on_bytes(int(n))
            return super().update(n)

    return CountingBar


__all__ = [
    "DEMO_VISION_NAME",
    "VISION_ARCHITECTURES",
    "HubDownloadError",
    "choose_hub_files",
    "demo_vision_available",
    "demo_vision_path",
    "describe_model",
    "download_from_hub",
    "hub_is_offline",
    "model_display_name",
    "model_info",
    "starter_info",
]
