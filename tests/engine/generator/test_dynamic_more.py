"""More generator behaviour: token healing, special tokens, partial page copies, interleaving, skips, aborts."""

from __future__ import annotations

import threading

import torch

from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings

from .test_dynamic import Run, greedy_job, make_gen, random_prompts


def test_token_healing_regenerates_the_last_prompt_token(tiny_model):
    tok = tiny_model.tokenizer
    ids = tok.encode("The quick brown fo")[0].tolist()
    healed_text = tok.token_texts()[ids[-1]]
    run = Run(make_gen(tiny_model), [greedy_job(ids, 6, 0, token_healing=True)])
    generated = run.ids(0)
    assert tok.token_texts()[generated[0]].startswith(healed_text)
    # The completion continues the prompt: the healed token's text is not repeated.
    assert run.text(0) == tok.decode(generated)[len(healed_text) :]
    assert run.eos(0)["prompt_tokens"] == len(ids)


def test_decode_special_tokens_controls_text(tiny_model):
    tok = tiny_model.tokenizer
    special = tok.piece_to_id("<|im_end|>")
    prompt = random_prompts(tiny_model, 1, 8, 8, seed=11)[0]
    # A bias makes the special token certain at every step.
    bias = torch.zeros(tiny_model.config.vocab_size)
    bias[special] = 100.0
    settings = SamplerSettings.greedy(token_bias=bias)
    shown = Run(
        make_gen(tiny_model),
        [DynamicJob(torch.tensor([prompt]), 3, gen_settings=settings, decode_special_tokens=True, identifier=0)],
    )
    hidden = Run(make_gen(tiny_model), [DynamicJob(torch.tensor([prompt]), 3, gen_settings=settings, identifier=0)])
    assert shown.text(0) == "<|im_end|>" * 3
    assert hidden.text(0) == "" and hidden.ids(0) == [special] * 3


def test_partially_matching_page_is_copied(tiny_model):
    a = random_prompts(tiny_model, 1, 20, 20, seed=12)[0]
    b = a[:18] + [7, 8]
    gen = make_gen(tiny_model)  # pages of 16 tokens
    Run(gen, [greedy_job(a, 4, "a")])
    run = Run(gen, [greedy_job(b, 6, "b")])
    eos = run.eos("b")
    assert eos["cached_tokens"] == 18 and eos["cached_pages"] == 2  # one shared page, one copied in part
    assert run.ids("b") == Run(make_gen(tiny_model), [greedy_job(b, 6, "b")]).ids("b")


def test_long_prefill_does_not_freeze_a_streaming_job(tiny_model):
    gen = make_gen(tiny_model, pages=80, max_chunk_size=32)
    streaming = greedy_job([5] * 8, 40, "s")
    gen.enqueue(streaming)
    for _ in range(3):
        gen.iterate()
    gen.enqueue(greedy_job(random_prompts(tiny_model, 1, 600, 600, seed=13)[0], 4, "long"))
    steps_with_token = 0
    for _ in range(10):  # the long prompt needs 19 chunks; the streaming job gets a token every step
        results = gen.iterate()
        steps_with_token += any(r["identifier"] == "s" and r["stage"] == "streaming" for r in results)
        assert any(r["identifier"] == "long" and r["stage"] == "prefill" for r in results)
    assert steps_with_token == 10
    assert len(gen.scheduler.active[0].tokens) - 8 >= 13  # 3 + 10 decode steps for the streaming job


def test_max_skips_stops_later_jobs_overtaking_forever(tiny_model):
    gen = make_gen(tiny_model, pages=6, page_size=16)
    hog = greedy_job([5] * 40, 40, "hog")  # 5 of the 6 pages while it runs
    big = greedy_job([6] * 40, 40, "big", max_skips=2)  # needs 5 pages: must wait for hog
    smalls = [greedy_job([7 + i] * 4, 4, f"s{i}") for i in range(5)]  # 1 page each
    gen.enqueue([hog, big] + smalls)
    admitted = []
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "started":
                admitted.append(r["identifier"])
    # Only two small jobs may pass the waiting big job; the rest queue behind it.
    assert admitted.index("big") == 3, admitted
    assert admitted[:3] == ["hog", "s0", "s1"]


def test_abort_event_stops_generate(tiny_model):
    gen = make_gen(tiny_model)
    abort = threading.Event()
    abort.set()
    out = gen.generate(
        "The quick", max_new_tokens=50, gen_settings=SamplerSettings.greedy(), abort_event=abort, completion_only=True
    )
    assert out == "" and gen.num_remaining_jobs() == 0


def test_unpaged_generator_runs_one_job_at_a_time(tiny_model):
    gen = make_gen(tiny_model, paged=False)
    assert gen.max_batch_size == 1
    run = Run(gen, [greedy_job([5] * 10, 5, 0), greedy_job([6] * 10, 5, 1)])
    assert run.eos(0)["new_tokens"] == run.eos(1)["new_tokens"] == 5
    assert run.ids(1) == Run(make_gen(tiny_model), [greedy_job([6] * 10, 5, 1)]).ids(1)


def test_max_batch_size_defaults_from_the_cache(tiny_model):
    assert make_gen(tiny_model, pages=8).max_batch_size == 8
    assert make_gen(tiny_model, pages=8, max_batch_size=3).max_batch_size == 3


def test_incomplete_character_at_max_new_tokens_is_in_both_stream_and_completion(tiny_model):
    tok = tiny_model.tokenizer
    # Force the first byte of a 4-byte emoji as the last token: it can never complete.
    fox = tok.encode("🦊")[0].tolist()
    first_byte = fox[0]
    bias = torch.zeros(tiny_model.config.vocab_size)
    bias[first_byte] = 100.0
    job = DynamicJob(torch.tensor([[5, 6, 7]]), 2, gen_settings=SamplerSettings.greedy(token_bias=bias), identifier=0)
    run = Run(make_gen(tiny_model), [job])
    assert run.ids(0) == [first_byte, first_byte]
    assert run.text(0) == run.eos(0)["full_completion"] == tok.decode([first_byte, first_byte])
