"""Chat templates: parity with transformers' apply_chat_template, the limits and the sandbox.

The tiny model folders below hold a real `tokenizers` tokenizer and templates written for these tests,
each exercising a feature real Hugging Face templates use.
"""

from __future__ import annotations

import json
import re
import threading
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.chat_template import CHATML_TEMPLATE, ChatTemplate, find_chat_template
from engine.errors import ChatTemplateError

# --- conversations ------------------------------------------------------------------------------------

SINGLE = [{"role": "user", "content": "Hello there"}]
MULTI = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4", "tool_calls": None},  # None keys are dropped, as transformers does
    {"role": "user", "content": "And 3+3?"},
]
WITH_SYSTEM = [
    {"role": "system", "content": "  Answer briefly.  "},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another?"},
]
UNICODE = [
    {"role": "system", "content": "Tu es un assistant 🤖 — réponds en français."},
    {
        "role": "user",
        "content": '¿Qué tal? 你好 naïve café\u2028line "quoted" <tag> & {{ not_a_var }} {% raw %}',
    },
    {"role": "assistant", "content": "Привет! 日本語もOK 👍🏽"},
    {"role": "user", "content": "Ελληνικά; עברית? \t tabs\nnewlines"},
]
LONG = [
    {"role": "user", "content": f"turn {i}"} if i % 2 == 0 else {"role": "assistant", "content": f"reply {i}"}
    for i in range(7)
]
CONVERSATIONS = {"single": SINGLE, "multi": MULTI, "system": WITH_SYSTEM, "unicode": UNICODE, "long": LONG}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo actuelle — returns °C for a city <b>now</b> & 'later'",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "now", "description": "时间", "parameters": {"type": "object"}},
    },
]
DOCUMENTS = [{"title": "Notes", "text": "Paris is in France."}, {"title": "Ünïcode", "text": "😀 text"}]

# --- templates written for these tests ------------------------------------------------------------------

# bos_token prefix, a leading system message or a default one, role alternation enforced with
# raise_exception, loop.first / loop.last / loop.length, eos after assistant turns, and block tags
# without `-` so trim_blocks / lstrip_blocks decide the whitespace.
ALTERNATING = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system = messages[0]['content'] %}
    {%- set rest = messages[1:] %}
{%- else %}
    {%- set system = 'You are a tiny test model.' %}
    {%- set rest = messages %}
{%- endif %}
[SYS]{{ system | trim }}[/SYS]
{% for message in rest %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if loop.first %}<first>{% endif %}
    {% if message.tool_calls is defined %}[tool calls: {{ message.tool_calls }}]{% endif %}
    {% if message['role'] == 'user' %}
[INST] {{ message['content'] }} [/INST]
    {% else %}
{{ message['content'] }}{{ eos_token }}
    {% endif %}
    {% if loop.last %}<last n={{ loop.length }}>
{% endif %}
{% endfor %}
{% if add_generation_prompt %}ASSISTANT:{% endif %}"""

# namespace() carried across loops, tojson with every option transformers accepts, documents,
# {% continue %} / {% break %} (loopcontrols), dict(), and add_generation_prompt printed as a value.
TOOLS_AND_NAMESPACE = """{%- set ns = namespace(last_user=-1, count=0) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- if tools %}
<tools>
{% for tool in tools %}
{{ tool | tojson }}
{{ tool['function'] | tojson(indent=2) }}
{{ tool | tojson(separators=(',', ':'), sort_keys=true) }}
{{ tool | tojson(ensure_ascii=true) }}
{% endfor %}
</tools>
{% endif %}
{%- if documents %}
{% for doc in documents %}<doc id={{ loop.index }} title="{{ doc.title }}">{{ doc.text }}</doc>
{% endfor %}
{% endif %}
{%- for m in messages %}
    {%- if m.role == 'system' %}{% continue %}{% endif %}
    {%- set ns.count = ns.count + 1 %}
<|{{ m.role }}|>{{ m.content }}{% if loop.index0 == ns.last_user %} (latest){% endif %}

    {%- if ns.count >= 3 %}{% break %}{% endif %}
{%- endfor %}
{{ dict(turns=ns.count, generation=add_generation_prompt, roles=messages | map(attribute='role') | list) | tojson }}
{{ dict.fromkeys(['a', 'b'], 0) | tojson }}
{%- if add_generation_prompt %}<|assistant|>{% endif %}"""

# strftime_now, content given as parts with images, the {% generation %} tag, reasoning_content
# (transformers also fills it from a message's "reasoning"), and string methods.
DATED_PARTS = """{{ bos_token }}Today is {{ strftime_now('%d %B %Y') }}.
{% for m in messages %}
<{{ m.role }}>
{%- if m.content is string %}{{ m.content.strip() }}
{%- else %}{% for p in m.content %}{% if p.type == 'image' %}<image>{% elif p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}
{%- endif %}
{%- if m.role == 'assistant' %}{% generation %}
{%- if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ eos_token }}
{%- endgeneration %}{% endif %}
</{{ m.role }}>
{% endfor %}
{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}"""
DATE_RE = re.compile(r"Today is \d{2} [A-Z][a-z]+ \d{4}\.")

NAMED_DEFAULT = "{{ bos_token }}{% for m in messages %}({{ m.role }}: {{ m.content }}){% endfor %}{% if add_generation_prompt %}(assistant:{% endif %}"
NAMED_TOOL_USE = "TOOL USE {{ tools | tojson }}"

PARTS = [
    {"role": "system", "content": "Describe images."},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is this? "}]},
    {"role": "assistant", "content": "A cat.", "reasoning": "fur, whiskers"},
    {
        "role": "user",
        "content": [{"type": "text", "text": "And "}, {"type": "image"}, {"type": "text", "text": "?"}],
    },
]

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


# --- fixture folders -------------------------------------------------------------------------------------


def _write_model_folder(folder: Path, config_template=None, jinja: str | None = None) -> Path:
    """A tokenizer.json made by the `tokenizers` library, a tokenizer_config.json, maybe a chat_template.jinja."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "there": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<s>", "</s>"])
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **SPECIAL}
    if config_template is not None:
        config["chat_template"] = config_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    if jinja is not None:
        (folder / "chat_template.jinja").write_text(jinja, encoding="utf-8")
    return folder


FOLDERS = {
    "alternating": {"config_template": ALTERNATING},
    "tools": {"config_template": TOOLS_AND_NAMESPACE},
    # The .jinja file must win over the tokenizer_config key.
    "jinja_file": {"config_template": "WRONG {{ messages }}", "jinja": DATED_PARTS},
    "named": {
        "config_template": [
            {"name": "tool_use", "template": NAMED_TOOL_USE},
            {"name": "default", "template": NAMED_DEFAULT},
        ]
    },
}


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """name -> (folder, transformers tokenizer loaded from it)."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("chat_models")
    out = {}
    for name, spec in FOLDERS.items():
        folder = _write_model_folder(root / name, **spec)
        out[name] = (folder, AutoTokenizer.from_pretrained(folder))
    return out


def _ours(folder: Path) -> ChatTemplate:
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    return ChatTemplate(
        find_chat_template(folder),
        bos_token=config["bos_token"],
        eos_token=config["eos_token"],
        unk_token=config["unk_token"],
    )


def _reference(hf_tokenizer, messages, add_generation_prompt: bool, **kwargs) -> str:
    return hf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )


# --- parity with transformers ---------------------------------------------------------------------------


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("folder_name", ["alternating", "tools", "named"])
def test_matches_transformers(model_folders, folder_name, conversation, add_generation_prompt):
    folder, hf = model_folders[folder_name]
    messages = CONVERSATIONS[conversation]
    expected = _reference(hf, messages, add_generation_prompt)
    assert _ours(folder).render(messages, add_generation_prompt=add_generation_prompt) == expected
    assert ChatTemplate.from_tokenizer(hf).render(messages, add_generation_prompt=add_generation_prompt) == expected


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("conversation", ["system", "unicode"])
def test_tools_and_documents_match_transformers(model_folders, conversation, add_generation_prompt):
    folder, hf = model_folders["tools"]
    messages = CONVERSATIONS[conversation]
    expected = _reference(hf, messages, add_generation_prompt, tools=TOOLS, documents=DOCUMENTS)
    ours = _ours(folder).render(messages, add_generation_prompt=add_generation_prompt, tools=TOOLS, documents=DOCUMENTS)
    assert ours == expected
    # Non-ASCII is kept by default, escaped when asked, and HTML characters are never escaped.
    assert "Météo" in ours and "M\\u00e9t\\u00e9o" in ours and "<b>now</b> & 'later'" in ours


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("conversation", [*CONVERSATIONS, "parts"])
def test_dated_template_from_jinja_file_matches_transformers(model_folders, conversation, add_generation_prompt):
    folder, hf = model_folders["jinja_file"]
    messages = PARTS if conversation == "parts" else CONVERSATIONS[conversation]
    expected = _reference(hf, messages, add_generation_prompt)
    ours = _ours(folder).render(messages, add_generation_prompt=add_generation_prompt)
    # The date is compared by shape: the two renders may straddle midnight.
    assert len(DATE_RE.findall(ours)) == 1
    assert DATE_RE.sub("<DATE>", ours) == DATE_RE.sub("<DATE>", expected)
    assert not ours.startswith("WRONG")


@pytest.mark.parametrize("extra", [{"enable_thinking": False}, {"enable_thinking": True}, {"bos_token": "<B>"}])
def test_extra_variables_match_transformers(model_folders, extra):
    folder, hf = model_folders["jinja_file"]
    expected = DATE_RE.sub("<DATE>", _reference(hf, MULTI, True, **extra))
    assert DATE_RE.sub("<DATE>", _ours(folder).render(MULTI, **extra)) == expected
    assert expected.startswith(extra.get("bos_token", "<s>"))
    assert expected.endswith("<think></think>") == (extra.get("enable_thinking") is False)


def test_parts_and_reasoning_reach_the_template(model_folders):
    folder, _ = model_folders["jinja_file"]
    out = _ours(folder).render(PARTS, add_generation_prompt=True)
    assert "<user><image> What is this?" in out
    assert "<think>fur, whiskers</think></s>" in out
    assert out.endswith("<assistant>")


def test_named_template_list_uses_default(model_folders):
    folder, _ = model_folders["named"]
    assert find_chat_template(folder) == NAMED_DEFAULT
    assert _ours(folder).render(SINGLE, add_generation_prompt=False) == "<s>(user: Hello there)"


def test_bad_role_order_raises_like_transformers(model_folders):
    from jinja2 import TemplateError

    folder, hf = model_folders["alternating"]
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(TemplateError, match="must alternate"):
        _reference(hf, bad, True)
    with pytest.raises(ChatTemplateError, match=r"Conversation roles must alternate user/assistant"):
        _ours(folder).render(bad)


@pytest.fixture(scope="module")
def starter(starter_gguf, starter_hf_tokenizer):
    """(our ChatTemplate, transformers tokenizer) for the starter GGUF."""
    from engine.gguf.file import GGUFFile

    path = Path(starter_gguf)
    metadata = GGUFFile(path).metadata
    tokens = metadata["tokenizer.ggml.tokens"]
    ours = ChatTemplate(
        find_chat_template(path),
        bos_token=tokens[metadata["tokenizer.ggml.bos_token_id"]],
        eos_token=tokens[metadata["tokenizer.ggml.eos_token_id"]],
    )
    return ours, starter_hf_tokenizer


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_starter_model_matches_transformers(starter, conversation, add_generation_prompt):
    ours, hf = starter
    messages = CONVERSATIONS[conversation]
    assert ours.has_own_template
    assert ours.source == hf.chat_template
    expected = _reference(hf, messages, add_generation_prompt)
    assert ours.render(messages, add_generation_prompt=add_generation_prompt) == expected


# --- ChatML fallback ------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", [None, "", "  \n"])
def test_chatml_fallback(source):
    template = ChatTemplate(source)
    assert not template.has_own_template
    assert template.source == CHATML_TEMPLATE
    messages = [
        *WITH_SYSTEM[:2],
        {"role": "assistant", "content": [{"type": "text", "text": "Red"}, {"type": "image"}]},
    ]
    expected = (
        "<|im_start|>system\n  Answer briefly.  <|im_end|>\n"
        "<|im_start|>user\nName a colour.<|im_end|>\n"
        "<|im_start|>assistant\nRed<|im_end|>\n"
    )
    assert template.render(messages, add_generation_prompt=False) == expected
    assert template.render(messages) == expected + "<|im_start|>assistant\n"


def test_from_tokenizer_handles_named_dicts_and_missing_templates():
    named = SimpleNamespace(chat_template={"x": "X", "default": "D{{ eos_token }}"}, bos_token="<s>", eos_token="</s>")
    assert ChatTemplate.from_tokenizer(named).render(SINGLE) == "D</s>"
    bare = SimpleNamespace(chat_template=None, bos_token=None, eos_token=None)
    assert not ChatTemplate.from_tokenizer(bare).has_own_template
    # An unset special token renders as nothing, like transformers, never as "None".
    assert ChatTemplate("[{{ bos_token }}]", bos_token=None).render(SINGLE) == "[]"


# --- errors ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "{% for m in messages %}{{ m.content }}",  # unclosed for
        "{{ messages[0].content }",  # unclosed expression
        "{% if %}x{% endif %}",  # empty condition
        "{% frobnicate %}",  # unknown tag
    ],
)
def test_syntax_error_is_reported_at_construction(source):
    with pytest.raises(ChatTemplateError, match="syntax error at line 1"):
        ChatTemplate(source)


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        (
            "{{ raise_exception('Only user and assistant roles are supported!') }}",
            "Only user and assistant roles",
        ),
        ("{{ messages[0].content.missing.deeper }}", "missing"),  # undefined attribute used further
        ("{{ nothing_here + 1 }}", "nothing_here"),
        ("{{ messages | length + 'x' }}", "TypeError"),
        ("{{ strftime_now(5) }}", "TypeError"),
        ("{{ nothing_here | tojson }}", "TypeError"),  # Undefined is not JSON
        ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "RecursionError"),
        # Bounded cheaply here; the same operators with bigger numbers would hang or exhaust memory.
        ("{{ 10 ** 100000 > 1 }}", "too large"),
        ("{{ ('ab' * 10 ** 8) | length }}", "too large"),
        ("{{ (2 * 10 ** 7 * [0]) | length }}", "too large"),
    ],
)
def test_template_failures_become_chat_template_errors(source, needle):
    template = ChatTemplate(source)
    with pytest.raises(ChatTemplateError, match=re.escape(needle)):
        template.render(SINGLE)


@pytest.mark.parametrize("messages", ["hello", [("user", "hi")], {"role": "user", "content": "hi"}])
def test_messages_must_be_a_list_of_dicts(messages):
    with pytest.raises(TypeError, match="messages"):
        ChatTemplate(None).render(messages)


# --- limits: a render stops in bounded time and memory, with an error naming the limit ---------------------

# A doubling namespace value: 64 doublings would reach 2**64 characters (or items) without the limits.
_DOUBLE = "{% set ns = namespace(v=START) %}{% for i in range(64) %}{% set ns.v = STEP %}{% endfor %}{{ ns.v }}"

HOSTILE = {
    # time
    "nested_range_loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "ran past 2 s",
    ),
    "exponential_macro_recursion": (
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
        "ran past 2 s",
    ),
    "nested_loops_over_a_long_string": (
        "{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
        "ran past 2 s",
    ),
    # format widths and precisions
    "str_format_width": ("{{ '{:>2000000000}'.format(1) }}", "format width or precision of"),
    "str_format_width_argument": ("{{ '{:>{}}'.format(1, 2000000000) }}", "format width or precision of"),
    "str_format_precision": ("{{ '{:.2000000000f}'.format(1.5) }}", "format width or precision of"),
    "format_map_width": ("{{ '{x:>2000000000}'.format_map({'x': 1}) }}", "format width or precision of"),
    "str_format_repeated_field": ("{{ ('{0}' * 10000).format('a' * 4000) }}", "too large"),
    "percent_width": ("{{ '%2000000000d' % 1 }}", "%-format width of"),
    "percent_precision": ("{{ '%.2000000000f' % 1.5 }}", "%-format width of"),
    "percent_star_width": ("{{ '%*d' % (2000000000, 1) }}", "%-format width of 2000000000"),
    "percent_named_repeated": ("{{ ('%(a)s' * 10000) % {'a': 'a' * 4000} }}", "too large"),
    "format_filter_width": ("{{ '%2000000000d' | format(1) }}", "%-format width of"),
    # padding
    "center_filter": ("{{ 'a' | center(2000000000) }}", "center() padding of"),
    "center_method": ("{{ 'a'.center(2000000000) }}", "str.center() padding of"),
    "ljust": ("{{ 'a'.ljust(2000000000) }}", "str.ljust() padding of"),
    "rjust": ("{{ 'a'.rjust(2000000000) }}", "str.rjust() padding of"),
    "zfill": ("{{ 'a'.zfill(2000000000) }}", "str.zfill() padding of"),
    "indent_width": ("{{ 'a\nb' | indent(2000000000) }}", "an indent of"),
    "tojson_indent": ("{{ messages | tojson(indent=2000000000) }}", "JSON indented by 2000000000"),
    # repetition, doubling, sharing
    "string_repeat": ("{{ 'a' * 10 ** 9 }}", "a sequence repeated 1000000000 times"),
    "list_repeat": ("{{ [0] * 10 ** 9 }}", "a sequence repeated 1000000000 times"),
    "string_doubling_with_tilde": (_DOUBLE.replace("START", "'a'").replace("STEP", "ns.v ~ ns.v"), "too large"),
    "string_doubling_with_plus": (_DOUBLE.replace("START", "'a'").replace("STEP", "ns.v + ns.v"), "too large"),
    "list_doubling": (_DOUBLE.replace("START", "[1]").replace("STEP", "ns.v + ns.v"), "too large"),
    "shared_list_doubling": (_DOUBLE.replace("START", "[1]").replace("STEP", "[ns.v, ns.v]"), "too large"),
    "macro_varargs_doubling": (
        "{% set ns = namespace(v=[1]) %}{% macro keep() %}{% set ns.v = varargs %}{% endmacro %}"
        "{% for i in range(64) %}{{ keep(ns.v, ns.v) }}{% endfor %}{{ ns.v }}",
        "too large",
    ),
    "integer_squaring": (_DOUBLE.replace("START", "2").replace("STEP", "ns.v * ns.v"), "too large"),
    "replace_amplification": ("{% set s = 'a' * 4000000 %}{{ s | replace('a', s) }}", "4000000 replacements"),
    "join_amplification": ("{% set s = 'a' * 1000 %}{{ s.join([s] * 4000) }}", "too large"),
    "range_size": ("{{ range(10 ** 9) | length }}", "range(1000000000), 1000000000 items"),
    "batch_fill": ("{{ [1] | batch(10 ** 9, 'x') | list }}", "1000000000 items"),
    "unlisted_method": ("{{ (1).to_bytes(10 ** 9, 'big') }}", "may not call int.to_bytes()"),
    # output
    "output_limit": ("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", "rendered more than 4 MB"),
    "buffered_output": (
        "{% set x %}{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}{% endset %}{{ x | length }}",
        "built more than 64 MB",
    ),
}


@pytest.mark.timing
@pytest.mark.parametrize(("source", "needle"), list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_templates_stop_in_bounded_time_and_memory(source, needle):
    template = ChatTemplate(source)
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(ChatTemplateError, match=re.escape(needle)) as error:
            template.render(SINGLE)
        elapsed = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < 5.0, f"took {elapsed:.1f} s"
    assert peak < 300 * 2**20, f"allocated {peak / 2**20:.0f} MB"
    assert str(error.value).startswith("The chat template ")  # a sentence for the window, saying what to do
    assert "another model" in str(error.value)


def test_a_long_chat_renders_within_the_limits():
    # About 3 MB of chat through a template that copies each message with `+` several times: no limit trips.
    chat = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i}: " + "lorem ipsum dolor sit " * 70}
        for i in range(2000)
    ]
    template = ChatTemplate(ALTERNATING, bos_token="<s>", eos_token="</s>")
    start = time.monotonic()
    out = template.render(chat)
    assert time.monotonic() - start < 1.5
    assert len(out) > 3_000_000 and chat[-1]["content"] in out


def test_a_hostile_render_on_one_thread_leaves_others_alone():
    failures = []

    def hostile():
        try:
            ChatTemplate(HOSTILE["nested_range_loops"][0]).render(SINGLE)
        except ChatTemplateError as e:
            failures.append(str(e))

    worker = threading.Thread(target=hostile)
    worker.start()
    outputs = [ChatTemplate(None).render(SINGLE) for _ in range(20)]  # each has its own deadline
    worker.join(10)
    assert not worker.is_alive() and "ran past 2 s" in failures[0]
    assert outputs == ["<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"] * 20


def test_an_oversized_template_source_is_refused_at_construction():
    with pytest.raises(ChatTemplateError, match="at most 1048576"):
        ChatTemplate("x" * (2 * 1024 * 1024))


# --- sandbox ---------------------------------------------------------------------------------------------

ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__.__mro__ }}",
    "{{ ().__class__.__base__.__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('cat ' ~ secret_path).read() }}",
    "{{ joiner.__init__.__globals__['__builtins__']['open'](secret_path).read() }}",
    "{{ lipsum.__globals__['os'].environ }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ raise_exception.__globals__['json'] }}",
    "{{ strftime_now.__globals__ }}",
    "{{ range.__self__ }}",
    "{{ dict.__class__.__subclasses__() }}",
    "{{ dict.mro() }}",
    "{{ messages.__class__ }}{{ messages[0].__dict__ }}",
    "{{ self.__dict__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ self._TemplateReference__context.parent }}",
    "{{ ''|attr('__class__')|attr('__mro__') }}",
    "{{ '{0.__class__.__mro__}'.format('') }}",
    "{{ '{0.__init__.__globals__}'.format(cycler) }}",
    "{{ '%s' | format(cycler.__init__.__globals__) }}",
    "{% include '/etc/passwd' %}",
    "{% include secret_path %}",
    "{% include ['/etc/passwd', secret_path] ignore missing %}",
    "{% import secret_path as s %}{{ s }}",
    "{% from secret_path import x %}{{ x }}",
    "{% extends secret_path %}",
    "{{ messages.append({'role': 'user', 'content': 'injected'}) }}",
    "{% set _ = messages.pop() %}",
    "{% set _ = messages[0].update({'content': 'pwned'}) %}",
    "{% set _ = messages[0].clear() %}",
    "{% set ns = namespace(__class__=1) %}",
    "{% set ns = namespace() %}{% set ns._Namespace__attrs = {} %}",
    "{{ messages[0].content[1].image.write_text('pwned') }}",  # a Path object handed in by the caller
    "{{ messages[0].content[1].image.read_text() }}",
]


@pytest.mark.parametrize("source", ESCAPES)
def test_sandbox_escapes_fail_or_render_nothing_secret(tmp_path, monkeypatch, source):
    secret = "s3cr3t-6f1d2b8e-chat-template"
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(secret)
    monkeypatch.setenv("TANDEM_TEST_SECRET", secret)
    victim = tmp_path / "victim.txt"
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "look"}, {"type": "image", "image": secret_file}],
        }
    ]
    messages[0]["content"][1]["image"] = victim if "write_text" in source else secret_file
    before = json.dumps(messages, default=str)
    try:
        output = ChatTemplate(source).render(messages, secret_path=str(secret_file))
    except ChatTemplateError as e:
        output = str(e)
    assert secret not in output
    assert "<class" not in output and "<built-in" not in output and "<module" not in output
    assert not victim.exists()
    assert json.dumps(messages, default=str) == before  # the caller's messages are untouched


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{% include secret_path %}",
        "{% import secret_path as s %}",
        "{{ messages.append(1) }}",
        "{% set _ = messages[0].update({'content': 'pwned'}) %}",
        "{% set ns = namespace(__class__=1) %}",
        "{% set ns = namespace() %}{% set ns._Namespace__attrs = {} %}",
        "{{ messages[0].content[1].image.read_text() }}",
    ],
)
def test_sandbox_escapes_that_must_raise(tmp_path, source):
    messages = [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image", "image": tmp_path}]}]
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render(messages, secret_path=str(tmp_path / "secret.txt"))


@pytest.mark.parametrize(
    "source",
    [
        "{% include '/etc/passwd' %}",
        "{% import '/etc/passwd' as p %}",
        "{% from '/etc/passwd' import x %}",
        "{% extends '/etc/passwd' %}",
    ],
)
def test_templates_cannot_load_files(source):
    with pytest.raises(ChatTemplateError, match="cannot load other templates or files"):
        ChatTemplate(source).render(SINGLE)


def test_rich_objects_reach_the_template_as_inert_text(tmp_path):
    messages = [{"role": "user", "content": [{"type": "image", "image": tmp_path}]}]
    assert ChatTemplate("{{ messages[0].content[0].image }}").render(messages) == "<PosixPath>"


def test_message_text_is_data_not_template_code():
    out = ChatTemplate(None).render([{"role": "user", "content": "{{ 7 * 7 }} {% raise %}"}])
    assert "{{ 7 * 7 }} {% raise %}" in out and "49" not in out
