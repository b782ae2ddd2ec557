"""Where and on what code a bench ran, for its --json file: a figure means little without its machine.

tools/bench_report.py groups the files by `machine` (the CPU model and the instruction-set flags that pick
a kernel path here and llama.cpp's build) and keeps the newest `run` of each command.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The CPU flags the kernels choose their path by (kernels/cpu: AVX-512 VNNI/BF16, AVX2 with FMA, portable C),
# and those llama.cpp's build script switches on; the rest of /proc/cpuinfo's list says nothing about speed here.
KERNEL_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512vbmi",
    "amx_tile",
    "asimd",
    "sve",
)
REPO = Path(__file__).resolve().parents[2]


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none: macOS, Windows)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def describe_machine(device: str = "cpu") -> dict[str, Any]:
    """The CPU (model name and numbers, the flags in KERNEL_FLAGS, logical CPUs); the GPU when `device` is one."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    name = info.get("model name") or info.get("Hardware") or platform.processor() or platform.machine()
    family, model = info.get("cpu family"), info.get("model")
    gpu = None
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(torch.device(device))
    return {
        "cpu": name or "unknown CPU",
        "cpu_family_model": f"family {family}, model {model}" if family and model else None,
        "flags": [flag for flag in KERNEL_FLAGS if flag in flags],
        "cpus": os.cpu_count(),
        "system": f"{platform.system()} {platform.machine()}",
        "gpu": gpu,
    }


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def software() -> dict[str, str | None]:
    """Versions the figures depend on (transformers' is in its side's own `version`)."""
    return {
        "python": platform.python_version(),
        "torch": _package_version("torch"),
        "llama_cpp_python": _package_version("llama_cpp_python"),
    }


def _git(*argv: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(REPO), *argv], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def command_line(args: argparse.Namespace, add_arguments: Callable[[argparse.ArgumentParser], None]) -> str:
    """`python -m engine bench ...` with the options that differ from their defaults: the command to rerun."""
    parser = argparse.ArgumentParser(prog="python -m engine bench")
    add_arguments(parser)
    parts = ["python", "-m", "engine", "bench"]
    for action in parser._actions:
        if action.dest == "help" or not hasattr(args, action.dest):
            continue
        value = getattr(args, action.dest)
        if not action.option_strings:
            parts.append(str(value))
        elif value == action.default:
            continue
        elif isinstance(action, argparse.BooleanOptionalAction):
            parts.append(action.option_strings[0] if value else action.option_strings[1])
        elif action.nargs == 0:
            parts.append(action.option_strings[0])
        else:
            parts += [action.option_strings[0], str(value)]
    return shlex.join(parts)


def describe_run(args: argparse.Namespace, add_arguments: Callable[[argparse.ArgumentParser], None]) -> dict:
    """When (UTC), on which commit (and whether the tree had local changes) and by which command."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "local_changes": None if status is None else bool(status),
        "command": command_line(args, add_arguments),
    }
