"""Time opening the store and searching it, on a history from tools/make_big_history.py.

    python tools/measure_search.py /tmp/big/tandem.sqlite3

Prints the open time (the first open of a version-1 file includes the migration to the search index; the
older messages are then indexed in the background, timed with the GUI-thread writes made meanwhile), three
more opens, then each query's time through the index with the sidebar's limit, as the sidebar
runs it (ChatSearch on its worker thread, measured from submit to result), and through the scan that
searches used before (TANDEM_SEARCH_INDEX=off's path), for comparison. The load average is printed before
and after: on a busy machine the times grow with it, so compare runs made at a similar load.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.store import Store  # noqa: E402
from app.store.search import SHOWN_LIMIT, connect, search  # noqa: E402

QUERIES = ("zebrafish", "quokka", "not there at all", "garlic", "the", "kernel cache", "café", "ab")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-scan", action="store_true", help="skip the old scan (about 2.5 s a query)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # the backfill's progress
    if not args.path.is_file():
        parser.error(f"{args.path} does not exist; make it with tools/make_big_history.py")
    print(f"load average {_load()}")
    started = time.perf_counter()
    store = Store(args.path)
    print(f"open (schema {store.schema_version}): {(time.perf_counter() - started) * 1000:.1f} ms")
    if not store.wait_for_search_index(timeout=0):
        # An upgraded file: older messages are being indexed in the background. Time what the GUI thread
        # would feel meanwhile: a streaming answer's update, 20 a second, in a scratch chat (left in the file).
        chat = store.create_chat("measure_search scratch")
        answer = store.add_message(chat.id, "assistant", "", complete=False)
        waits, text = [], ""
        while not store.wait_for_search_index(timeout=0.05):
            text += "token "
            begun = time.perf_counter()
            store.update_message(answer.id, text=text)
            waits.append((time.perf_counter() - begun) * 1000)
        print(
            f"backfill: {time.perf_counter() - started:.0f} s; {len(waits)} writes meanwhile, median"
            f" {statistics.median(waits):.1f} ms, max {max(waits):.0f} ms"
        )
    store.close()
    for _ in range(3):
        started = time.perf_counter()
        store = Store(args.path)
        print(f"open (schema {store.schema_version}): {(time.perf_counter() - started) * 1000:.1f} ms")
        store.close()
    with Store(args.path) as store:
        searcher = store.chat_search()
        for query in QUERIES:
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                hits = searcher.submit(query, SHOWN_LIMIT).result()
                times.append((time.perf_counter() - started) * 1000)
            snippet = hits[0].snippet if hits else None
            print(
                f"index {query!r}: median {statistics.median(times):.1f} ms, max {max(times):.1f} ms,"
                f" {len(hits)} chats; first snippet {snippet!r}"
            )
        searcher.close()
    print(f"load average {_load()}")
    if not args.no_scan:
        conn = connect(args.path)
        for query in QUERIES[:3]:
            started = time.perf_counter()
            hits = search(conn, query, SHOWN_LIMIT, use_index=False)
            print(f"scan {query!r}: {(time.perf_counter() - started) * 1000:.0f} ms, {len(hits)} chats")
        conn.close()


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
