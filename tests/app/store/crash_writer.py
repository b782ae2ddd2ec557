"""Child process for test_crash: stream an answer into the store until killed.

Prints ``ready <chat id> <answer id>``, then one line ``<step>`` after each update_message call
returns, so the parent knows which writes had committed when it sent SIGKILL.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from app.store import Store


def answer_text(step: int) -> str:
    return "word " * step


def main(path: str) -> None:
    store = Store(Path(path))
    chat = store.create_chat("Crash test")
    store.add_message(chat.id, "user", "Tell me a long story.")
    answer = store.add_message(chat.id, "assistant", "", complete=False)
    print(f"ready {chat.id} {answer.id}", flush=True)
    for step in range(1, 1_000_000):
        store.update_message(answer.id, text=answer_text(step), stats={"new_tokens": step})
        print(step, flush=True)
        time.sleep(0.002)


if __name__ == "__main__":
    main(sys.argv[1])
