"""The bench's rows beside the core ones: a cold prompt's rate, and decoding while another program keeps one
core busy (the laptop case: a browser or a build beside the chat). Each side runs them in its own process."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

PROMPT_TOKENS = 512
BUSY_SETTLE_S = 1.0  # the load runs this long before timing: what a user's machine looks like mid-chat


@contextmanager
def busy_core() -> Iterator[None]:
    """Another program spinning on one core for as long as the block runs."""
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(BUSY_SETTLE_S)
        yield
    finally:
        loop.kill()
        loop.wait()


def prompt_rate(prefill: Callable[[list[int]], float], prompt: list[int], runs: int = 2) -> float:
    """Tokens per second of a cold prefill of `prompt` (best of `runs`); `prefill` returns its seconds."""
    return len(prompt) / min(prefill(prompt) for _ in range(runs))
