"""What every Triton launcher shares: where outputs come from, and how the interpreter changes the kernels.

Kept free of `import triton` so the candidates in `kernels.triton` can consult it before triton is loaded.
"""

from __future__ import annotations

import os
import sys

import torch

# Dtypes every kernel here takes; anything else goes to the torch twin.
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every output and scratch buffer of the launchers is made here, so tests can poison them all at once."""
    return torch.empty(shape, dtype=dtype, device=device)


def interpreting() -> bool:
    """Whether triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1, read when a kernel launches)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_interpreter() -> None:
    """Run the Triton kernels in triton's CPU interpreter from now on, by setting TRITON_INTERPRET=1.

    triton chooses at each `@triton.jit` decoration, its own library functions (`tl.zeros`, ...) included,
    so this must run before triton is first imported; after that it raises rather than leave a mix. Note
    that importing `torch._dynamo` (which transformers' model code does) imports triton when installed.
    """
    if sys.modules.get("triton") is not None and not interpreting():
        raise RuntimeError(
            "triton was imported before TRITON_INTERPRET=1 was set (torch._dynamo imports it, e.g. through "
            "transformers), so its kernels cannot run in the interpreter; call use_interpreter() before "
            "that happens, or set TRITON_INTERPRET=1 in the environment before starting the process"
        )
    os.environ["TRITON_INTERPRET"] = "1"


def dot_in_fp32(dtype: torch.dtype) -> bool:
    """Whether attention should convert its tiles to float32 before `tl.dot`.

    float32 inputs stay float32 anyway. Under the interpreter, triton 3.9 computes bfloat16 arithmetic on the
    raw 16-bit patterns (a bf16 `tl.dot` or `+` returns garbage), so there every tile is widened first; on a
    GPU 16-bit tiles go to the tensor cores as they are, accumulating in float32.
    """
    return dtype == torch.float32 or interpreting()
