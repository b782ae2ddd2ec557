"""Tools and tool messages on their way to a chat template: definitions and choices checked with the field named,
the family read from the template's markers, calls and results in the shape a template takes (rendered by our
sandbox exactly as transformers renders them), and written as text for a template that knows no tools."""

from __future__ import annotations

import json

import pytest
import transformers

from engine.chat_template import ChatTemplate
from engine.tools.formats import tool_format, tool_format_of
from engine.tools.hermes import Hermes
from engine.tools.mistral import Mistral
from engine.tools.schema import ToolChoice, ToolError, read_tool_choice, read_tools
from engine.tools.use import ToolUse

CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "integer"}}, "required": ["zone"]},
    },
}
CALL = {"id": "call_abc123", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": 2}'}}
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What time is it?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_abc123", "content": "14:05"},
]
# Written for this test in the way Qwen2.5's template renders tools, calls and results.
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{{ messages[0].content }}\n<tools>"
    "{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n{% endif %}"
    "{%- for m in messages if m.role != 'system' %}<|im_start|>{{ 'user' if m.role == 'tool' else m.role }}\n"
    "{%- if m.role == 'tool' %}<tool_response>\n{{ m.content }}\n</tool_response>{% else %}{{ m.content }}{% endif %}"
    "{%- for c in m.tool_calls or [] %}\n<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}'
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _error(call, *args) -> ToolError:
    with pytest.raises(ToolError) as caught:
        call(*args)
    return caught.value


def test_tools_and_choices_are_checked_with_the_field_named():
    (tool,) = read_tools([CLOCK])
    assert tool.name == "get_time" and tool.definition() == CLOCK
    assert read_tools(None) == () and read_tools([]) == ()
    assert read_tools([{"type": "function", "function": {"name": "f"}}])[0].parameters["type"] == "object"
    bad = [
        ([{"type": "function", "function": {"description": "x"}}], "tools[0].function.name"),
        ([CLOCK, {"type": "function", "function": {"name": "bad name"}}], "tools[1].function.name"),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], "tools[0].function.parameters"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
            "tools[0].function.parameters",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": {"type": "nope"}}}}}],
            "tools[0].function.parameters",
        ),
        ([CLOCK, CLOCK], "tools[1].function.name"),
        ([{"type": "retrieval"}], "tools[0]"),
        ("get_time", "tools"),
    ]
    for raw, param in bad:
        assert _error(read_tools, raw).param == param, raw
    tools = read_tools([CLOCK])
    assert read_tool_choice(None, tools) == ToolChoice("auto") and read_tool_choice(None, ()) == ToolChoice("none")
    assert read_tool_choice({"type": "function", "function": {"name": "get_time"}}, tools).name == "get_time"
    for raw in ("always", {"type": "function", "function": {"name": "nope"}}, {"function": "get_time"}):
        assert _error(read_tool_choice, raw, tools).param == "tool_choice"
    assert "no tools" in str(_error(read_tool_choice, "required", ()))


@pytest.mark.parametrize(
    ("source", "family", "native"),
    [
        ("{{ tools }}<tool_call>{{ m }}</tool_call>", "hermes", True),
        ("{{ xml_tools }}<tool_call>", "hermes", True),
        ("<|tool_call|>{{ tools }}<|/tool_call|>", "phi", True),
        ("<|tool_call|>{{ message.tools }}", "phi", False),
        ("{{ tools }}<|tool_call>call:{{ name }}{<tool_call|>", "gemma", True),
        ("[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS][{{ c }}]", "mistral", True),
        ("{{ tools }}[TOOL_CALLS]{{ name }}[ARGS]{{ args }}", "mistral_args", True),
        ("{% if tools %}<|python_tag|>{% endif %}", "llama3", True),
        ('<|start_header_id|>{% if tools %}"parameters"{% endif %}', "llama3", True),
        ("<|start|>{{ m }}<|channel|>final<|message|>", "harmony", False),
        ("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}", "hermes", False),
        (None, "hermes", False),
    ],
)
def test_the_family_comes_from_the_template(source, family, native):
    found = tool_format(source)
    assert (found.name, found.native) == (family, native)
    assert tool_format("{{ xml_tools }}<tool_call>").variable == "xml_tools"


def test_a_model_without_a_template_gets_the_generic_syntax(tiny_model):
    fallback = ChatTemplate(None, eos_token="<|im_end|>")
    assert tool_format_of(fallback, tiny_model.tokenizer) == Hermes(native=False)


def test_calls_and_results_render_as_transformers_renders_them(tiny_folder):
    use = ToolUse(tool_format(TEMPLATE), read_tools([CLOCK]), ToolChoice("auto"))
    messages = use.messages(CHAT)
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == {"zone": 2}
    assert messages[3]["name"] == "get_time"  # filled in from the call it answers
    ours = ChatTemplate(TEMPLATE).render(messages, **use.template_options())
    hf = transformers.AutoTokenizer.from_pretrained(tiny_folder)
    theirs = hf.apply_chat_template(
        messages, tools=[CLOCK], chat_template=TEMPLATE, tokenize=False, add_generation_prompt=True
    )
    assert ours == theirs
    assert '<tool_call>\n{"name": "get_time", "arguments": {"zone": 2}}\n</tool_call>' in ours
    assert "<tool_response>\n14:05\n</tool_response>" in ours


def test_mistral_gets_ids_of_nine_letters_and_digits_that_match_their_results():
    messages = ToolUse(Mistral(), read_tools([CLOCK])).messages(CHAT)
    # the last 9 letters and digits of "call_abc123", the same for the call and its result
    assert messages[2]["tool_calls"][0]["id"] == messages[3]["tool_call_id"] == "allabc123"
    short = ToolUse(Mistral(), read_tools([CLOCK])).messages([{**CHAT[2], "tool_calls": [{**CALL, "id": "c1"}]}])
    assert len(short[0]["tool_calls"][0]["id"]) == 9 and short[0]["tool_calls"][0]["id"].isalnum()


def test_a_template_without_tools_gets_them_as_text():
    use = ToolUse(Hermes(native=False), read_tools([CLOCK]), ToolChoice("auto"))
    messages = use.messages([*CHAT, {"role": "tool", "tool_call_id": "other", "content": "again"}])
    assert use.template_options() == {}
    assert messages[0]["role"] == "system" and messages[0]["content"].startswith("Be brief.\n\n# Tools")
    assert json.dumps(CLOCK) in messages[0]["content"] and "<tool_call>" in messages[0]["content"]
    assert messages[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_time", "arguments": {"zone": 2}}\n</tool_call>',
        "tool_calls": None,
    }
    # the results of one turn's calls are one user message
    assert messages[3:] == [
        {
            "role": "user",
            "content": "<tool_response>\n14:05\n</tool_response>\n<tool_response>\nagain\n</tool_response>",
        }
    ]
    without_system = use.messages(CHAT[1:])
    assert without_system[0]["role"] == "system" and without_system[0]["content"].startswith("# Tools")


def test_arguments_that_are_not_a_json_object_are_refused_by_field():
    use = ToolUse(Hermes(), read_tools([CLOCK]))
    for text in ("{", "[1]"):
        bad = {**CHAT[2], "tool_calls": [{**CALL, "function": {"name": "get_time", "arguments": text}}]}
        assert _error(use.messages, [CHAT[1], bad]).param == "messages[1].tool_calls[0].function.arguments"
