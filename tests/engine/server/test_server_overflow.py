"""`serve --context-overflow`: a chat longer than the context gets an answer with truncate-middle (the turns kept
fit beside max_tokens) and the OpenAI-shaped 400 with the default, through a real server and the openai client.

Bad inputs tried: a policy name the flag does not know.
"""

from __future__ import annotations

import argparse

import openai
import pytest

from engine.server.command import add_arguments
from engine.server.served import ServedModel

CONTEXT = 256


def long_chat(turns: int = 30) -> list[dict]:
    messages = [{"role": "system", "content": "Be brief."}]
    for t in range(turns):
        messages += [
            {"role": "user", "content": f"Q{t}: next after {t}?"},
            {"role": "assistant", "content": f"{t + 1} follows {t}."},
        ]
    return messages + [{"role": "user", "content": "Q: and now?"}]


def ask(url: str, max_tokens: int = 16):
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
    return client.chat.completions.create(model="tiny", messages=long_chat(), max_tokens=max_tokens, temperature=0)


@pytest.mark.parametrize("policy", ["truncate-middle", "rolling-window"])
def test_a_chat_longer_than_the_context_is_answered_with_a_dropping_policy(serving, tiny_model, policy):
    with serving(ServedModel(tiny_model, "tiny", context=CONTEXT, overflow=policy)) as url:
        reply = ask(url)
    assert reply.usage.completion_tokens >= 1 and reply.choices[0].message.content is not None
    assert reply.usage.prompt_tokens + 16 <= CONTEXT


def test_the_default_answers_400_with_both_numbers(serving, tiny_model):
    with serving(ServedModel(tiny_model, "tiny", context=CONTEXT)) as url:
        with pytest.raises(openai.BadRequestError) as refused:
            ask(url)
    assert refused.value.code == "context_length_exceeded"
    message = str(refused.value)
    assert f"maximum context length is {CONTEXT} tokens" in message and "16 for the completion" in message


def test_the_flag_takes_the_three_policies_and_defaults_to_stop(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["m"]).context_overflow == "stop"
    assert parser.parse_args(["m", "--context-overflow", "truncate-middle"]).context_overflow == "truncate-middle"
    with pytest.raises(SystemExit):
        parser.parse_args(["m", "--context-overflow", "truncate-start"])
    assert "rolling-window" in capsys.readouterr().err
