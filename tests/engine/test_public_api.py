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


def test_readme_vision_example(tiny_llava_folder):
    from PIL import Image

    from engine import Cache, DynamicGenerator, DynamicJob, MMEmbedding, Model

    model = Model.load(tiny_llava_folder)
    embedding = model.vision.get_image_embeddings(
        model=model, tokenizer=model.tokenizer, image=Image.new("RGB", (40, 30), "teal")
    )
    assert isinstance(embedding, MMEmbedding)
    ids = model.tokenizer.encode(f"{embedding.text_alias}\nDescribe this image.", embeddings=[embedding])
    job = DynamicJob(ids, max_new_tokens=5, embeddings=[embedding])
    generator = DynamicGenerator(model, Cache(model, max_seq_len=512, page_size=256), model.tokenizer)
    generator.enqueue(job)
    results = []
    while generator.num_remaining_jobs():
        results += generator.iterate()
    assert results[-1]["eos"] and results[-1]["prompt_tokens"] == ids.shape[-1]
