"""Measure the worst GUI event-loop stall while several chat views stream long Markdown answers.

    QT_QPA_PLATFORM=offscreen python tools/measure_stall.py [--tabs 4] [--tokens 2000] [--interval-ms 15]

Real widgets on a real qasync loop, no model: each of `--tabs` MessageViews (all shown at once, 2 by 2, the
harsher case, since every one of them lays out and paints) holds a user message and an assistant
MessageWidget that streams (--in-tabs: pages of one QTabWidget, as the window's chats). One asyncio task per view appends one chunk every `--interval-ms` and calls
set_text with the whole text so far, as ChatTab._run does for each engine result. The answer is about
`--tokens` chunks of Markdown (headings, a poem with single line breaks, nested lists, tables, inline and
fenced code, links), cut the way a BPE tokenizer cuts English: a word piece of up to 4 letters with its
leading space, or one punctuation mark. A 5 ms QTimer probe records the gaps between its ticks; the worst
gap, less the probe period, is the stall a user would feel as a frozen window.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROBE_MS = 5

# PySide6 6.12.0 on CPython 3.11 drops a reference to None on every call of a void Qt method, and one to
# True on every signal emit; a run of this length makes thousands, and the interpreter aborts
# ("none_dealloc") once None's count reaches zero. These extra references keep the singletons alive for
# the measurement (None and the bools are immortal from Python 3.12 on, where this is not needed).
_SINGLETON_REFS = [None, True, False] * 3_000_000

_SECTION = """## Part {n}: what the numbers say

The cache keeps **every full page** of a prompt, named by a *chained hash*, so `prefix reuse` costs
nothing when the next turn starts with the same history. See [the vLLM notes](https://docs.vllm.ai/) and
<https://github.com/ggml-org/llama.cpp> for how others do it.

A short poem, one thought per line:
the pages fill and empty,
the hashes stay behind,
and what was said an hour ago
is still there when you ask.

1. Admit the waiting jobs
   - first in, first out
   - unless `max_skips` says otherwise
     - a skipped job waits at most that many rounds
2. Run one batched decode step
3. Sample and emit

| Setting | Default | What it does |
|---|---:|---|
| `max_chunk_size` | 2048 | tokens of prefill per step |
| `page_size` | 256 | tokens per KV page |
| `max_skips` | 4 | how often a big job may be passed over |

```python
def chained_hash(previous: bytes, token_ids: list[int]) -> bytes:
    # one page's name depends on everything before it
    digest = hashlib.sha256(previous)
    digest.update(array("i", token_ids).tobytes())
    return digest.digest()
```

> A quoted remark, with a ~~wrong~~ right word in it.

"""

_PIECE = re.compile(r"\n|[ \t]*[A-Za-z]{1,4}|[ \t]*\d{1,3}|[ \t]*[^\sA-Za-z\d]|[ \t]+")


def markdown_answer(num_tokens: int) -> list[str]:
    """A Markdown answer cut into `num_tokens` chunks of the size a BPE tokenizer would stream."""
    pieces: list[str] = []
    n = 1
    while len(pieces) < num_tokens:
        pieces += _PIECE.findall(_SECTION.format(n=n))
        n += 1
    return pieces[:num_tokens]


async def _stream(widget, pieces: list[str], interval_s: float) -> None:
    text = ""
    widget.set_streaming(True)
    for piece in pieces:
        text += piece
        widget.set_text(text)  # the whole text so far, as ChatTab._run passes it
        await asyncio.sleep(interval_s)
    widget.set_streaming(False)


def measure(num_tabs: int, num_tokens: int, interval_ms: float, tabs: bool = False) -> dict[str, float]:
    """Stream `num_tabs` answers of `num_tokens` chunks at once; return the probe's gap statistics (ms).

    tabs: the views are pages of a QTabWidget (the main window's chats, one shown) instead of a grid (all
    shown, as the compare view's columns are).
    """
    import qasync
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QGridLayout, QTabWidget, QWidget

    from app.ui.message_view import MessageView, MessageWidget

    app = QApplication.instance() or QApplication(sys.argv[:1])
    loop = qasync.QEventLoop(app)
    window = QTabWidget() if tabs else QWidget()
    grid = None if tabs else QGridLayout(window)
    answers = []
    for i in range(num_tabs):
        view = MessageView()
        view.add_message(MessageWidget(2 * i, "user", "Explain the cache, with a table, a poem and some code."))
        answers.append(view.add_message(MessageWidget(2 * i + 1, "assistant", "")))
        if grid is None:
            window.addTab(view, f"chat {i + 1}")
        else:
            grid.addWidget(view, i // 2, i % 2)
    window.resize(1400, 900)
    window.show()
    pieces = markdown_answer(num_tokens)

    gaps: list[float] = []
    cpu_gaps: list[float] = []  # the GUI thread's own CPU time in each gap: a shared machine also preempts us
    at: list[float] = []
    last = [0.0, 0.0]

    def tick() -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        gaps.append(now - last[0])
        cpu_gaps.append(cpu - last[1])
        at.append(now)
        last[:] = now, cpu

    probe = QTimer()
    probe.setInterval(PROBE_MS)
    probe.timeout.connect(tick)

    async def run() -> float:
        await asyncio.sleep(0.2)  # let the window settle before measuring
        started = last[0] = time.perf_counter()
        last[1] = time.thread_time()
        probe.start()
        await asyncio.gather(*(_stream(w, pieces, interval_ms / 1000) for w in answers))
        probe.stop()
        return time.perf_counter() - started

    with loop:
        elapsed = loop.run_until_complete(run())
    expected = "".join(pieces)
    wrong = [w.message_id for w in answers if w.text != expected]
    if wrong:
        raise RuntimeError(f"messages {wrong} do not hold the streamed text; the measurement is void")
    window.close()
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    return {
        "worst_at_s": at[worst] - at[0],
        "elapsed_s": elapsed,
        "ticks": len(gaps),
        "worst_ms": max(gaps) * 1000 - PROBE_MS,
        "worst_cpu_ms": max(cpu_gaps) * 1000,
        "p99_ms": statistics.quantiles(gaps, n=100)[98] * 1000 - PROBE_MS,
        "median_ms": statistics.median(gaps) * 1000 - PROBE_MS,
        "chars": len(expected),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tabs", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--interval-ms", type=float, default=15.0, help="time between one view's chunks")
    parser.add_argument("--in-tabs", action="store_true", help="views as tabs, one shown (default: a grid)")
    args = parser.parse_args()
    r = measure(args.tabs, args.tokens, args.interval_ms, args.in_tabs)
    print(
        f"{args.tabs} views {'in tabs' if args.in_tabs else 'in a grid'} x {args.tokens} chunks ({r['chars']} chars of Markdown each), one every "
        f"{args.interval_ms:g} ms per view, streamed in {r['elapsed_s']:.1f} s; probe every {PROBE_MS} ms, "
        f"{r['ticks']} ticks: worst stall {r['worst_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
        f"median {r['median_ms']:.1f} ms (the worst {r['worst_at_s']:.1f} s in); the most CPU the GUI thread "
        f"spent between two ticks: {r['worst_cpu_ms']:.1f} ms"
    )


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip finalization, where _SINGLETON_REFS' release would meet PySide6's missing references
