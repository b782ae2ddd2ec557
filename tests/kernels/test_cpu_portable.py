"""The block kernels' portable C paths, built for a CPU without AVX-512 (TANDEM_CPU_KERNEL_ARCH=x86-64-v3) on
this one, against their twin: the same tests as test_cpu_blocks.py, in a child process so the other build is
loaded there and nowhere else. On a machine without AVX512-VNNI the suite already runs them; here it checks
that every type (the K-quants, IQ4_XS and the 32-value types) has a working path for laptops without it."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.skipif(shutil.which("cc") is None or platform.machine() != "x86_64", reason="needs cc on x86-64")
def test_portable_paths_match_their_twin():
    env = {**os.environ, "TANDEM_CPU_KERNEL_ARCH": "x86-64-v3"}
    tests = ["test_rows_match_ggufs_dequantization", "test_each_row_is_computed_as_if_alone", "test_shapes"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "test_cpu_blocks.py"), "-k",
         " or ".join(tests)],
        capture_output=True, text=True, timeout=600, env=env, cwd=HERE.parent.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout  # the kernels were built and ran
