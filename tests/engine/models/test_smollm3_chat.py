"""SmolLM3's chat template and its thinking switch: the template HuggingFaceTB/SmolLM3-3B ships (its
chat_template.jinja), rendered by our sandbox as transformers renders it, with thinking on (the default), off
(enable_thinking=False) and switched by the `/think` and `/no_think` flags of a system message; the reasoning
format read from it (<think> tags, a toggle), and a job whose thinking streams apart from its answer."""

from __future__ import annotations

import json
import re

import pytest
import torch
import transformers

from engine.chat_template import ChatTemplate
from engine.reasoning import ReasoningFormat, reasoning_format, reasoning_format_of, split_reasoning

_THINKING_SYSTEM = (
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role as an assistant involves "
    "thoroughly exploring questions through a systematic thinking process before providing the final precise and "
    "accurate solutions. This requires engaging in a comprehensive cycle of analysis, summarizing, exploration, "
    "reassessment, reflection, backtracking, and iteration to develop well-considered thinking process. Please "
    "structure your response into two main sections: Thought and Solution using the specified format: <think> "
    "Thought section </think> Solution section. In the Thought section, detail your reasoning process in steps. "
    "Each step should include detailed considerations such as analysing questions, summarizing relevant findings, "
    "brainstorming new ideas, verifying the accuracy of the current steps, refining any errors, and revisiting "
    "previous steps. In the Solution section, based on various attempts, explorations, and reflections from the "
    "Thought section, systematically present the final solution that you deem correct. The Solution section "
    "should be logical, accurate, and concise and detail necessary steps needed to reach the conclusion.\\n\\n"
)
SMOLLM3_TEMPLATE = (
    """{# ───── defaults ───── #}
{%- if enable_thinking is not defined -%}
{%- set enable_thinking = true -%}
{%- endif -%}
{# ───── reasoning mode ───── #}
{%- if enable_thinking -%}
  {%- set reasoning_mode = "/think" -%}
{%- else -%}
  {%- set reasoning_mode = "/no_think" -%}
{%- endif -%}
{# ───── header (system message) ───── #}
{{- "<|im_start|>system\\n" -}}
{%- if messages[0].role == "system" -%}
  {%- set system_message = messages[0].content -%}
  {%- if "/no_think" in system_message -%}
    {%- set reasoning_mode = "/no_think" -%}
  {%- elif "/think" in system_message -%}
    {%- set reasoning_mode = "/think" -%}
  {%- endif -%}
  {%- set custom_instructions = system_message.replace("/no_think", "").replace("/think", "").rstrip() -%}
{%- endif -%}
{%- if "/system_override" in system_message -%}
  {{- custom_instructions.replace("/system_override", "").rstrip() -}}
  {{- "<|im_end|>\\n" -}}
{%- else -%}
  {{- "## Metadata\\n\\n" -}}
  {{- "Knowledge Cutoff Date: June 2025\\n" -}}
  {%- set today = strftime_now("%d %B %Y") -%}
  {{- "Today Date: " ~ today ~ "\\n" -}}
  {{- "Reasoning Mode: " + reasoning_mode + "\\n\\n" -}}
  {{- "## Custom Instructions\\n\\n" -}}
  {%- if custom_instructions -%}
    {{- custom_instructions + "\\n\\n" -}}
  {%- elif reasoning_mode == "/think" -%}
    {{- \""""
    + _THINKING_SYSTEM
    + """\" -}}
  {%- else -%}
    {{- "You are a helpful AI assistant named SmolLM, trained by Hugging Face.\\n\\n" -}}
  {%- endif -%}
  {%- if xml_tools or python_tools -%}
    {{- "### Tools\\n\\n" -}}
    {%- if xml_tools -%}
      {%- set ns = namespace(xml_tool_string="You may call one or more functions to assist with the user query.\\nYou are provided with function signatures within <tools></tools> XML tags:\\n\\n<tools>\\n") -%}
      {%- for tool in xml_tools[:] -%} {# The slicing makes sure that xml_tools is a list #}
        {%- set ns.xml_tool_string = ns.xml_tool_string ~ (tool | string) ~ "\\n" -%}
      {%- endfor -%}
      {%- set xml_tool_string = ns.xml_tool_string + "</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>" -%}
      {{- xml_tool_string -}}
    {%- endif -%}
    {%- if python_tools -%}
      {%- set ns = namespace(python_tool_string="When you send a message containing Python code between '<code>' and '</code>' tags, it will be executed in a stateful Jupyter notebook environment, and you will then be given the output to continued reasoning in an agentic loop.\\n\\nYou can use the following tools in your python code like regular functions:\\n<tools>\\n") -%}
      {%- for tool in python_tools[:] -%} {# The slicing makes sure that python_tools is a list #}
        {%- set ns.python_tool_string = ns.python_tool_string ~ (tool | string) ~ "\\n" -%}
      {%- endfor -%}
      {%- set python_tool_string = ns.python_tool_string + "</tools>\\n\\nThe state persists between code executions: so variables that you define in one step are still available thereafter." -%}
      {{- python_tool_string -}}
    {%- endif -%}
    {{- "\\n\\n" -}}
    {{- "<|im_end|>\\n" -}}
  {%- endif -%}
{%- endif -%}
{# ───── main loop ───── #}
{%- for message in messages -%}
    {%- set content = message.content if message.content is string else "" -%}
    {%- if message.role == "user" -%}
        {{ "<|im_start|>" + message.role + "\\n"  + content + "<|im_end|>\\n" }}
    {%- elif message.role == "assistant" -%}
        {% generation %}
        {%- if reasoning_mode == "/think" -%}
            {{ "<|im_start|>assistant\\n" + content.lstrip("\\n") + "<|im_end|>\\n" }}
        {%- else -%}
            {{ "<|im_start|>assistant\\n" + "<think>\\n\\n</think>\\n" + content.lstrip("\\n") + "<|im_end|>\\n" }}
        {%- endif -%}
        {% endgeneration %}
    {%- elif message.role == "tool" -%}
    {{ "<|im_start|>" + "user\\n"  + content + "<|im_end|>\\n" }}
    {%- endif -%}
{%- endfor -%}
{# ───── generation prompt ───── #}
{%- if add_generation_prompt -%}
    {%- if reasoning_mode == "/think" -%}
        {{ "<|im_start|>assistant\\n" }}
    {%- else -%}
        {{ "<|im_start|>assistant\\n" + "<think>\\n\\n</think>\\n"  }}
    {%- endif -%}
{%- endif -%}
"""
)
THINK = ReasoningFormat("<think>", "</think>", toggle=True)
HISTORY = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Colours?"},
]


def _dateless(text: str) -> str:
    """The prompt without its "Today Date" line (strftime_now), so two renders a midnight apart still agree."""
    return re.sub(r"Today Date: [^\n]*\n", "Today Date: -\n", text)


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_folder):
    """The tiny tokenizer with SmolLM3's template, as transformers renders it."""
    tok = transformers.AutoTokenizer.from_pretrained(tiny_folder)
    tok.chat_template = SMOLLM3_TEMPLATE
    return tok


CASES = [
    ({}, HISTORY, "/think"),
    ({"enable_thinking": False}, HISTORY, "/no_think"),
    ({}, [{"role": "system", "content": "Be brief. /no_think"}, *HISTORY], "/no_think"),
    ({"enable_thinking": False}, [{"role": "system", "content": "/think Be brief."}, *HISTORY], "/think"),
    ({}, [{"role": "system", "content": "Only this. /system_override"}, *HISTORY], "/think"),
]


@pytest.mark.parametrize(("options", "messages", "mode"), CASES, ids=["on", "off", "/no_think", "/think", "override"])
def test_our_render_is_transformers_and_the_prompt_says_where_the_answer_starts(hf_tokenizer, options, messages, mode):
    ours = ChatTemplate(SMOLLM3_TEMPLATE).render(messages, **options)
    theirs = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **options)
    assert _dateless(ours) == _dateless(theirs)
    if "/system_override" not in json.dumps(messages):
        assert f"Reasoning Mode: {mode}\n" in ours
    fmt = reasoning_format(SMOLLM3_TEMPLATE)
    assert fmt == THINK and not fmt.starts_inside(ours)
    thinking_off = mode == "/no_think"
    assert ours.endswith("<|im_start|>assistant\n<think>\n\n</think>\n" if thinking_off else "<|im_start|>assistant\n")
    generated = "Red." if thinking_off else "<think>\nThey want colours.\n</think>\nRed."
    assert split_reasoning(generated, fmt, ours) == ("" if thinking_off else "They want colours.", "Red.")


def test_a_system_flag_is_taken_out_of_the_instructions():
    text = ChatTemplate(SMOLLM3_TEMPLATE).render([{"role": "system", "content": "Be brief. /no_think"}, *HISTORY])
    assert "## Custom Instructions\n\nBe brief.\n\n<|im_start|>user" in text  # (no <|im_end|> there, as released)
    assert "<|im_start|>assistant\n<think>\n\n</think>\nHello!<|im_end|>" in text  # earlier answers, thinking off


@pytest.mark.parametrize("options", [{}, {"enable_thinking": False}], ids=["thinking", "thinking off"])
def test_a_job_streams_smollm3s_thinking_apart_from_its_answer(tmp_path, reasoning_models, options):
    """A tiny SmolLM3 whose tokenizer has the tags as tokens, held by a filter to the shape thinking takes."""
    from engine import Cache, DynamicGenerator, DynamicJob, Model, SamplerSettings
    from engine.chat.prompt import encode_chat
    from engine.generator.filters import RegexFilter

    tokenizer = reasoning_models.tag_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": SMOLLM3_TEMPLATE}))
    cfg = transformers.SmolLM3Config(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    transformers.SmolLM3ForCausalLM(cfg).eval().save_pretrained(tmp_path)
    model = Model.load(tmp_path, dtype=torch.float32)
    template = ChatTemplate.from_tokenizer(model.tokenizer)
    fmt = reasoning_format_of(template, model.tokenizer)
    assert fmt == THINK
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Colours?"}]
    ids = encode_chat(model.tokenizer, template, messages, **options)
    prompt = model.tokenizer.decode(ids, decode_special_tokens=True)
    thinks = not options
    pattern = r"<think>[a-z ]{3,12}</think>\n[a-z ]{3,12}" if thinks else r"[a-z ]{3,12}"
    generator = DynamicGenerator(model, Cache(model, max_seq_len=512, page_size=16), model.tokenizer)
    job = DynamicJob(ids, 40, gen_settings=SamplerSettings.greedy(), filters=[RegexFilter(pattern)], reasoning=fmt)
    generator.enqueue(job)
    eos = None
    while generator.num_remaining_jobs():
        for result in generator.iterate():
            if result["stage"] == "streaming" and result["eos"]:
                eos = result
    assert eos is not None and eos["eos_reason"] == "end_filter"
    assert (eos["full_reasoning"], eos["full_answer"]) == split_reasoning(eos["full_completion"], fmt, prompt)
    assert bool(eos["full_reasoning"]) == thinks and eos["full_answer"].strip()
    assert "<think>" not in eos["full_answer"] and "</think>" not in eos["full_answer"]
