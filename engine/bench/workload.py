"""The bench's prompts, as token ids built once in the parent and shared by every side: one long single
prompt, N job prompts of mixed lengths, a chat history and its follow-up turn."""

from __future__ import annotations

import argparse
import random
from typing import Any

from engine.bench import features as bench_features

ANSWER_TOKENS = 64  # length cap of the first chat turn's answer


def groups(args: argparse.Namespace) -> tuple[bool, bool]:
    """(run the core phases, run the feature phases)."""
    return args.only in ("all", "core"), args.only in ("all", "features")


# Plain sentences the prompts are made of; mixed so the model sees ordinary text, shuffled per prompt so
# no two prompts share a prefix beyond the chat template (which would let our prefix cache skip work).
SENTENCES = [
    "The river had frozen early that year, and the ferry stayed tied to the dock until spring.",
    "She kept a notebook of every bird she saw, with the date, the weather and a small sketch.",
    "Compilers turn source text into tokens, then into a tree, and only then into machine code.",
    "A good soup starts with onions cooked slowly in butter until they turn sweet and golden.",
    "The library opened at nine, but the queue for the reading room began to form at eight.",
    "Most of the mountain path was gravel, though the last mile climbed over bare granite.",
    "He explained that interest compounds, so small savings made early grow more than large late ones.",
    "The orchestra tuned to the oboe, as orchestras have done for more than two hundred years.",
    "Rain fell on the tin roof all night, steady and loud, and nobody in the cabin slept much.",
    "To repot a plant, water it the day before so the roots slide out of the old pot in one piece.",
    "The museum's oldest map shows the coast drawn by hand, with sea monsters in the empty parts.",
    "Every morning the baker checked the starter, fed it flour and water, and wrote the time down.",
    "Trains in the valley ran every hour, and the last one left the station just before midnight.",
    "The committee met twice, argued for an hour each time, and finally agreed to plant more trees.",
    "Light from the nearest star other than the sun takes a little over four years to reach us.",
    "The old clock in the hall lost two minutes a week, so someone reset it every Sunday evening.",
]
QUESTIONS = [
    "Can you tell me more about this?",
    "What would you do next in that situation?",
    "Please explain that in simpler words.",
    "Why does that happen, do you think?",
]
FOLLOW_UP = "Thank you. Now summarize our whole conversation in two sentences."


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    from engine.chat.prompt import encode_chat
    from engine.chat_template import ChatTemplate

    return encode_chat(tokenizer, ChatTemplate.from_tokenizer(tokenizer), messages)[0].tolist()


def _text_until(tokenizer, target_tokens: int, seed: int, question: str) -> list[dict]:
    """One user message of shuffled sentences plus a question, about `target_tokens` long once rendered.

    Sentence `seed` goes first, so messages with different seeds differ from their first sentence on.
    """
    first = SENTENCES[seed % len(SENTENCES)]
    order = [s for s in SENTENCES if s != first]
    random.Random(seed).shuffle(order)
    order.insert(0, first)
    words: list[str] = []
    while True:
        words.append(order[len(words) % len(order)])
        messages = [{"role": "user", "content": " ".join(words) + " " + question}]
        if len(chat_ids(tokenizer, messages)) >= target_tokens:
            return messages


def _history(tokenizer, target_tokens: int) -> list[dict]:
    """Alternating user/assistant turns until the rendered conversation (plus a question) is long enough."""
    rng = random.Random(1234)
    messages: list[dict] = []
    while True:
        question = QUESTIONS[len(messages) // 2 % len(QUESTIONS)]
        turn = [{"role": "user", "content": question}]
        if len(chat_ids(tokenizer, messages + turn)) >= target_tokens:
            return messages + turn
        reply = " ".join(rng.sample(SENTENCES, 5))
        messages += [*turn, {"role": "assistant", "content": reply}]


def build_workload(tokenizer, args: argparse.Namespace) -> dict[str, Any]:
    """Token ids every side runs: one single-stream prompt, the job mix, and the first chat turn; plus
    the feature prompts ("features") when --only asks for them. Without the core group, only the latter."""
    core, features = groups(args)
    workload: dict[str, Any] = {}
    if features:
        workload["features"] = bench_features.build_prompts(lambda messages: chat_ids(tokenizer, messages))
    if core:
        workload.update(_core_workload(tokenizer, args))
    return workload


def _core_workload(tokenizer, args: argparse.Namespace) -> dict[str, Any]:
    n = args.jobs
    lo = min(32, args.max_prompt_tokens)
    lengths = [lo + (args.max_prompt_tokens - lo) * i // max(n - 1, 1) for i in range(n)]
    jobs = [
        chat_ids(tokenizer, _text_until(tokenizer, length, i, QUESTIONS[i % len(QUESTIONS)]))
        for i, length in enumerate(lengths)
    ]
    single = chat_ids(tokenizer, _text_until(tokenizer, 64, 99, "Write a story about it."))
    history = _history(tokenizer, args.history_tokens)
    return {"single": single, "jobs": jobs, "turn1_messages": history, "turn1": chat_ids(tokenizer, history)}
