"""The app's prompt cache: a model loaded with the data folder's prompt-cache/ continues a long chat from disk
after a "restart" (a second load), with the same greedy answer."""

from __future__ import annotations

import random

import torch

from app.service.loading import Loader, prompt_cache_dir
from engine import DynamicGenerator, DynamicJob, SamplerSettings


def answer(loaded, ids):
    gen = DynamicGenerator(loaded.model, loaded.cache, loaded.tokenizer)
    gen.enqueue(DynamicJob(torch.tensor([ids]), 8, gen_settings=SamplerSettings.greedy()))
    tokens, last = [], None
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            tokens += r["token_ids"][0].tolist() if "token_ids" in r else []
            last = r
    return tokens, last["cached_tokens"]


def load(folder, cache_dir):
    loader = Loader(torch.device("cpu"), torch.float32, 16, 1024, lambda: 8 * 1024**3, cache_dir)
    return loader.prepare(lambda progress: folder, "tiny", lambda f: None, lambda f: None, 512)


def test_a_reopened_app_reads_the_chat_prefix_from_its_data_folder(tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))
    folder = prompt_cache_dir()
    assert folder == tmp_path / "prompt-cache"
    rng = random.Random(1)
    ids = [rng.randrange(3, 300) for _ in range(90)]
    first = load(tiny_folder, folder)
    expected, cached = answer(first, ids)
    assert cached == 0
    first.cache.disk.close()
    again, cached = answer(load(tiny_folder, folder), ids)
    assert again == expected and cached == 89 // 16 * 16


def test_an_unusable_folder_leaves_the_cache_in_memory(tiny_folder, tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    loaded = load(tiny_folder, blocker / "prompt-cache")
    assert loaded.cache.disk is None
    assert any("prompt cache folder" in r.getMessage() for r in caplog.records)
