"""EngineService's JSON mode and speculation setting on the real engine (tiny model) and a real qasync loop.

Bad inputs tried: speculation mode "fast", draft_layers 0 / True / "8", a stored setting that is a string, a
list, or holds an unknown mode; set_speculation with a plain string; a draft deeper than the model (kept to
all layers but one); a one-layer model (no draft: plain decoding); a JSON-mode answer cut by max_new_tokens.
"""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
import torch
import transformers

from app.service import EngineService, sampler_settings
from app.service.speculation import Speculation, generator_arguments
from engine import Cache, DynamicGenerator, DynamicJob, Model, SamplerSettings

CHAT = [{"role": "user", "content": "The quick brown fox"}]
GREEDY = {"temperature": 1.0, "top_k": 1, "top_p": 0.0, "token_repetition_penalty": 1.0}
TIMEOUT = 60


def run(loop, coro):
    return loop.run_until_complete(asyncio.wait_for(coro, TIMEOUT))


@pytest.fixture
def make_service(loop, tiny_folder):
    made = []

    def make(**kw) -> EngineService:
        svc = EngineService(dtype=torch.float32, **kw)
        made.append(svc)
        svc.load_model(tiny_folder, "tiny")
        assert run(loop, svc.wait_loaded())
        return svc

    yield make
    for svc in made:
        run(loop, svc.close())


def answer(loop, svc, settings, max_new_tokens, seed=3, **kw) -> list[dict]:
    async def go():
        job = svc.start_job(svc.encode_chat(CHAT), settings, max_new_tokens=max_new_tokens, seed=seed, **kw)
        return [r async for r in job]

    return run(loop, go())


def quote_bias(svc) -> dict:
    """Sampled settings that favour the '"' token, so the random tiny model closes its JSON strings."""
    (quote,) = svc.tokenizer.encode_ids('"')
    return {"token_bias": {str(quote): 5.0}}


# --- JSON mode ---------------------------------------------------------------------------------------------


def test_json_mode_answers_parse_as_json_objects(loop, make_service):
    svc = make_service()
    settings = quote_bias(svc)
    completions = set()
    for seed in range(4):
        results = answer(loop, svc, settings, 200, seed=seed, json_mode=True)
        last = results[-1]
        completions.add(last["full_completion"])
        assert last["eos_reason"] == "end_filter", last["full_completion"]
        assert isinstance(json.loads(last["full_completion"]), dict)
        assert "".join(r.get("text", "") for r in results) == last["full_completion"]
    assert len(completions) > 1  # the seeds gave different objects
    free = answer(loop, svc, settings, 40)[-1]["full_completion"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(free)  # without JSON mode the random model writes no JSON: the filter made the difference


def test_json_mode_answer_cut_short_says_so(loop, make_service):
    svc = make_service()
    last = answer(loop, svc, GREEDY, 6, json_mode=True)[-1]
    assert last["eos_reason"] == "max_new_tokens" and last["full_completion"].startswith("{")


def test_json_mode_key_in_a_settings_dict_is_not_a_sampler_setting():
    assert sampler_settings({"json_mode": True, "temperature": 0.5}) == SamplerSettings(temperature=0.5)


# --- speculation -------------------------------------------------------------------------------------------


def plain_greedy(svc, max_new_tokens: int) -> list[int]:
    model = svc.model
    gen = DynamicGenerator(model, Cache(model, 1024, page_size=256), svc.tokenizer)
    eos = sorted(svc.tokenizer.eos_token_ids)
    gen.enqueue(
        DynamicJob(svc.encode_chat(CHAT), max_new_tokens, gen_settings=SamplerSettings.greedy(), stop_conditions=eos)
    )
    ids = []
    while gen.num_remaining_jobs():
        ids += [t for r in gen.iterate() if "token_ids" in r for t in r["token_ids"][0].tolist()]
    return ids


def token_ids(results) -> list[int]:
    return [t for r in results if "token_ids" in r for t in r["token_ids"][0].tolist()]


def test_speculation_given_at_construction_applies_to_the_loaded_model(loop, make_service):
    svc = make_service(speculation=Speculation("ngram"))
    assert svc.speculation == Speculation("ngram") and svc.speculation_status() == "n-gram speculation"
    results = answer(loop, svc, GREEDY, 40)
    assert token_ids(results) == plain_greedy(svc, 40)
    assert "accepted_draft_tokens" in results[-1] and "rejected_draft_tokens" in results[-1]


def test_changing_speculation_rebuilds_the_generator_over_the_same_model(loop, make_service):
    svc = make_service()
    model, reference = svc.model, plain_greedy(svc, 40)
    assert "accepted_draft_tokens" not in answer(loop, svc, GREEDY, 40)[-1]

    assert run(loop, svc.set_speculation(Speculation("draft", 5)))  # deeper than the model: 1 of its 2 layers
    assert svc.model is model and svc.speculation_status() == "self-speculation draft: first 1 of 2 layers"
    last = answer(loop, svc, GREEDY, 40)
    assert token_ids(last) == reference
    assert last[-1]["accepted_draft_tokens"] + last[-1]["rejected_draft_tokens"] > 0

    assert run(loop, svc.set_speculation(Speculation()))
    results = answer(loop, svc, GREEDY, 40)
    assert token_ids(results) == reference and "accepted_draft_tokens" not in results[-1]


def test_changing_speculation_stops_running_answers_and_serves_new_ones(loop, make_service):
    svc = make_service()

    async def go():
        job = svc.start_job(svc.encode_chat(CHAT), GREEDY, max_new_tokens=900, seed=0)
        results = []
        async for r in job:
            results.append(r)
            if len(results) == 3:
                await svc.set_speculation(Speculation("ngram"))
        return job, results

    job, results = run(loop, go())
    assert job.cancelled and not results[-1]["eos"]  # stopped, as on a model switch
    assert "accepted_draft_tokens" in answer(loop, svc, GREEDY, 8)[-1]


def test_setting_speculation_without_a_model_applies_at_load(loop, tiny_folder):
    svc = EngineService(dtype=torch.float32)
    try:
        assert run(loop, svc.set_speculation(Speculation("ngram"))) is False  # nothing to rebuild yet
        svc.load_model(tiny_folder)
        assert run(loop, svc.wait_loaded())
        assert "accepted_draft_tokens" in answer(loop, svc, GREEDY, 8)[-1]
    finally:
        run(loop, svc.close())


@pytest.mark.parametrize(
    ("mode", "layers", "message"),
    [("fast", 8, "mode must be one of off, ngram, draft"), ("draft", 0, "draft_layers"),
     ("draft", True, "draft_layers"), ("draft", "8", "draft_layers")],
)  # fmt: skip
def test_bad_speculation_values_are_refused(mode, layers, message):
    with pytest.raises(ValueError, match=message):
        Speculation(mode, layers)


@pytest.mark.parametrize(
    "stored", [None, "ngram", ["draft", 8], {"mode": "warp"}, {"mode": "draft", "draft_layers": -2}]
)
def test_unreadable_stored_settings_mean_off(stored):
    assert Speculation.from_setting(stored) == Speculation()


def test_stored_setting_round_trips():
    spec = Speculation("draft", 12)
    assert Speculation.from_setting(json.loads(json.dumps(spec.to_setting()))) == spec


def test_generator_arguments_build_a_draft_with_the_cache_layout(tiny_model, tiny_folder, tmp_path):
    cache = Cache(tiny_model, max_seq_len=64, page_size=16)
    assert generator_arguments(Speculation(), tiny_model, cache) == {}
    assert generator_arguments(Speculation("ngram"), tiny_model, cache)["use_ngram_draft"] is True
    kw = generator_arguments(Speculation("draft", 8), tiny_model, cache)
    draft, draft_cache = kw["draft_model"], kw["draft_cache"]
    assert draft.config.num_hidden_layers == 1 and len(draft_cache.k) == 1  # all layers but one
    assert (draft_cache.page_size, draft_cache.num_pages) == (cache.page_size, cache.num_pages)
    DynamicGenerator(tiny_model, cache, tiny_model.tokenizer, **kw)  # the generator accepts them

    # A one-layer model has nothing to cut a draft from: it decodes plainly, and says so.
    shutil.copytree(tiny_folder, tmp_path, dirs_exist_ok=True)
    config = transformers.LlamaConfig.from_pretrained(tiny_folder)
    config.num_hidden_layers = 1
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    shallow = Model.load(tmp_path, dtype=torch.float32)
    assert generator_arguments(Speculation("draft"), shallow, Cache(shallow, 64, 16)) == {}
    assert Speculation("draft").describe(shallow) == "speculation off (the model is too shallow for a draft)"


def test_set_speculation_takes_a_speculation(loop):
    svc = EngineService(dtype=torch.float32)
    try:
        with pytest.raises(TypeError, match="takes a Speculation, not str"):
            svc.set_speculation("ngram")
    finally:
        run(loop, svc.close())
