"""How many requests run at once: as many as the cache's free pages hold (no fixed count), `--max-concurrent` an
optional cap, 503 only past what can run plus `--max-queue`.

Bad inputs tried: more streams than the old fixed cap of 8 with a short request arriving behind them; a cache
of 4 pages with no queue; --cache-tokens below one context; zero or negative limits on the command line.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from engine.server.served import ServedModel
from engine.server.sizing import CACHE_TOKENS, cache_size

LONG = 400  # tokens of each long stream: far more steps than a short request needs to start


def test_the_cache_size_is_a_token_budget_of_at_least_one_context():
    assert cache_size(8192) == CACHE_TOKENS == 32768  # not context x a request count
    assert cache_size(40_000) == 40_192  # one context always fits, in whole pages of 256
    assert cache_size(512, budget=1000, page_size=16) == 1008


async def _stream(client: openai.AsyncOpenAI, name: str, prompt: str, tokens: int, events: list) -> None:
    # logprobs: every token makes a chunk, so the first chunk is the first token (text alone may be a partial byte)
    stream = await client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=tokens,
        stream=True,
        logprobs=1,
        extra_body={"min_tokens": tokens},
    )
    first = True
    async for _ in stream:
        if first:
            events.append(("first", name))
            first = False
    events.append(("done", name))


def test_many_streams_run_at_once_and_a_short_request_starts_before_they_end(serving, tiny_model):
    served = ServedModel(tiny_model, "tiny", context=512, page_size=16, cache_tokens=16 * 512)
    num_long = 12  # beyond the fixed 8 of a request count
    with serving(served) as url:

        async def main() -> list:
            client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
            events: list = []
            longs = [
                asyncio.ensure_future(_stream(client, f"long{i}", f"Count from {i}:", LONG, events))
                for i in range(num_long)
            ]
            while sum(kind == "first" for kind, _ in events) < num_long and not any(k == "done" for k, _ in events):
                await asyncio.sleep(0.005)
            await _stream(client, "short", "Hi", 4, events)
            await asyncio.gather(*longs)
            return events

        events = asyncio.run(main())
    order = [f"{kind}:{name}" for kind, name in events]
    first_done = min(i for i, (kind, _) in enumerate(events) if kind == "done" and _ != "short")
    started_before = {name for kind, name in events[:first_done] if kind == "first"}
    assert started_before == {f"long{i}" for i in range(num_long)} | {"short"}, order
    assert order.index("done:short") < first_done, order  # it did not wait for a long stream to end
    assert served.max_concurrent is None and served.generator.generator.max_batch_size > num_long


def test_past_what_can_run_and_the_queue_comes_503_naming_the_limit(serving, tiny_model):
    served = ServedModel(tiny_model, "tiny", context=64, page_size=16, cache_tokens=64, max_queue=0)
    assert served.cache.num_pages == 4
    with serving(served) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
        streams = [
            client.completions.create(
                model="tiny", prompt="a", max_tokens=40, stream=True, extra_body={"min_tokens": 40}
            )
            for _ in range(4)
        ]
        with pytest.raises(openai.InternalServerError) as caught:
            client.completions.create(model="tiny", prompt="b", max_tokens=2)
        assert caught.value.status_code == 503 and "the cache's 4 pages" in caught.value.message
        for stream in streams:
            stream.close()


@pytest.mark.parametrize("flag", ["--max-concurrent", "--cache-tokens", "--max-queue"])
def test_serve_refuses_limits_below_their_least(tiny_folder, flag, capsys):
    from engine.__main__ import main

    assert main(["serve", str(tiny_folder), flag, "-1", "--port", "0"]) == 2
    assert f"{flag} >=" in capsys.readouterr().err
