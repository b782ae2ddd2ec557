"""Tool calling through the server, driven by the official openai client: a tiny random model forced to call
(tool_choice required, a named function) writes calls that parse whatever its weights, the calls go back with
their results as tool messages, and the model answers; whole replies and streams; the call -> result -> answer
turns reuse the cached prefix; bad tools get a 400 naming the field.

The Hermes template is written for these tests from Qwen2.5's rules (tools in the system message, calls as
<tool_call> JSON blocks, results as <tool_response> blocks); the Mistral one from Mistral's ([TOOL_CALLS] is a
special token, so the job must decode it for the parser). Schemas bound every value (enums, no extra keys): random
weights never close an open string.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import openai
import pytest

from engine.chat_template import ChatTemplate
from engine.models import Model
from engine.server.served import ServedModel

_spec = importlib.util.spec_from_file_location("server_tests", Path(__file__).with_name("test_server.py"))
_server_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_server_tests)
client = _server_tests.client
_spec = importlib.util.spec_from_file_location("tools_conftest", Path(__file__).parents[2] / "conftest.py")
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)

PAGE = 16
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    'Call a function with <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    "<|im_end|>{{ '\\n' }}"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>{{ '\\n' }}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{%- for call in m.tool_calls or [] %}{% if m.content or not loop.first %}\n{% endif %}"
    '<tool_call>\n{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}\n'
    "</tool_call>{% endfor %}<|im_end|>{{ '\\n' }}"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>{{ '\\n' }}"
    "{%- elif m.role != 'system' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{{ '\\n' }}{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MISTRAL_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{% if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]"
    "{% endif %}[INST]{{ m.content }}[/INST]"
    "{%- elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS]["
    '{%- for c in m.tool_calls %}{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}, '
    '"id": "{{ c.id }}"}{{ ", " if not loop.last }}{% endfor %}]<|im_end|>'
    "{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{%- else %}{{ m.content }}<|im_end|>{% endif %}"
    "{%- endfor %}"
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                "unit": {"type": "string", "enum": ["C", "F"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "integer", "enum": [0, 1, 2]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, CLOCK]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
# One call at a time unless a test asks for more: a call of these tools is about 90 tokens of the tiny vocabulary.
ARGS = dict(model="tiny", temperature=0, max_tokens=150, parallel_tool_calls=False)


@pytest.fixture(scope="module")
def hermes_server(serving, tiny_model):
    template = ChatTemplate(HERMES_TEMPLATE, eos_token="<|im_end|>")
    served = ServedModel(tiny_model, "tiny", context=1024, max_concurrent=4, page_size=PAGE, template=template)
    assert served.tool_format.name == "hermes" and served.tool_format.native
    with serving(served) as url:
        yield url, served


def _check_call(call, names=("get_weather", "get_time")) -> dict:
    assert call.type == "function" and call.id and call.function.name in names
    arguments = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert arguments["city"] in ("Paris", "Rome", "Oslo") and arguments["unit"] in ("C", "F")
    else:
        assert arguments["zone"] in (0, 1, 2)
    return arguments


def _results(calls) -> list[dict]:
    return [{"role": "tool", "tool_call_id": c["id"], "content": f"result of {c['function']['name']}"} for c in calls]


def test_a_forced_call_parses_and_its_result_gets_an_answer_reusing_the_prefix(hermes_server):
    url, _ = hermes_server
    c = client(url)
    first = c.chat.completions.create(**ARGS, messages=QUESTION, tools=TOOLS, tool_choice="required")
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        _check_call(call)
        assert call.id.startswith("call_")
    assert choice.message.content is None

    assistant = choice.message.model_dump(exclude_none=True)
    turn = [*QUESTION, assistant, *_results(assistant["tool_calls"])]
    second = c.chat.completions.create(**{**ARGS, "max_tokens": 12}, messages=turn, tools=TOOLS, tool_choice="none")
    assert second.choices[0].finish_reason in ("stop", "length") and second.choices[0].message.tool_calls is None
    assert isinstance(second.choices[0].message.content, str)
    # The first prompt's whole pages come from the cache: the tools and the question are the same text.
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens // PAGE * PAGE > 0
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens


def test_a_streamed_call_comes_as_deltas_and_the_loop_closes_streamed(hermes_server):
    url, _ = hermes_server
    c = client(url)
    calls: dict[int, dict] = {}
    reasons = []
    stream = c.chat.completions.create(
        **ARGS,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice="required",
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasons.append(chunk.choices[0].finish_reason)
        assert not delta.content
        for d in delta.tool_calls or []:
            if d.index not in calls:  # a call's first delta: its id, type and name
                assert d.id and d.type == "function" and d.function.name
                calls[d.index] = {
                    "id": d.id,
                    "type": "function",
                    "function": {"name": d.function.name, "arguments": ""},
                }
            else:
                assert d.id is None and not d.function.name
            calls[d.index]["function"]["arguments"] += d.function.arguments or ""
    assert calls and reasons[-1] == "tool_calls" and not any(reasons[:-1])
    for call in calls.values():
        _check_call(openai.types.chat.ChatCompletionMessageToolCall.model_validate(call))

    # The same request whole gives the same calls (greedy), but for their ids.
    whole = c.chat.completions.create(**ARGS, messages=QUESTION, tools=TOOLS, tool_choice="required")
    assert [(t.function.name, t.function.arguments) for t in whole.choices[0].message.tool_calls] == [
        (v["function"]["name"], v["function"]["arguments"]) for v in calls.values()
    ]

    assistant = {"role": "assistant", "content": None, "tool_calls": list(calls.values())}
    turn = [*QUESTION, assistant, *_results(assistant["tool_calls"])]
    text = ""
    second_usage = None
    for chunk in c.chat.completions.create(
        **{**ARGS, "max_tokens": 12},
        messages=turn,
        tools=TOOLS,
        tool_choice="none",
        stream=True,
        stream_options={"include_usage": True},
    ):
        second_usage = chunk.usage or second_usage
        if chunk.choices:
            assert not chunk.choices[0].delta.tool_calls
            text += chunk.choices[0].delta.content or ""
    assert second_usage.completion_tokens > 0
    assert second_usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens // PAGE * PAGE > 0


def test_a_named_function_and_several_calls_at_once(hermes_server):
    url, _ = hermes_server
    c = client(url)
    named = {"type": "function", "function": {"name": "get_time"}}
    reply = c.chat.completions.create(**ARGS, messages=QUESTION, tools=TOOLS, tool_choice=named)
    assert len(reply.choices[0].message.tool_calls) == 1
    _check_call(reply.choices[0].message.tool_calls[0], names=("get_time",))
    several = c.chat.completions.create(
        **{**ARGS, "max_tokens": 300, "parallel_tool_calls": True},
        messages=QUESTION,
        tools=TOOLS,
        tool_choice="required",
    )
    calls = several.choices[0].message.tool_calls
    assert len(calls) > 1 and len({call.id for call in calls}) == len(calls)
    for call in calls:
        _check_call(call)


def test_auto_answers_text_or_well_formed_calls(hermes_server):
    url, _ = hermes_server
    c = client(url)
    for seed in range(2):
        reply = c.chat.completions.create(**{**ARGS, "temperature": 1.0}, seed=seed, messages=QUESTION, tools=TOOLS)
        message, reason = reply.choices[0].message, reply.choices[0].finish_reason
        if message.tool_calls:
            assert reason == "tool_calls"
            for call in message.tool_calls:
                _check_call(call)
        else:
            assert reason in ("stop", "length") and "<tool_call>" not in (message.content or "")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        (
            {
                "messages": [
                    *QUESTION,
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{"}}],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
        ({"messages": [*QUESTION, {"role": "tool", "content": "42"}]}, "messages[1].tool_call_id"),
    ],
)
def test_bad_tools_get_a_400_naming_the_field(hermes_server, fields, param):
    url, _ = hermes_server
    body = {**ARGS, "messages": QUESTION, **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        client(url).chat.completions.create(**body)
    assert caught.value.status_code == 400 and caught.value.body["param"] == param


def test_a_syntax_of_special_tokens_is_decoded_and_read(serving, tmp_path):
    """Mistral's [TOOL_CALLS] is a special token: the job decodes it so the parser sees the calls."""
    _conftest.build_tiny(tmp_path, extra_special=("[TOOL_CALLS]",))
    model = Model.load(tmp_path)
    served = ServedModel(model, "tiny", context=1024, page_size=PAGE, template=ChatTemplate(MISTRAL_TEMPLATE))
    assert served.tool_format.name == "mistral"
    with serving(served) as url:
        c = client(url)
        first = c.chat.completions.create(**ARGS, messages=QUESTION, tools=TOOLS, tool_choice="required")
        calls = first.choices[0].message.tool_calls
        assert calls and first.choices[0].finish_reason == "tool_calls"
        for call in calls:
            assert len(call.id) == 9 and call.id.isalnum()  # Mistral's templates take nothing else
            _check_call(call)
        assistant = first.choices[0].message.model_dump(exclude_none=True)
        turn = [*QUESTION, assistant, *_results(assistant["tool_calls"])]
        second = c.chat.completions.create(**{**ARGS, "max_tokens": 8}, messages=turn, tools=TOOLS, tool_choice="none")
        assert second.choices[0].message.tool_calls is None
