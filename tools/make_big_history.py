"""Generate a large chat history to measure the store's search and startup on.

    python tools/make_big_history.py /tmp/big/tandem.sqlite3 --chats 30000 --messages 1200000 --schema 1

The file is made by the store itself (``Store``), so its schema is exactly the one a user's Tandem
writes; ``--schema 1`` stops at version 1 (before the search index) to measure the one-time
migration and startup before/after. Rows are then written in large transactions straight into the
store's tables, as the store's own API would write them one by one (that would take an hour).

Text is random English-like prose from a fixed vocabulary plus a few rare words placed in known
chats, so a search can be checked against the truth: "zebrafish" is in chat 1's first message only,
and "quokka" in the title of the newest chat. The file is big (about 0.5 GB for the defaults):
keep it under /tmp, never in git.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.store import Store  # noqa: E402
from app.store.migrations import MIGRATIONS  # noqa: E402

WORDS = (
    "the of and to in is that it for on with as was at by an be this are from or have not but what all were "
    "when we there can which their said if do will each about how up out them then she many some so these "
    "would other into has more her two like him see time could no make than first been its who now people my "
    "made over did down only way find use may water long little very after words called just where most know "
    "model token answer question python function error memory context layer cache prompt sample weight "
    "tensor matrix kernel thread window search history travel recipe garden music river mountain coffee "
    "train station ticket bread butter onion garlic tomato lemon pepper salt sugar flour oven minutes hours "
    "über café naïve résumé straße garçon"
).split()


def _sentence(rng: random.Random) -> str:
    words = rng.choices(WORDS, k=rng.randint(6, 18))
    return " ".join(words).capitalize() + "."


def _text(rng: random.Random) -> str:
    # Mostly short turns with a tail of long answers: 1 to 12 sentences, about 450 characters on average.
    return " ".join(_sentence(rng) for _ in range(min(12, 1 + int(rng.expovariate(1 / 4)))))


def generate(path: Path, chats: int, messages: int, schema: int | None, seed: int = 1) -> dict[str, float]:
    if path.exists():
        raise SystemExit(f"{path} exists; remove it (and its -wal/-shm files) or choose another path")
    store_class = Store
    if schema is not None:
        if not 1 <= schema <= len(MIGRATIONS):
            raise SystemExit(f"--schema must be between 1 and {len(MIGRATIONS)}, got {schema}")
        store_class = type("StoreAtVersion", (Store,), {"migrations": MIGRATIONS[:schema]})
    store_class(path).close()
    rng = random.Random(seed)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = OFF")  # a generated file: a crash here just means run it again
    started = time.perf_counter()
    now = time.time()
    span = 3 * 365 * 86400.0  # three years of history, oldest chat first
    per_chat = messages / chats
    message_id = 0
    conn.execute("BEGIN")
    for chat_id in range(1, chats + 1):
        created = now - span + span * (chat_id - 1) / chats
        count = max(1, round(rng.gauss(per_chat, per_chat / 3)))
        if chat_id == chats:
            count = max(1, messages - message_id)  # the exact total
        count = min(count, messages - message_id - (chats - chat_id))
        title = " ".join(rng.choices(WORDS[60:], k=rng.randint(2, 5))).capitalize()
        if chat_id == chats:
            title += " quokka"
        rows = []
        for i in range(count):
            message_id += 1
            text = _text(rng)
            if chat_id == 1 and i == 0:
                text += " A zebrafish swam by."
            role = "user" if i % 2 == 0 else "assistant"
            stats = json.dumps({"tokens": len(text) // 4}) if role == "assistant" else "{}"
            rows.append((message_id, chat_id, role, text, stats, "{}", None, 1, created + i))
        updated = created + count
        conn.execute(
            "INSERT INTO chats (id, title, kind, system_prompt, settings, model, created_at, updated_at)"
            " VALUES (?, ?, 'chat', '', '{}', 'SmolLM2-135M', ?, ?)",
            (chat_id, title, created, updated),
        )
        conn.executemany(
            "INSERT INTO messages (id, chat_id, role, text, stats, settings, col, complete, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        if chat_id % 1000 == 0:
            conn.execute("COMMIT")
            print(f"\r{chat_id}/{chats} chats, {message_id} messages", end="", file=sys.stderr, flush=True)
            conn.execute("BEGIN")
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    print(file=sys.stderr)
    return {"seconds": time.perf_counter() - started, "messages": message_id, "bytes": path.stat().st_size}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path, help="the database file to create (keep it under /tmp)")
    parser.add_argument("--chats", type=int, default=30_000)
    parser.add_argument("--messages", type=int, default=1_200_000)
    parser.add_argument("--schema", type=int, default=None, help="stop at this schema version (default: latest)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.chats < 1 or args.messages < args.chats:
        parser.error("need at least one chat and at least one message per chat")
    result = generate(args.path, args.chats, args.messages, args.schema, args.seed)
    print(
        f"{args.path}: {args.chats} chats, {result['messages']} messages, "
        f"{result['bytes'] / 1e6:.0f} MB, {result['seconds']:.0f} s"
    )


if __name__ == "__main__":
    main()
