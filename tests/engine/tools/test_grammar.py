"""Each family's grammar, run by llguidance over a real tokenizer (the matcher jobs use): it takes the calls the
family writes (and the parser reads back), refuses arguments off their schema and names that are no tool's, and
under `auto` takes plain text too; required and named choices take nothing but calls. Markers that are special
tokens of the vocabulary ([TOOL_CALLS], <|python_tag|>, harmony's channels) are matched as those tokens."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from engine.generator.filters import FilterMatcher
from engine.reasoning import ReasoningFormat
from engine.tokenizer.tokenizer import Tokenizer
from engine.tools.gemma import Gemma
from engine.tools.grammar import tool_filter
from engine.tools.harmony_calls import Harmony
from engine.tools.hermes import Hermes, Phi
from engine.tools.llama3 import Llama3
from engine.tools.mistral import Mistral, MistralArgs
from engine.tools.schema import ToolChoice, read_tools

_TESTS = Path(__file__).parents[2]
_spec = importlib.util.spec_from_file_location("grammar_conftest", _TESTS / "conftest.py")
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)
_spec = importlib.util.spec_from_file_location("grammar_harmony_models", _TESTS / "harmony_models.py")
harmony_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harmony_models)

SPECIAL = (
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|python_tag|>",
    "<|tool_call|>",
    "<|/tool_call|>",
    "<|tool_call>",
    "<tool_call|>",
    '<|"|>',
)
TOOLS = read_tools(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        },
        {"type": "function", "function": {"name": "get_time"}},
    ]
)
REQUIRED, AUTO = ToolChoice("required"), ToolChoice("auto")
PARIS = '{"city": "Paris"}'

# family, a call of get_weather(Paris) as the family writes it, a change that takes it off its schema
OSLO = ("Paris", "Oslo")
CALLS = [
    (Hermes(), '<tool_call>\n{"name": "get_weather", "arguments": ' + PARIS + "}\n</tool_call>", OSLO),
    (Phi(), '<|tool_call|>{"name": "get_weather", "arguments": ' + PARIS + "}<|/tool_call|>", OSLO),
    (Llama3(), '<|python_tag|>{"name": "get_weather", "parameters": ' + PARIS + "}", OSLO),
    (Mistral(), '[TOOL_CALLS][{"name": "get_weather", "arguments": ' + PARIS + "}]", OSLO),
    (MistralArgs(), "[TOOL_CALLS]get_weather[ARGS]" + PARIS, OSLO),
    # Gemma's grammar holds argument names, not value types
    (Gemma(), '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>', ("city", "town")),
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tools-tokenizer")
    _conftest.build_tiny(folder, extra_special=SPECIAL)
    return Tokenizer.load(folder)


@pytest.fixture(scope="module")
def harmony_tokenizer(tmp_path_factory):
    return harmony_models.build_harmony_tokenizer(tmp_path_factory.mktemp("tools-harmony"))


def encode(tokenizer, text: str) -> list[int]:
    """`text`'s ids with special-token text as those tokens, the rest as plain text (the harmony test vocabulary
    has a plain token spelling a whole header, which a model writing the channels token by token never uses)."""
    specials = sorted((tokenizer.id_to_piece(i) for i in tokenizer.special_token_ids), key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, specials)))
    ids, at = [], 0
    for found in pattern.finditer(text):
        ids += tokenizer.encode_ids(text[at : found.start()]) + [tokenizer.piece_to_id(found.group())]
        at = found.end()
    return ids + tokenizer.encode_ids(text[at:])


def accepts(tokenizer, grammar: str, text: str) -> bool:
    """Whether the grammar takes `text` (special-token text as those tokens) and may end after it."""
    matcher = FilterMatcher(tool_filter(grammar), tokenizer)
    for token in encode(tokenizer, text):
        try:
            matcher.feed(token)
        except RuntimeError:
            return False
    return matcher.can_end()


def grammar(family, tokenizer, choice=REQUIRED, parallel=True, **kw) -> str:
    return family.grammar(tokenizer, TOOLS, choice, parallel, **kw)


@pytest.mark.parametrize(("family", "call", "off_schema"), CALLS)
def test_a_call_is_taken_and_read_back(tokenizer, family, call, off_schema):
    assert accepts(tokenizer, grammar(family, tokenizer), call)
    assert accepts(tokenizer, grammar(family, tokenizer, AUTO), call)
    parser = family.parser()
    parser.feed(call)
    parser.finish()
    assert [(c.name, c.arguments) for c in parser.calls] == [("get_weather", PARIS)]


@pytest.mark.parametrize(("family", "call", "off_schema"), CALLS)
def test_off_schema_arguments_and_unknown_names_are_refused(tokenizer, family, call, off_schema):
    required = grammar(family, tokenizer)
    assert not accepts(tokenizer, required, call.replace(*off_schema))
    assert not accepts(tokenizer, required, call.replace("get_weather", "get_wether"))
    named = grammar(family, tokenizer, ToolChoice("function", "get_time"))
    assert not accepts(tokenizer, named, call)


@pytest.mark.parametrize(("family", "call", "off_schema"), CALLS)
def test_text_is_free_under_auto_and_refused_when_calls_are_required(tokenizer, family, call, off_schema):
    assert accepts(tokenizer, grammar(family, tokenizer, AUTO), "Hello, the weather is fine.")
    assert not accepts(tokenizer, grammar(family, tokenizer), "Hello, the weather is fine.")


@pytest.mark.parametrize(("family", "call"), [(Hermes(), CALLS[0][1]), (Mistral(), CALLS[3][1])])
def test_text_before_calls_and_several_calls(tokenizer, family, call):
    auto = grammar(family, tokenizer, AUTO)
    assert accepts(tokenizer, auto, "Let me check <b>that</b>. " + call)
    if family.name == "hermes":
        two = call + "\n" + call
    else:
        two = call[:-1] + ", " + call[len("[TOOL_CALLS][") :]
    assert accepts(tokenizer, grammar(family, tokenizer), two)
    assert not accepts(tokenizer, grammar(family, tokenizer, parallel=False), two)


def test_a_thinking_block_may_come_first(tokenizer):
    think = ReasoningFormat("<think>", "</think>")
    call = CALLS[0][1]
    opened = grammar(Hermes(), tokenizer, reasoning=think, prompt_tail="<|im_start|>assistant\n<think>\n")
    assert accepts(tokenizer, opened, "The user wants weather.\n</think>\n\n" + call)
    assert not accepts(tokenizer, opened, call)  # the prompt opened the block: it must close first
    free = grammar(Hermes(), tokenizer, reasoning=think, prompt_tail="<|im_start|>assistant\n")
    assert accepts(tokenizer, free, "<think>Weather.</think>\n" + call)
    assert accepts(tokenizer, free, call)


def test_harmony_calls_follow_the_channels(harmony_tokenizer):
    call = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
    thought = "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant"
    required = grammar(Harmony(), harmony_tokenizer)
    auto = grammar(Harmony(), harmony_tokenizer, AUTO)
    for text in (call, thought + call):
        assert accepts(harmony_tokenizer, required, text) and accepts(harmony_tokenizer, auto, text)
    final = thought + "<|channel|>final<|message|>Sunny."
    assert accepts(harmony_tokenizer, auto, final) and not accepts(harmony_tokenizer, required, final)
    assert not accepts(harmony_tokenizer, required, call.replace("Paris", "Oslo"))
    opened = grammar(Harmony(), harmony_tokenizer, prompt_tail="<|start|>assistant<|channel|>analysis<|message|>")
    assert accepts(harmony_tokenizer, opened, "Need it.<|end|><|start|>assistant" + call)


def test_response_format_holds_the_text_answers_of_auto(tokenizer):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}}}
    auto = grammar(Hermes(), tokenizer, AUTO, content_schema=schema)
    assert accepts(tokenizer, auto, '{"answer": "yes"}') and accepts(tokenizer, auto, CALLS[0][1])
    assert not accepts(tokenizer, auto, "Hello")
