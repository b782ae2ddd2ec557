"""Compile a kernel's C source with the system's C compiler on first use, and load it with ctypes.

Why C and not a torch extension: a plain C file against no headers but libc compiles in about a second,
where one including torch's headers takes a minute; the kernels take raw pointers and strides, which is all
they need from a tensor.

Threads come from OpenMP. The library asks for libgomp.so.1 by name, and torch's Linux wheels have already
loaded their own libgomp.so.1, so the loader hands the kernel torch's runtime and both share one thread pool
(two pools on two cores made each decode step slower, not faster). A compiler without OpenMP gets a second
try without it, and the kernel then runs on one thread.

The library is built for this CPU (-march=native; TANDEM_CPU_KERNEL_ARCH overrides it) and cached under the user's cache folder, named by a hash
of the source, the flags, the compiler and the CPU's feature flags, so an edit, a new compiler or a cache
folder carried to another machine gets a fresh build. Builds write a temporary file and rename it, so two
processes building at once cannot load half a file.

Where no compiler is found, the build fails, or TANDEM_NO_CPU_KERNELS=1 is set, `load` returns None (after
one warning for a failed build) and the ops fall back to the torch twins.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import platformdirs

log = logging.getLogger(__name__)

_SOURCES = Path(__file__).parent
# -fno-trapping-math: no kernel reads the floating-point exception flags, and with them kept GCC would not turn
# exp_poly's clamps into selects on AVX2 (AVX-512's masks do without), and SiLU's exp would run one value at a
# time there. It changes no result (no reassociation, no finite-math).
FLAGS = ("-O3", "-fPIC", "-std=c11", "-fno-trapping-math")
_THREADS = ("-fopenmp", "-fopenmp-simd")  # tried in this order
_BUILD_TIMEOUT_S = 120
# Kernels compiled as several translation units side by side (part i with -DTANDEM_PART=i), then linked: as one,
# paged_decode's 32 unrolled AVX2 instances keep one core compiling long after the other kernels are done (its
# float32 and bfloat16 instances are the two parts).
PARTS = {"paged_decode": 2}


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc"))


def _arch_flag() -> str:
    """-march=native, or TANDEM_CPU_KERNEL_ARCH (for example x86-64-v3: AVX2 without AVX-512), which builds
    the portable paths on a CPU that would take the vector ones, so they can be checked there."""
    return f"-march={os.environ.get('TANDEM_CPU_KERNEL_ARCH') or 'native'}"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def cache_folder() -> Path:
    return Path(os.environ.get("TANDEM_KERNEL_CACHE") or platformdirs.user_cache_path("Tandem") / "kernels")


KERNELS = (
    "paged_decode",
    "paged_prefill",
    "paged_prefill_quant",
    "int4_matmul",
    "elementwise",
    "kquant_matmul",
    "block32_matmul",
    "kv_quant",
    "moe_decode",
)


def prepare() -> None:
    """Build (or find) every CPU kernel now, side by side, so the first decode step does not wait for the
    compiler: seconds the first time on each machine (paged_decode's unrolled AVX2 instances build in parts side
    by side, see PARTS), then nothing."""
    with ThreadPoolExecutor(max_workers=len(KERNELS)) as pool:
        list(pool.map(load, KERNELS))


@cache
def load(name: str) -> ctypes.CDLL | None:
    """The compiled `name`.c from this folder, or None where it cannot be had (see the module docstring)."""
    if os.environ.get("TANDEM_NO_CPU_KERNELS", "") not in ("", "0"):
        return None
    compiler = _compiler()
    if compiler is None:
        return None
    # the source and every header beside it (they are few and small)
    source = b"".join(path.read_bytes() for path in [_SOURCES / f"{name}.c", *sorted(_SOURCES.glob("*.h"))])
    key = hashlib.sha256(
        b"\0".join(
            [
                source,
                " ".join((*FLAGS, _arch_flag(), *_THREADS, f"parts={PARTS.get(name, 1)}")).encode(),
                compiler.encode(),
                _cpu_flags().encode(),
                platform.machine().encode(),
            ]
        )
    ).hexdigest()[:20]
    target = cache_folder() / f"{name}-{key}.so"
    try:
        if not target.exists():
            _build(compiler, _SOURCES / f"{name}.c", target, PARTS.get(name, 1))
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("CPU kernel %s could not be built or loaded (%s); using the torch twin instead", name, exc)
        return None


@cache
def function(name: str, symbol: str, argtypes: tuple, restype=None):
    """`symbol` of the compiled `name`.c with its ctypes signature set, or None where the library cannot be had.

    Cached, since the ops ask for their function on every call (30 layers a decode step)."""
    library = load(name)
    if library is None:
        return None
    fn = getattr(library, symbol)
    if fn.argtypes is None:
        fn.argtypes, fn.restype = list(argtypes), restype
    return fn


def _build(compiler: str, source: Path, target: Path, parts: int = 1) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=target.stem, suffix=".tmp", dir=target.parent)
    os.close(fd)
    objects = [f"{partial}.{part}.o" for part in range(parts)]
    try:
        for threads in _THREADS:
            compile_ = [compiler, *FLAGS, _arch_flag(), threads, f"-I{source.parent}"]
            if parts == 1:
                done = _run([*compile_, "-shared", "-o", partial, str(source), "-lm"])
            else:
                commands = [
                    [*compile_, f"-DTANDEM_PART={i}", "-c", "-o", objects[i], str(source)] for i in range(parts)
                ]
                with ThreadPoolExecutor(max_workers=parts) as pool:
                    steps = list(pool.map(_run, commands))
                done = next((step for step in steps if step.returncode != 0), None)
                if done is None:
                    done = _run([compiler, "-shared", threads, "-o", partial, *objects, "-lm"])
            if done.returncode == 0:
                break
        else:
            raise subprocess.SubprocessError(f"{compiler} exited with {done.returncode}: {done.stderr.strip()[-2000:]}")
        os.replace(partial, target)
    finally:
        for path in (partial, *objects):
            if os.path.exists(path):
                os.remove(path)


def _run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S)
