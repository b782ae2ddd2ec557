"""Handing freed heap memory back to the OS (engine/memory.py) after loading."""

from __future__ import annotations

import sys

import pytest

from engine.memory import release_freed_memory, release_mapped_pages


def resident_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS line")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_holes_in_the_heap_go_back():
    # 64 KiB blocks come from the heap, not mmap; small blocks kept between them stop the heap from
    # shrinking on its own, so the freed blocks stay resident until trimmed.
    blocks, pins = [], []
    for _ in range(2000):
        blocks.append(bytearray(b"x" * 65536))
        pins.append(bytearray(b"y" * 64))
    held = resident_mib()
    del blocks
    assert release_freed_memory()
    assert held - resident_mib() > 64, "the freed 125 MiB stayed resident"
    assert len(pins) == 2000


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_loading_leaves_no_freed_memory_behind(starter_gguf):
    import torch

    from engine import Model

    model = Model.load(starter_gguf, dtype=torch.bfloat16)  # untrimmed, about 230 MiB freed stayed resident
    before = resident_mib()
    release_freed_memory()
    assert before - resident_mib() < 32, "loading left freed memory resident"
    assert model.lm_head.is_quantized


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise")
def test_a_copied_mapping_leaves_resident_memory_and_still_reads_the_same(tmp_path):
    import numpy as np

    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * (256 * 1024))  # 64 MiB
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    total = int(mapped.sum(dtype=np.int64))  # reads every page in
    held = resident_mib()
    # an unaligned range: only whole pages inside it go
    assert release_mapped_pages(mapped.ctypes.data + 100, mapped.nbytes - 100)
    assert held - resident_mib() > 60, "the mapping's pages stayed resident"
    assert int(mapped.sum(dtype=np.int64)) == total  # read back from the file, unchanged
