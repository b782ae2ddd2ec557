"""The disk tier on a tiny real model: a restart reads the prefix back; damaged, truncated and foreign files are
skipped; a full disk loses nothing; two processes writing one folder leave only valid files."""

from __future__ import annotations

import errno
import gc
import json
import logging
import multiprocessing
import os
import random
import shutil
import struct

import pytest
import torch

from engine.cache import Cache
from engine.cache.disk import MAGIC, SUFFIX, DiskTier
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings

PS = 16
PAGES = 24


def prompt(model, n=100, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(3, model.config.vocab_size) for _ in range(n)]


def run(model, ids, disk_dir=None, n=12):
    """One greedy job on a fresh cache and generator (a "process"); returns (tokens, the last result)."""
    cache = Cache(model, max_seq_len=PAGES * PS, page_size=PS, disk_dir=disk_dir)
    gen = DynamicGenerator(model, cache, model.tokenizer)
    job = DynamicJob(torch.tensor([ids]), n, gen_settings=SamplerSettings.greedy(), identifier=0)
    gen.enqueue(job)
    tokens, last = [], None
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            tokens += r["token_ids"][0].tolist() if "token_ids" in r else []
            last = r
    if cache.disk is not None:
        cache.disk.close()  # every queued page written, as a process that ends normally leaves them
    return tokens, last


def page_files(folder):
    return sorted(p for p in folder.rglob(f"*{SUFFIX}"))


@pytest.fixture
def cold(tiny_model):
    ids = prompt(tiny_model)
    tokens, last = run(tiny_model, ids)
    assert last["cached_tokens"] == 0
    return ids, tokens


def test_restart_reads_the_prefix_from_disk(tiny_model, cold, tmp_path):
    ids, expected = cold
    first, last = run(tiny_model, ids, tmp_path)
    assert first == expected and last["cached_tokens"] == 0
    # prompt pages (6 full pages of the 99 reusable tokens) and the generated ones that filled
    assert len(page_files(tmp_path)) >= (len(ids) - 1) // PS
    again, last = run(tiny_model, ids, tmp_path)
    assert again == expected
    assert last["cached_tokens"] == (len(ids) - 1) // PS * PS


def test_continuing_a_chat_reads_the_answer_pages_too(tiny_model, tmp_path):
    ids = prompt(tiny_model, 60, seed=3)
    answer, _ = run(tiny_model, ids, tmp_path, n=40)
    follow = ids + answer + prompt(tiny_model, 10, seed=4)
    expected, _ = run(tiny_model, follow)
    got, last = run(tiny_model, follow, tmp_path)
    assert got == expected
    assert last["cached_tokens"] == (len(ids) + len(answer)) // PS * PS


def header(path):
    data = path.read_bytes()
    (n,) = struct.unpack_from("<I", data, len(MAGIC))
    return json.loads(data[len(MAGIC) + 4 : len(MAGIC) + 4 + n])


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign"])
def test_a_bad_file_is_skipped_with_a_log_line(tiny_model, cold, tmp_path, caplog, damage):
    ids, expected = cold
    run(tiny_model, ids, tmp_path)
    victim = next(p for p in page_files(tmp_path) if header(p)["token_ids"] == ids[2 * PS : 3 * PS])
    data = victim.read_bytes()
    if damage == "flip":
        victim.write_bytes(data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:])
    elif damage == "truncate":
        victim.write_bytes(data[: len(data) // 2])
    else:
        # Another model's page under this model's name: same layout and tokens, another identity in the header.
        c = tiny_model.config
        other = DiskTier(
            tmp_path / "other", "f" * 40, (c.num_hidden_layers, PS, c.num_key_value_heads, c.head_dim), torch.float32
        )
        head = header(victim)
        rows = [torch.randn(PS, c.num_key_value_heads, c.head_dim) for _ in range(2 * c.num_hidden_layers)]
        other.write(head["hash"], head["prev_hash"], head["token_ids"], rows)
        other.close()
        shutil.copyfile(page_files(tmp_path / "other")[0], victim)
    caplog.set_level(logging.INFO, logger="engine.cache.disk")
    again, last = run(tiny_model, ids, tmp_path)
    assert again == expected
    assert last["cached_tokens"] == 2 * PS  # the pages before the bad one came from disk, the rest was computed
    assert any("skipping" in r.getMessage() for r in caplog.records)


def test_a_full_disk_loses_nothing(tiny_model, cold, tmp_path, monkeypatch, caplog):
    ids, expected = cold

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("engine.cache.disk.os.replace", no_space)
    caplog.set_level(logging.WARNING, logger="engine.cache.disk")
    tokens, last = run(tiny_model, ids, tmp_path)
    assert tokens == expected and last["eos"]
    assert page_files(tmp_path) == [] and not list(tmp_path.rglob("*.tmp"))
    assert any("disk is full" in r.getMessage() for r in caplog.records)


def test_the_size_cap_evicts_least_recently_used(tiny_model, tmp_path):
    old, new = prompt(tiny_model, seed=8), prompt(tiny_model, 60, seed=9)
    run(tiny_model, old, tmp_path)
    files = page_files(tmp_path)
    page_size = files[0].stat().st_size
    cap = 3 * page_size + page_size // 2
    cache = Cache(tiny_model, max_seq_len=PAGES * PS, page_size=PS, disk_dir=tmp_path, disk_max_bytes=cap)
    gen = DynamicGenerator(tiny_model, cache, tiny_model.tokenizer)
    job = DynamicJob(torch.tensor([new]), 2, gen_settings=SamplerSettings.greedy())
    gen.enqueue(job)
    while gen.num_remaining_jobs():
        gen.iterate()
    cache.disk.close()
    left = page_files(tmp_path)
    assert sum(p.stat().st_size for p in left) <= cap
    # the newest pages stay: the last one written (the new prompt's last full page) is still there
    assert any(header(p)["token_ids"] == new[2 * PS : 3 * PS] for p in left)
    assert not any(header(p)["token_ids"] == old[:PS] for p in left)


def _write_pages(folder, seed):
    layout = (2, PS, 2, 8)
    tier = DiskTier(folder, "a" * 40, layout, torch.float32)
    gen = torch.Generator().manual_seed(seed)
    for h in range(40):  # the same hashes from both processes, so they race on every file
        rows = [torch.full((PS, 2, 8), float(h)) + 0 * torch.rand((), generator=gen) for _ in range(4)]
        while not tier.write(h, h - 1, list(range(h, h + PS)), rows):
            tier.flush()
            if tier.contains(h):
                break
    tier.close()


def test_two_processes_on_one_folder_leave_only_valid_files(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_pages, args=(tmp_path, s)) for s in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    tier = DiskTier(tmp_path, "a" * 40, (2, PS, 2, 8), torch.float32)
    for h in range(40):
        rows = tier.read(h, h - 1, list(range(h, h + PS)))
        assert rows is not None and all(torch.equal(r, torch.full((PS, 2, 8), float(h))) for r in rows)
    tier.close()
    assert not [p for p in os.listdir(tier.folder) if p.endswith(".tmp")]


def test_a_dropped_cache_ends_its_writer_thread(tiny_model, tmp_path):
    cache = Cache(tiny_model, max_seq_len=PAGES * PS, page_size=PS, disk_dir=tmp_path)
    thread = cache.disk._thread
    assert thread.is_alive()
    del cache
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()
