"""engine/harmony.py and HarmonyFormat (engine/reasoning.py): gpt-oss's harmony channels told apart as thinking and
answer, however the stream splits the markers; the format found from a template or a vocabulary; the reasoning
effort reaching the template; replies ending at <|return|> and <|call|> through the chat front door.

Tried: every way of cutting sample replies into three chunks (analysis then final, a tool call, two analysis
messages, a reply the prompt opened inside its analysis, a header cut off by the token limit, plain text with no
marker, a partial marker at the end), one chunk per token through the streaming detokenizer, a test template and
llama.cpp's copy of the official gpt-oss template, and a tiny Llama made to write a harmony reply
(tests/harmony_models.py) answering through ChatFrontDoor with <|return|> not among its eos tokens.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import os
from pathlib import Path

import pytest

from engine.harmony import HarmonyCall, held_suffix, is_harmony, opens_analysis
from engine.reasoning import HarmonyFormat, ReasoningFormat, reasoning_format, reasoning_format_of, split_reasoning
from engine.tokenizer.detokenizer import StreamingDetokenizer

_spec = importlib.util.spec_from_file_location("harmony_models", Path(__file__).parents[1] / "harmony_models.py")
harmony_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harmony_models)

HARMONY = HarmonyFormat()
PROMPT = "<|start|>user<|message|>Colours?<|end|><|start|>assistant"
OPENED = "<|start|>user<|message|>Colours?<|end|><|start|>assistant<|channel|>analysis<|message|>"

# (generated text, the prompt before it, expected (reasoning, answer))
REPLIES = [
    (
        "<|channel|>analysis<|message|>The user wants colours.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Red, green and blue.",
        PROMPT,
        ("The user wants colours.", "Red, green and blue."),
    ),
    (
        "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.colours <|constrain|>json<|message|>{"n": 3}',
        PROMPT,
        ("Look it up.", ""),
    ),
    (
        "<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis<|message|>Two.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Done",
        PROMPT,
        ("One.\n\nTwo.", "Done"),
    ),
    ("still thinking<|end|><|start|>assistant<|channel|>final<|message|>Red", OPENED, ("still thinking", "Red")),
    ("<|channel|>analysis<|message|>Hm<|end|><|start|>assistant<|chan", PROMPT, ("Hm", "")),
    (
        "Plain text from a model that ignores the format.",
        PROMPT,
        ("", "Plain text from a model that ignores the format."),
    ),
    ("<|channel|>final<|message|>Ends in a partial <|en", PROMPT, ("", "Ends in a partial <|en")),
]


def feed_in_chunks(fmt: ReasoningFormat, prompt: str, chunks: list[str]) -> tuple[str, str]:
    parser = fmt.parser(prompt)
    reasoning = answer = ""
    for chunk in chunks:
        r, a = parser.feed(chunk)
        reasoning, answer = reasoning + r, answer + a
    r, a = parser.finish()
    return (reasoning + r).rstrip(), answer + a


@pytest.mark.parametrize(("text", "prompt", "expected"), REPLIES, ids=[r[0][:32] for r in REPLIES])
def test_every_split_of_the_stream_gives_the_whole_texts_channels(text, prompt, expected):
    assert split_reasoning(text, HARMONY, prompt) == expected
    for cuts in itertools.combinations(range(1, len(text)), 2):
        chunks = [text[: cuts[0]], text[cuts[0] : cuts[1]], text[cuts[1] :]]
        assert feed_in_chunks(HARMONY, prompt, chunks) == expected, cuts


def test_a_tool_call_is_kept_apart_with_its_recipient():
    parser = HARMONY.parser(PROMPT)
    parser.feed("<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant<|channel|>commentary to=functions.")
    assert parser.ended_reasoning and parser.calls == []
    assert parser.feed('colours <|constrain|>json<|message|>{"n": 3}') == ("", "")
    assert parser.calls == [HarmonyCall("functions.colours", "commentary", "json", '{"n": 3}')]


def test_state_follows_the_channels():
    parser = HARMONY.parser(PROMPT)
    assert parser.state == "answer" and not parser.ended_reasoning
    parser.feed("<|channel|>analysis<|mess")
    assert parser.state == "answer"  # the header is not over yet
    parser.feed("age|>hmm")
    assert parser.state == "reasoning"
    parser.feed("<|end|><|start|>assistant<|channel|>final<|message|>ok")
    assert parser.state == "answer" and parser.ended_reasoning
    assert HARMONY.parser(OPENED).state == "reasoning"
    assert HARMONY.starts_inside(OPENED) and not HARMONY.starts_inside(PROMPT)
    assert opens_analysis("<|channel|>analysis<|message|>") and not opens_analysis(OPENED + "x<|end|>")


def test_held_suffix_keeps_what_may_begin_a_marker():
    assert held_suffix("text <|ch", ["<|channel|>", "<|end|>"]) == 4
    assert held_suffix("text <", ["<|channel|>"]) == 1
    assert held_suffix("text <|x", ["<|channel|>", "<|end|>"]) == 0


def test_token_by_token_through_the_streaming_detokenizer(tmp_path):
    tokenizer = harmony_models.build_harmony_tokenizer(tmp_path)
    ids = harmony_models.reply_ids(tokenizer)[:-1]
    detok = StreamingDetokenizer(tokenizer, decode_special_tokens=True)
    chunks = [detok.add(token) for token in ids] + [detok.flush()]
    assert "".join(chunks) == harmony_models.REPLY_TEXT
    assert feed_in_chunks(HARMONY, PROMPT, chunks) == (harmony_models.THINKING, harmony_models.ANSWER)
    # Without the special tokens decoded the channels cannot be told apart: the job must decode them.
    plain = tokenizer.decode(ids)
    assert plain.startswith("analysisThe user")


def test_the_format_is_found_from_the_template_or_the_vocabulary(tmp_path):
    from engine.chat_template import ChatTemplate

    source = harmony_models.HARMONY_TEMPLATE
    assert reasoning_format(source) == HarmonyFormat(effort=True)
    assert reasoning_format("{{ messages }}", ["<|channel|>", "<|message|>"]) == HarmonyFormat(effort=False)
    assert not is_harmony("{{ messages }}", ["<|channel|>"]) and is_harmony("<|channel|>final", [])
    assert reasoning_format("<think></think>{{ reasoning_effort }}") == ReasoningFormat(effort=True)
    assert HARMONY.decodes_special_tokens and not ReasoningFormat().decodes_special_tokens
    tokenizer = harmony_models.build_harmony_tokenizer(tmp_path)
    assert reasoning_format_of(None, tokenizer) == HarmonyFormat()  # the markers are its added tokens
    assert reasoning_format_of(ChatTemplate.from_tokenizer(tokenizer), tokenizer) == HarmonyFormat(effort=True)


def test_the_reasoning_effort_reaches_the_template_and_old_analysis_stays_out(tmp_path):
    from engine.chat.prompt import encode_chat
    from engine.chat_template import ChatTemplate

    tokenizer = harmony_models.build_harmony_tokenizer(tmp_path)
    template = ChatTemplate.from_tokenizer(tokenizer)
    chat = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "A greeting."},
        {"role": "user", "content": "Colours?"},
    ]
    for effort in ("low", "high"):
        prompt = template.render(chat, reasoning_effort=effort)
        assert prompt.startswith(f"<|start|>system<|message|>Reasoning: {effort}\n")
        assert prompt.endswith(
            "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>"
            "<|start|>user<|message|>Colours?<|end|><|start|>assistant"
        )
        assert "A greeting." not in prompt  # an earlier turn's analysis is dropped
    assert "Reasoning: medium" in template.render(chat)  # the template's default
    low, high = (encode_chat(tokenizer, template, chat, reasoning_effort=e) for e in ("low", "high"))
    assert low.shape != high.shape  # what the server and app tests tell the efforts apart by


def _official_template() -> Path:
    cache = Path(os.environ.get("TANDEM_LLAMA_SRC", Path.home() / ".cache" / "tandem-llama-cpp"))
    return (
        cache
        / "llama_cpp_python-0.3.36"
        / "vendor"
        / "llama.cpp"
        / "models"
        / "templates"
        / "openai-gpt-oss-120b.jinja"
    )


def test_the_official_gpt_oss_template_reads_reasoning_effort():
    from engine.chat_template import ChatTemplate

    path = _official_template()
    if not path.is_file():
        pytest.skip(f"llama.cpp's copy of the gpt-oss template is not at {path} (tests/engine/loading fetches it)")
    template = ChatTemplate(path.read_text(encoding="utf-8"))
    assert reasoning_format(template.source) == HarmonyFormat(effort=True)
    chat = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "A greeting."},
        {"role": "user", "content": "Colours?"},
    ]
    for effort in ("low", "high"):
        prompt = template.render(chat, reasoning_effort=effort)
        assert f"Reasoning: {effort}\n" in prompt and prompt.endswith("<|start|>assistant")
        assert "A greeting." not in prompt and not HARMONY.starts_inside(prompt)
    reply = harmony_models.REPLY_TEXT
    assert split_reasoning(reply, HARMONY, prompt) == (harmony_models.THINKING, harmony_models.ANSWER)


def test_a_reply_ends_at_return_through_the_front_door(tmp_path):
    from engine import Cache, SamplerSettings
    from engine.chat.door import ChatFrontDoor
    from engine.chat.request import AnswerOptions, ChatRequest
    from engine.chat_template import ChatTemplate
    from engine.generator.dynamic_async import DynamicGeneratorAsync

    model = harmony_models.build_harmony_llama(tmp_path)
    tokenizer = model.tokenizer
    stops = {tokenizer.piece_to_id("<|return|>"), tokenizer.piece_to_id("<|call|>")}
    assert not stops & tokenizer.eos_token_ids  # only the harmony format makes them end a reply
    door = ChatFrontDoor(model, tokenizer, ChatTemplate.from_tokenizer(tokenizer), context_length=256)
    assert stops <= set(door.stop_token_ids) and door.reasoning == HarmonyFormat(effort=True)
    request = ChatRequest([{"role": "user", "content": "Colours?"}], template_options={"reasoning_effort": "low"})
    ids = door.prompt_ids(request)

    def answer(split: bool) -> list[dict]:
        options = AnswerOptions(settings=SamplerSettings.greedy(), split_reasoning=split)

        async def go():
            generator = DynamicGeneratorAsync(model, Cache(model, max_seq_len=256, page_size=16), tokenizer)
            try:
                return [r async for r in door.start_job(generator, ids, options, max_new_tokens=64)]
            finally:
                await generator.close()

        return asyncio.run(go())

    results = answer(split=True)
    final = results[-1]
    assert final["eos_reason"] == "stop_token" and final["eos_triggering_token_str"] == "<|return|>"
    assert final["full_completion"] == harmony_models.REPLY_TEXT  # the markers kept, as the model wrote them
    assert (final["full_reasoning"], final["full_answer"]) == (harmony_models.THINKING, harmony_models.ANSWER)
    streamed = [r for r in results if r["stage"] == "streaming"]
    assert "".join(r["reasoning"] for r in streamed) == harmony_models.THINKING
    assert "".join(r["answer"] for r in streamed) == harmony_models.ANSWER
    raw = answer(split=False)[-1]  # a raw completion decodes no special tokens and splits nothing
    assert "full_reasoning" not in raw and raw["full_completion"].startswith("analysisThe user")
    assert raw["eos_reason"] == "stop_token"


def test_a_harmony_gguf_ends_replies_at_return_and_call():
    from engine.config.gguf import _eos_ids

    tokens = ["<|endoftext|>", "a", "<|return|>", "<|channel|>", "<|call|>", "<|end|>"]
    assert _eos_ids({"tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.tokens": tokens}) == [2, 4]
    assert _eos_ids({"tokenizer.ggml.eos_token_id": 0, "tokenizer.ggml.tokens": tokens[:3]}) == [0]
