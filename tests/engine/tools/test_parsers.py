"""Each family's parser on its call syntax: content and calls out of a whole answer, and the same when the answer
streams in two chunks split at every character boundary, or one character at a time (markers and JSON split
anywhere); the streamed deltas give each call's id and name first and arguments that join to the call's."""

from __future__ import annotations

import json

import pytest

from engine.tools.calls import ToolDelta
from engine.tools.gemma import Gemma
from engine.tools.harmony_calls import Harmony
from engine.tools.hermes import Hermes, Phi
from engine.tools.llama3 import Llama3
from engine.tools.mistral import Mistral, MistralArgs

WEATHER = ("get_weather", '{"city": "Pa\\"ris", "days": [1, {"b": "}]"}]}')
CLOCK = ("get_time", '{"zone": 2}')
EMPTY = ("ping", "{}")

CASES = [
    # family, answer, content, calls
    (Hermes(), "Hello there.", "Hello there.", []),
    (
        Hermes(),
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": ' + WEATHER[1] + "}\n</tool_call>\n"
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": 2}}\n</tool_call>\n',
        "Let me look.\n",
        [WEATHER, CLOCK],
    ),
    # keys in the other order (a model free of the grammar): the call comes whole when its object closes
    (Hermes(), '<tool_call>\n{"arguments": {"zone": 2}, "name": "get_time"}\n</tool_call>', "", [CLOCK]),
    (Hermes(), '<tool_call>{"name": "ping"}</tool_call>', "", [EMPTY]),
    # not a call after all: the text stays
    (Hermes(), "<tool_call>\nnot json\n</tool_call> ok", "<tool_call>\nnot json\n</tool_call> ok", []),
    (Hermes(), "a < b and <tool_ca", "a < b and <tool_ca", []),
    (Phi(), 'Sure<|tool_call|>{"name": "get_time", "arguments": {"zone": 2}}<|/tool_call|>', "Sure", [CLOCK]),
    (Llama3(), '{"name": "get_time", "parameters": {"zone": 2}}', "", [CLOCK]),
    (
        Llama3(),
        ' <|python_tag|>{"name": "get_weather", "parameters": ' + WEATHER[1] + '}; {"name": "ping", "parameters": {}}',
        "",
        [WEATHER, EMPTY],
    ),
    (Llama3(), "Hello {name}, no call here.", "Hello {name}, no call here.", []),
    (Llama3(), "<|pyth", "<|pyth", []),
    (
        Mistral(),
        'Sure[TOOL_CALLS] [{"name": "get_weather", "arguments": ' + WEATHER[1] + "}, "
        '{"name": "get_time", "arguments": {"zone": 2}, "id": "abcdefghi"}]',
        "Sure",
        [WEATHER, CLOCK],
    ),
    (Mistral(), '[TOOL_CALLS]{"name": "get_time", "arguments": {"zone": 2}}', "", [CLOCK]),
    (
        MistralArgs(),
        "[TOOL_CALLS]get_weather[ARGS]" + WEATHER[1] + '[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{"zone": 2}',
        "",
        [WEATHER, CLOCK],
    ),
    (MistralArgs(), "[TOOL_CALLS]get_time", "[TOOL_CALLS]get_time", []),
    (
        Harmony(),
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_weather <|constrain|>json<|message|>" + WEATHER[1],
        "",
        [WEATHER],
    ),
    (Harmony(), "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Hi", "Hi", []),
    (
        Gemma(),
        'Sure.<|tool_call>call:get_weather{city:<|"|>Pa"ris<|"|>,days:[1,{b:<|"|>}]<|"|>}]}<tool_call|>'
        "<|tool_call>call:get_time{zone:2}<tool_call|>",
        "Sure.",
        [WEATHER, CLOCK],
    ),
    (Gemma(), "<|tool_call>nonsense<tool_call|> ok", "<|tool_call>nonsense<tool_call|> ok", []),
    # a built-in tool of the model is not one of the client's functions
    (Harmony(), "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=browser.search<|message|>{}", "", []),
]


def _run(family, chunks: list[str]) -> tuple[str, list[tuple[str, str]], list]:
    parser = family.parser("")
    deltas = ToolDelta()
    for chunk in chunks:
        deltas.extend(parser.feed(chunk))
    deltas.extend(parser.finish())
    streamed: dict[int, list] = {}
    for d in deltas.calls:
        if d.index not in streamed:
            assert d.id is not None and d.name, "a call's first delta names it"
            streamed[d.index] = [d.id, d.name, ""]
        else:
            assert d.id is None and d.name is None
        streamed[d.index][2] += d.arguments
    calls = [(c.name, c.arguments) for c in parser.calls]
    assert [(name, args) for _, name, args in streamed.values()] == calls
    assert [i for i, *_ in streamed.values()] == [c.id for c in parser.calls]
    assert deltas.content == parser.content
    return parser.content, calls, parser.calls


@pytest.mark.parametrize(("family", "answer", "content", "calls"), CASES)
def test_whole_answers(family, answer, content, calls):
    got_content, got_calls, whole = _run(family, [answer])
    assert (got_content, got_calls) == (content, calls)
    for _, args in got_calls:
        json.loads(args)
    assert len({c.id for c in whole}) == len(whole)


@pytest.mark.parametrize(("family", "answer", "content", "calls"), CASES)
def test_split_at_every_character_boundary(family, answer, content, calls):
    for k in range(len(answer) + 1):
        got = _run(family, [answer[:k], answer[k:]])[:2]
        assert got == (content, calls), f"split at {k}: {answer[:k]!r} | {answer[k:]!r}"
    assert _run(family, list(answer))[:2] == (content, calls)


def test_mistral_ids_are_nine_letters_and_digits():
    *_, calls = _run(MistralArgs(), ["[TOOL_CALLS]get_time[ARGS]{}"])
    assert len(calls[0].id) == 9 and calls[0].id.isalnum()
    *_, calls = _run(Hermes(), ['<tool_call>{"name": "ping", "arguments": {}}</tool_call>'])
    assert calls[0].id.startswith("call_")


def test_whitespace_between_calls_is_not_content_but_text_after_them_is():
    content, calls, _ = _run(Hermes(), ['<tool_call>{"name": "ping"}</tool_call>\n\n', "\n"])
    assert (content, calls) == ("", [EMPTY])
    content, _, _ = _run(Hermes(), ['<tool_call>{"name": "ping"}</tool_call>\n', "Done."])
    assert content == "\nDone."


def test_the_harmony_parser_starts_inside_a_message_the_prompt_opened():
    parser = Harmony().parser("<|start|>assistant<|channel|>final<|message|>")
    delta = parser.feed("Hello")
    delta.extend(parser.finish())
    assert delta.content == "Hello" and not parser.calls
