"""engine/reasoning.py: reasoning blocks told apart from the answer, however the stream splits their tags.

Tried: every way of cutting five answers into three chunks (a block then an answer, an answer with a "<think>"
in its text, whitespace before a block, a stream that starts inside the block because the prompt opened
it, a partial tag at the very end), one chunk per token through the engine's streaming detokenizer on a
tokenizer whose tags are tokens of their own, prompts from a Qwen3-style template with thinking on and off
and from a DeepSeek-R1-style one that opens the block itself, and the tag pairs found from a template's
source or a vocabulary.
"""

from __future__ import annotations

import itertools

import pytest

from engine.reasoning import ReasoningFormat, reasoning_format, reasoning_format_of, split_reasoning
from engine.tokenizer.detokenizer import StreamingDetokenizer

THINK = ReasoningFormat("<think>", "</think>")

# (generated text, the prompt before it, expected (reasoning, answer))
ANSWERS = [
    (
        "<think>\nThe user wants colours.\n</think>\n\nRed, green and blue.",
        "",
        ("The user wants colours.", "Red, green and blue."),
    ),
    ("The answer <think> is text", "", ("", "The answer <think> is text")),
    ("  \n<think>a</think>b", "", ("a", "b")),
    (
        "Still thinking</think>\n\nDone <think>x</think>",
        "<|im_start|>assistant\n<think>\n",
        ("Still thinking", "Done <think>x</think>"),
    ),
    ("Ends in a partial <thi", "", ("", "Ends in a partial <thi")),
    ("<think>cut off by max_new_tokens</th", "", ("cut off by max_new_tokens</th", "")),
]


@pytest.mark.parametrize(("text", "prompt", "expected"), ANSWERS, ids=[a[0][:24] for a in ANSWERS])
def test_every_split_of_the_stream_gives_the_whole_texts_parts(text, prompt, expected):
    assert split_reasoning(text, THINK, prompt) == expected
    for cuts in itertools.combinations(range(1, len(text)), 2):
        parser = THINK.parser(prompt)
        reasoning = answer = ""
        for chunk in (text[: cuts[0]], text[cuts[0] : cuts[1]], text[cuts[1] :]):
            r, a = parser.feed(chunk)
            reasoning, answer = reasoning + r, answer + a
        r, a = parser.finish()
        assert (reasoning + r).rstrip() == expected[0] and answer + a == expected[1], cuts


def test_state_follows_the_block():
    parser = THINK.parser()
    assert parser.state == "answer"
    parser.feed("<thi")
    assert parser.state == "answer" and not parser.ended_reasoning  # not yet known
    parser.feed("nk>hmm")
    assert parser.state == "reasoning"
    parser.feed("</think>ok")
    assert parser.state == "answer" and parser.ended_reasoning


def test_token_by_token_through_the_streaming_detokenizer(tmp_path, reasoning_models):
    tokenizer = reasoning_models.tag_tokenizer(tmp_path)
    text = "<think>\nThe user wants three colours 🦊.\n</think>\n\nRed, green and blue."
    ids = tokenizer.encode(text, encode_special_tokens=True).flatten().tolist()
    assert tokenizer.decode(ids) == text
    fmt = reasoning_format_of(None, tokenizer)
    assert fmt == THINK
    detok, parser = StreamingDetokenizer(tokenizer), fmt.parser()
    reasoning = answer = ""
    for token in ids:
        r, a = parser.feed(detok.add(token))
        reasoning, answer = reasoning + r, answer + a
    r, a = parser.feed(detok.flush())
    r2, a2 = parser.finish()
    assert ((reasoning + r + r2).rstrip(), answer + a + a2) == (
        "The user wants three colours 🦊.",
        "Red, green and blue.",
    )


def test_templates_declare_the_tags_and_where_generation_starts(reasoning_models):
    from engine.chat_template import ChatTemplate

    qwen3, r1 = ChatTemplate(reasoning_models.QWEN3_STYLE), ChatTemplate(reasoning_models.R1_STYLE)
    fmt = reasoning_format(qwen3.source)
    assert fmt == ReasoningFormat("<think>", "</think>", toggle=True)
    assert reasoning_format(r1.source) is None  # names only the opening tag; its vocabulary would say more
    assert reasoning_format(r1.source, ["<think>", "</think>"]) == THINK
    assert reasoning_format("{{ messages }}", ["hello"]) is None
    assert reasoning_format("{% if x %}<thinking></thinking>{% endif %}").start == "<thinking>"

    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>plan</think>\n\nHello!"}]
    thinking_on = qwen3.render([*history, {"role": "user", "content": "Colours?"}])
    thinking_off = qwen3.render([*history, {"role": "user", "content": "Colours?"}], enable_thinking=False)
    assert "plan" not in thinking_on  # the template leaves earlier thinking out of the next prompt
    assert not fmt.starts_inside(thinking_on) and not fmt.starts_inside(thinking_off)
    assert split_reasoning("Red.", fmt, thinking_off) == ("", "Red.")
    opened = r1.render([{"role": "user", "content": "Colours?"}])
    assert THINK.starts_inside(opened)
    assert split_reasoning("list them</think>Red.", THINK, opened) == ("list them", "Red.")


@pytest.mark.parametrize(
    ("template", "options", "pattern", "thinks"),
    [
        ("QWEN3_STYLE", {}, r"<think>[a-z ]{3,12}</think>\n\n[a-z ]{3,12}", True),
        ("QWEN3_STYLE", {"enable_thinking": False}, r"[a-z ]{3,12}", False),
        ("R1_STYLE", {}, r"[a-z ]{3,12}</think>[a-z ]{3,12}", True),
    ],
    ids=["qwen3 thinking", "qwen3 thinking off", "r1 opens the block"],
)
def test_jobs_stream_reasoning_apart_from_the_answer(tmp_path, reasoning_models, template, options, pattern, thinks):
    from engine import Cache, DynamicGenerator, DynamicJob, SamplerSettings
    from engine.chat.prompt import encode_chat
    from engine.chat_template import ChatTemplate
    from engine.generator.filters import RegexFilter

    model = reasoning_models.tiny_qwen3(tmp_path, getattr(reasoning_models, template))
    tokenizer = model.tokenizer
    fmt = reasoning_format_of(ChatTemplate.from_tokenizer(tokenizer), tokenizer)
    assert fmt is not None and fmt.toggle == (template == "QWEN3_STYLE")
    ids = encode_chat(
        tokenizer, ChatTemplate.from_tokenizer(tokenizer), [{"role": "user", "content": "Colours?"}], **options
    )
    prompt = tokenizer.decode(ids, decode_special_tokens=True)
    assert prompt.endswith("<think>\n\n</think>\n\n") == (options == {"enable_thinking": False})
    generator = DynamicGenerator(model, Cache(model, max_seq_len=256, page_size=16), tokenizer)
    job = DynamicJob(ids, 40, gen_settings=SamplerSettings.greedy(), filters=[RegexFilter(pattern)], reasoning=fmt)
    generator.enqueue(job)
    streamed = {"text": "", "reasoning": "", "answer": ""}
    while generator.num_remaining_jobs():
        for result in generator.iterate():
            if result["stage"] == "streaming":
                for key in streamed:
                    streamed[key] += result[key]
                if result["eos"]:
                    eos = result
    assert eos["eos_reason"] == "end_filter" and eos["full_completion"] == streamed["text"]
    assert (eos["full_reasoning"], eos["full_answer"]) == split_reasoning(streamed["text"], fmt, prompt)
    assert (streamed["reasoning"].strip(), streamed["answer"]) == (eos["full_reasoning"], eos["full_answer"])
    assert bool(eos["full_reasoning"]) == thinks and eos["full_answer"].strip()
    assert "<think>" not in eos["full_answer"] + eos["full_reasoning"] and "</think>" not in eos["full_answer"]


def test_a_job_refuses_a_reasoning_that_is_not_a_format():
    from engine import DynamicJob

    with pytest.raises(ValueError, match="ReasoningFormat"):
        DynamicJob([1, 2], 4, reasoning="<think>")
