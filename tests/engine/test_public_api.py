"""The README's Python example runs as written (on the tiny model instead of a real path)."""

from __future__ import annotations

import engine


def test_public_names_are_importable():
    for name in (
        "Model",
        "Tokenizer",
        "Cache",
        "DynamicGenerator",
        "DynamicJob",
        "DynamicGeneratorAsync",
        "DynamicJobAsync",
        "SamplerSettings",
        "MMEmbedding",
    ):
        assert hasattr(engine, name), name


def test_readme_example(tiny_folder):
    from engine import Cache, DynamicGenerator, DynamicJob, Model, SamplerSettings

    model = Model.load(tiny_folder)
    cache = Cache(model, max_seq_len=1024, page_size=256)
    generator = DynamicGenerator(model, cache, model.tokenizer)
    job = DynamicJob(
        model.tokenizer.encode("Once upon a time"),
        max_new_tokens=10,
        gen_settings=SamplerSettings(temperature=0.7),
        stop_conditions=[model.tokenizer.eos_token_id],
    )
    generator.enqueue(job)
    texts = []
    while generator.num_remaining_jobs():
        for result in generator.iterate():
            texts.append(result.get("text", ""))
            if result["eos"]:
                assert result["full_completion"] == "".join(texts)
    assert generator.page_table.num_free == generator.num_pages
