"""The seed documents' exllamav2 usage examples, run on the starter model through engine.compat.exllamav2.

Each example is the seed's code with its imports changed, "/path/to/model" replaced by the starter GGUF
and max_new_tokens lowered (the CPU runs these). `seed=...` (an exllamav2 DynamicJob argument too) is added
where the texts checked must be fixed. Lines marked "# test" record what the test checks.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from engine.cache.cache import Cache
from engine.compat.exllamav2 import (
    ExLlamaV2,
    ExLlamaV2Cache,
    ExLlamaV2Cache_Q4,
    ExLlamaV2Cache_Q6,
    ExLlamaV2Cache_Q8,
    ExLlamaV2Config,
    ExLlamaV2DynamicGenerator,
    ExLlamaV2DynamicGeneratorAsync,
    ExLlamaV2DynamicJob,
    ExLlamaV2DynamicJobAsync,
    ExLlamaV2Sampler,
    ExLlamaV2Tokenizer,
)
from engine.errors import MissingFileError, ModelLoadError
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings

EOS_KEYS = {"full_completion", "new_tokens", "time_enqueued", "time_prefill", "time_generate", "identifier"}


@pytest.fixture(scope="module")
def exl(starter_gguf):
    """The seed's "Basic Initialization" example."""
    config = ExLlamaV2Config(str(starter_gguf))
    config.prepare()

    model = ExLlamaV2(config)
    cache = ExLlamaV2Cache(model, lazy=True)
    model.load_autosplit(cache)

    tokenizer = ExLlamaV2Tokenizer(config)

    generator = ExLlamaV2DynamicGenerator(
        model=model,
        cache=cache,
        tokenizer=tokenizer,
    )
    return SimpleNamespace(config=config, model=model, cache=cache, tokenizer=tokenizer, generator=generator)


def drain(generator) -> list[dict]:
    results = []
    while generator.num_remaining_jobs() > 0:
        results += generator.iterate()
    return results


def tokens_of(results: list[dict], identifier: object) -> torch.Tensor:
    """Every token id released to `identifier`, as [1, n]."""
    parts = [r["token_ids"] for r in results if r.get("identifier") == identifier and "token_ids" in r]
    return torch.cat(parts, dim=-1)


def check_eos(exl, results: list[dict], identifier: object, max_new_tokens: int) -> dict:
    """The job ended once, with the documented keys, and its text is the decode of its tokens."""
    (eos,) = [r for r in results if r["eos"] and r.get("identifier") == identifier]
    assert EOS_KEYS <= eos.keys()
    assert 1 <= eos["new_tokens"] <= max_new_tokens
    assert min(eos["time_enqueued"], eos["time_prefill"], eos["time_generate"]) >= 0
    streamed = "".join(r.get("text", "") for r in results if r.get("identifier") == identifier)
    assert streamed == eos["full_completion"] == exl.tokenizer.decode(tokens_of(results, identifier))[0]
    if eos["eos_reason"] == "stop_token":
        assert eos["eos_triggering_token_id"] == exl.tokenizer.eos_token_id
    else:
        assert eos["eos_reason"] == "max_new_tokens" and eos["new_tokens"] == max_new_tokens
    return eos


def test_generator_init_basic(exl, starter_gguf):
    assert exl.config.model_dir == str(starter_gguf)
    assert exl.config.architecture == exl.config.arch.arch_string == "LlamaForCausalLM"
    assert (exl.config.max_seq_len, exl.config.num_hidden_layers, exl.config.vocab_size) == (8192, 30, 49152)
    assert exl.model.loaded and exl.model.vision_model is None
    # The engine generator got the engine objects inside the handles, and the cache belongs to the model.
    assert exl.generator.model is exl.model.engine_model
    assert exl.generator.cache is exl.cache.engine_cache
    assert exl.cache.engine_cache.model is exl.generator.model
    assert exl.generator.tokenizer is exl.tokenizer.engine_tokenizer
    assert exl.cache.max_seq_len == exl.generator.max_seq_len == 8192
    assert exl.generator.num_pages == 8192 // 256 == exl.cache.engine_cache.num_pages
    assert exl.cache.engine_cache.k[0].shape == (32, 256, 3, 64)


def test_basic_job(exl):
    generator, tokenizer = exl.generator, exl.tokenizer

    gen_settings = ExLlamaV2Sampler.Settings(temperature=0.7, top_k=50, top_p=0.9)

    input_ids = tokenizer.encode("What is the capital of France?")

    job = ExLlamaV2DynamicJob(
        input_ids=input_ids,
        max_new_tokens=16,
        gen_settings=gen_settings,
        stop_conditions=[tokenizer.eos_token_id],
        identifier="question_1",
    )

    serial = generator.enqueue(job)

    assert isinstance(gen_settings, SamplerSettings) and isinstance(job, DynamicJob)
    assert input_ids.shape == (1, 7) and input_ids.dtype == torch.long
    assert isinstance(serial, int) and serial == job.serial
    results = drain(generator)
    assert results[0]["stage"] == "started" and results[0]["serial"] == serial
    assert all(r["job"] is job and r["identifier"] == "question_1" for r in results)
    check_eos(exl, results, "question_1", 16)


def enqueue_bulk(generator, tokenizer, max_new_tokens: int) -> list[str]:
    """The seed's "Bulk Enqueue" example (gen_settings as in the basic job example)."""
    gen_settings = ExLlamaV2Sampler.Settings(temperature=0.7, top_k=50, top_p=0.9)

    prompts = ["Explain gravity.", "What is DNA?", "Describe photosynthesis."]
    for i, prompt in enumerate(prompts):
        input_ids = tokenizer.encode(prompt)
        job = ExLlamaV2DynamicJob(
            input_ids=input_ids,
            max_new_tokens=max_new_tokens,
            gen_settings=gen_settings,
            stop_conditions=[tokenizer.eos_token_id],
            identifier=f"batch_{i}",
            seed=i,
        )
        generator.enqueue(job)
    return [f"batch_{i}" for i in range(len(prompts))]


def test_bulk_enqueue_then_basic_iterate_loop(exl, capsys):
    generator = exl.generator
    identifiers = enqueue_bulk(generator, exl.tokenizer, max_new_tokens=8)
    assert generator.num_remaining_jobs() == 3
    seen = []  # test

    completions = {}

    while generator.num_remaining_jobs() > 0:
        results = generator.iterate()
        seen += results  # test
        for result in results:
            if result["eos"]:
                identifier = result["identifier"]
                completions[identifier] = result["full_completion"]
                print(f"Job {identifier} completed: {result['full_completion'][:100]}...")

    assert sorted(completions) == identifiers
    out = capsys.readouterr().out
    for identifier in identifiers:
        check_eos(exl, seen, identifier, 8)
        assert completions[identifier].strip()  # these seeded prompts continue with text
        assert f"Job {identifier} completed: {completions[identifier][:100]}..." in out


def test_streaming_output(exl, capsys):
    generator, tokenizer = exl.generator, exl.tokenizer
    job = ExLlamaV2DynamicJob(
        tokenizer.encode("Once upon a time"), max_new_tokens=12, identifier="story", seed=0
    )  # test: one job, so its chunks print contiguously
    generator.enqueue(job)
    seen = []  # test

    while generator.num_remaining_jobs() > 0:
        results = generator.iterate()
        seen += results  # test
        for result in results:
            if result["stage"] == "streaming":
                # Print incremental text as it is generated
                print(result["text"], end="", flush=True)
            elif result["eos"]:
                print(f"\n--- Job {result['identifier']} done ---")
                print(f"  Tokens: {result['new_tokens']}")
                print(f"  Prefill: {result['time_prefill']:.2f}s")
                print(f"  Generate: {result['time_generate']:.2f}s")

    out = capsys.readouterr().out
    eos = check_eos(exl, seen, "story", 12)
    assert eos["full_completion"].strip() and out.startswith(eos["full_completion"])
    if eos["stage"] == "streaming":
        # exllamav2 and the engine mark the last chunk stage "streaming" with eos True, so the example's
        # `elif result["eos"]` branch never runs (the seed's prose lists an "eos" stage that neither emits).
        assert out == eos["full_completion"]
    else:
        assert f"--- Job story done ---\n  Tokens: {eos['new_tokens']}\n" in out


def test_bulk_processing_with_timing(exl, capsys):
    generator = exl.generator
    identifiers = enqueue_bulk(generator, exl.tokenizer, max_new_tokens=6)

    results_list = []

    while generator.num_remaining_jobs() > 0:
        results = generator.iterate()
        for result in results:
            if result["eos"]:
                results_list.append(
                    {
                        "id": result["identifier"],
                        "text": result["full_completion"],
                        "tokens": result["new_tokens"],
                        "time_enqueued": result["time_enqueued"],
                        "time_prefill": result["time_prefill"],
                        "time_generate": result["time_generate"],
                    }
                )

    # Compute aggregate statistics
    total_tokens = sum(r["tokens"] for r in results_list)
    total_time = sum(r["time_generate"] for r in results_list)
    print(f"Processed {len(results_list)} jobs, {total_tokens} tokens")

    assert sorted(r["id"] for r in results_list) == identifiers
    assert all(1 <= r["tokens"] <= 6 and r["text"].strip() for r in results_list)
    assert total_tokens >= 3 and total_time > 0
    assert all(r["time_enqueued"] >= 0 and r["time_prefill"] > 0 for r in results_list)
    assert capsys.readouterr().out == f"Processed 3 jobs, {total_tokens} tokens\n"


def test_speculative_decoding_with_draft_model(exl, starter_gguf):
    # test: float32 models. Greedy speculation equals plain decoding in float32; in bfloat16 the verify pass
    # (several rows per matmul) rounds differently from one-row decode steps, and a near-tie may flip.
    config = ExLlamaV2Config(str(starter_gguf))
    config.prepare()
    config.dtype = torch.float32
    model, tokenizer = ExLlamaV2(config), exl.tokenizer
    model.load_autosplit(ExLlamaV2Cache(model, max_seq_len=256, lazy=True))
    # test: caches of their own, since two generators must not share one cache's pages
    cache = ExLlamaV2Cache(model, max_seq_len=1024, lazy=True)
    plain = ExLlamaV2DynamicGenerator(
        model=model, cache=ExLlamaV2Cache(model, max_seq_len=1024, lazy=True), tokenizer=tokenizer
    )
    calls = []  # test

    # Load draft model
    draft_config = ExLlamaV2Config(str(starter_gguf))
    draft_config.prepare()
    draft_config.dtype = torch.float32  # test
    draft_model = ExLlamaV2(draft_config)
    draft_cache = ExLlamaV2Cache(draft_model, max_seq_len=1024, lazy=True)  # test: max_seq_len as the cache's
    draft_model.load_autosplit(draft_cache, callback=lambda done, total: calls.append((done, total)))  # test

    generator = ExLlamaV2DynamicGenerator(
        model=model,
        cache=cache,
        tokenizer=tokenizer,
        draft_model=draft_model,
        draft_cache=draft_cache,
        num_draft_tokens=5,
    )
    # exllamav2's load callback(done, total) ran to the end; the draft cache belongs to the draft model.
    assert calls[-1] == (100, 100) and calls == sorted(calls)
    assert draft_cache.engine_cache.model is draft_model.engine_model is not model.engine_model
    # test: the same weights as draft accept every greedy draft and give the plain generator's text.
    greedy = ExLlamaV2Sampler.Settings.greedy()
    text, last = generator.generate(
        "Once upon a time", max_new_tokens=12, gen_settings=greedy, return_last_results=True
    )
    assert text == plain.generate("Once upon a time", max_new_tokens=12, gen_settings=greedy)
    assert last["accepted_draft_tokens"] > 0 and last["rejected_draft_tokens"] == 0
    # A cache handed to a generator with another model is refused.
    with pytest.raises(ValueError, match="different model"):
        ExLlamaV2DynamicGenerator(model=model, cache=draft_cache, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="different model"):
        model.load_autosplit(draft_cache)


def test_ngram_speculation(exl):
    model, tokenizer = exl.model, exl.tokenizer
    # test: caches of their own, since two generators must not share one cache's pages
    cache = ExLlamaV2Cache(model, max_seq_len=1024, lazy=True)
    plain = ExLlamaV2DynamicGenerator(
        model=model, cache=ExLlamaV2Cache(model, max_seq_len=1024, lazy=True), tokenizer=tokenizer
    )
    generator = ExLlamaV2DynamicGenerator(
        model=model,
        cache=cache,
        tokenizer=tokenizer,
        use_ngram_draft=True,
        max_ngram=4,
    )
    # test: a repetitive prompt; greedy text equals the plain generator's.
    prompt = "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3,"
    greedy = ExLlamaV2Sampler.Settings.greedy()
    text, last = generator.generate(prompt, max_new_tokens=16, gen_settings=greedy, return_last_results=True)
    assert text == plain.generate(prompt, max_new_tokens=16, gen_settings=greedy)
    assert last["accepted_draft_tokens"] > 0


def test_async_usage_generate_cancel_close(exl, capsys):
    model, tokenizer = exl.model, exl.tokenizer
    gen_settings = ExLlamaV2Sampler.Settings(temperature=0.7, top_k=50, top_p=0.9)
    # test: a cache of its own, since two generators must not share one cache's pages
    cache = ExLlamaV2Cache(model, max_seq_len=1000, lazy=True)
    seen = []  # test

    # Initialize the async generator (wraps ExLlamaV2DynamicGenerator)
    async_gen = ExLlamaV2DynamicGeneratorAsync(
        model=model,
        cache=cache,
        tokenizer=tokenizer,
    )

    # Create and iterate over an async generation job
    async def generate(prompt: str):
        input_ids = tokenizer.encode(prompt)
        job = ExLlamaV2DynamicJobAsync(
            async_gen,
            input_ids=input_ids,
            max_new_tokens=12,
            gen_settings=gen_settings,
            seed=0,
        )
        text = ""
        async for result in job:
            seen.append(result)  # test
            if "text" in result:
                text += result["text"]
                print(result["text"], end="", flush=True)
        return text

    # Run the generation
    result = asyncio.run(generate("Once upon a time"))

    assert result.strip() and capsys.readouterr().out == result
    assert seen[-1]["eos"] and seen[-1]["full_completion"] == result and not any(r["eos"] for r in seen[:-1])
    assert result == tokenizer.decode(tokens_of(seen, None))[0]

    # Cancel a running job
    async def cancel_running() -> tuple[ExLlamaV2DynamicJobAsync, list[dict]]:
        job = ExLlamaV2DynamicJobAsync(
            async_gen, input_ids=tokenizer.encode("Once upon a time"), max_new_tokens=200, seed=0
        )
        results = []
        async for r in job:
            results.append(r)
            if r["stage"] == "streaming":
                await job.cancel()
        return job, results

    job, results = asyncio.run(asyncio.wait_for(cancel_running(), timeout=60))
    assert job.cancelled and results and not any(r["eos"] for r in results)  # the iteration ended at cancel
    assert async_gen.generator.num_remaining_jobs() == 0

    # Shut down the generator cleanly
    asyncio.run(async_gen.close())

    async def enqueue_after_close():
        ExLlamaV2DynamicJobAsync(async_gen, input_ids=tokenizer.encode("Hi"), max_new_tokens=4)

    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(enqueue_after_close())


# --- the compat handles themselves ---------------------------------------------------------------------


def test_config_errors_name_the_problem(tmp_path):
    with pytest.raises(MissingFileError, match="nowhere"):
        ExLlamaV2Config(str(tmp_path / "nowhere"))
    (tmp_path / "model.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        ExLlamaV2Config(str(tmp_path / "model.bin"))
    with pytest.raises(MissingFileError, match="config.json"):  # a folder without config.json
        ExLlamaV2Config(str(tmp_path))
    empty = ExLlamaV2Config()
    with pytest.raises(ValueError, match="model_dir is not set"):
        empty.prepare()
    with pytest.raises(AttributeError, match="prepare"):
        _ = empty.vocab_size


def test_unloaded_model_handles(exl):
    model = ExLlamaV2(exl.config)  # not loaded
    cache = ExLlamaV2Cache(model, max_seq_len=300, lazy=True)
    assert not model.loaded and cache.max_seq_len == 512
    with pytest.raises(RuntimeError, match="load_autosplit"):
        _ = cache.engine_cache
    with pytest.raises(RuntimeError, match="load_autosplit"):
        ExLlamaV2DynamicGenerator(model=model, cache=cache, tokenizer=exl.tokenizer)
    with pytest.raises(NotImplementedError, match="gpu_split"):
        model.load(gpu_split=[12, 12])
    assert not model.loaded


def test_cache_sizes(exl):
    cache = ExLlamaV2Cache(exl.model, max_seq_len=1000)  # model already loaded: allocated at once
    assert cache.max_seq_len == 1024 and isinstance(cache.engine_cache, Cache)
    assert cache.engine_cache.num_pages == 4 and cache.engine_cache.model is exl.model.engine_model
    assert ExLlamaV2Cache(exl.model, batch_size=2, max_seq_len=300).engine_cache.max_seq_len == 768
    unloaded = ExLlamaV2(exl.config)  # its caches are sized but not allocated
    assert ExLlamaV2Cache(unloaded, max_seq_len=None).max_seq_len == 8192
    assert ExLlamaV2Cache(unloaded).max_seq_len == 8192 and not unloaded.loaded
    for bad in ({"max_seq_len": 0}, {"batch_size": 0}, {"max_seq_len": 12.5}):
        with pytest.raises(ValueError, match="must be ints"):
            ExLlamaV2Cache(exl.model, **bad)
    with pytest.raises(TypeError, match="ExLlamaV2 model"):
        ExLlamaV2Cache(exl.model.engine_model)


@pytest.mark.parametrize(
    ("cache_class", "kv_format"), [(ExLlamaV2Cache_Q8, "q8"), (ExLlamaV2Cache_Q6, "q6"), (ExLlamaV2Cache_Q4, "q4")]
)
def test_quantized_caches_run_the_seed_example(starter_gguf, cache_class, kv_format):
    """The seed's initialization with a quantized cache class, unchanged otherwise, then a greedy answer."""
    config = ExLlamaV2Config(str(starter_gguf))
    config.prepare()
    model = ExLlamaV2(config)
    cache = cache_class(model, max_seq_len=1024, lazy=True)
    model.load_autosplit(cache)
    tokenizer = ExLlamaV2Tokenizer(config)
    generator = ExLlamaV2DynamicGenerator(model=model, cache=cache, tokenizer=tokenizer)
    output = generator.generate(prompt="The capital of France is", max_new_tokens=8, add_bos=True)
    assert output.startswith("The capital of France is") and len(output) > len("The capital of France is")
    engine_cache = cache.engine_cache
    assert engine_cache.kv_format == kv_format and engine_cache.k[0].dtype == torch.uint8
    plain = Cache(model.engine_model, 1024, page_size=256)
    assert engine_cache.num_bytes < 0.56 * plain.num_bytes


def test_tokenizer_follows_exllamav2(exl):
    tok, engine_tok = exl.tokenizer, exl.tokenizer.engine_tokenizer
    texts = ["Hello there, how are you?", "Hi"]
    ids, offsets = tok.encode(texts, return_offsets=True)
    rows = [engine_tok.encode(t)[0] for t in texts]
    assert ids.shape == (2, len(rows[0])) and offsets.tolist() == [0, len(rows[1]) - len(rows[0])]
    assert ids[1, : -len(rows[1])].eq(tok.pad_token_id).all() and ids[1, -len(rows[1]) :].equal(rows[1])
    assert tok.decode(ids) == texts  # a batch decodes to a list, padding dropped
    assert tok.decode(list(ids)) == texts
    assert tok.decode(ids[0]) == texts[0] and tok.decode(rows[0].tolist()) == texts[0]
    chat = "<|im_start|>user\nHi<|im_end|>"
    special = tok.encode(chat, add_bos=True, encode_special_tokens=True)
    assert special[0, 0] == tok.bos_token_id and tok.single_id("<|im_start|>") in special[0].tolist()
    # Decoding drops pad ids as exllamav2 does; this model's pad is <|im_end|>.
    assert tok.pad_token_id == tok.single_id("<|im_end|>")
    assert tok.decode(special, decode_special_tokens=True) == [tok.bos_token + chat.replace("<|im_end|>", "")]
    assert tok.single_id("<|im_end|>") == tok.eos_token_id == exl.config.eos_token_id == 2
    assert tok.single_id("no such piece") is None
    assert tok.get_vocab_size() == 49152 and tok.chat_template  # the rest comes from the engine tokenizer
    with pytest.raises(ValueError, match="empty"):
        tok.encode([])


def test_multimodal_job_example(tiny_llava_folder):
    """The seed's "Multimodal Job" example on a tiny random LLaVA (its answer is noise; the plumbing is not)."""
    from PIL import Image

    from engine.compat.exllamav2 import ExLlamaV2MMEmbedding, ExLlamaV2VisionTower

    config = ExLlamaV2Config(str(tiny_llava_folder))
    config.prepare()
    model = ExLlamaV2(config)
    cache = ExLlamaV2Cache(model, max_seq_len=512, lazy=True)
    model.load_autosplit(cache)
    tokenizer = ExLlamaV2Tokenizer(config)
    generator = ExLlamaV2DynamicGenerator(model=model, cache=cache, tokenizer=tokenizer)

    image = Image.new("RGB", (48, 40), "orange")
    embedding = model.vision_model.get_image_embeddings(model=model, tokenizer=tokenizer, image=image)
    assert isinstance(embedding, ExLlamaV2MMEmbedding)  # test
    prompt = f"Describe this image: {embedding.text_alias}"
    input_ids = tokenizer.encode(prompt, embeddings=[embedding])
    job = ExLlamaV2DynamicJob(
        input_ids=input_ids,
        max_new_tokens=5,
        stop_conditions=[tokenizer.eos_token_id],
        identifier="image_description",
        embeddings=[embedding],
    )
    generator.enqueue(job)
    results = []
    while generator.num_remaining_jobs():
        results += generator.iterate()
    assert results[-1]["eos"] and results[-1]["prompt_tokens"] == input_ids.shape[-1]  # test
    # A separately built tower handle (exllamav2's other spelling) gives the same ids for the same image.
    tower = ExLlamaV2VisionTower(config)
    tower.load()
    again = tower.get_image_embeddings(model=model, tokenizer=tokenizer, image=image.copy())
    assert again.first_id == embedding.first_id  # test


def test_text_model_has_no_vision_tower(exl):
    assert exl.model.vision_model is None
