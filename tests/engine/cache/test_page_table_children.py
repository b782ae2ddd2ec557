"""The page table's follower index (prev hash -> pages) keeps no empty entries as jobs come and go."""

from __future__ import annotations

import random

import torch

from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings

PAGE, PAGES = 4, 48


def test_children_index_keeps_no_empty_sets_after_many_jobs(tiny_model):
    gen = DynamicGenerator(tiny_model, Cache(tiny_model, PAGE * PAGES, PAGE), tiny_model.tokenizer, max_chunk_size=16)
    rng = random.Random(0)
    stems = [[rng.randrange(3, 300) for _ in range(rng.randint(2, 9))] for _ in range(6)]
    for _ in range(300):
        # Shared stems give prefix hits and partial copies; random tails and cancels churn the pages.
        tail = [rng.randrange(3, 300) for _ in range(rng.randint(1, 10))]
        job = DynamicJob(
            torch.tensor([rng.choice(stems) + tail]), rng.randint(1, 6), gen_settings=SamplerSettings.greedy()
        )
        gen.enqueue(job)
        for _ in range(rng.randint(0, 3)):
            gen.iterate()
        if rng.random() < 0.2:
            gen.cancel(job)
    while gen.num_remaining_jobs():
        gen.iterate()
    table = gen.page_table
    empty = [h for h, kids in table._children.items() if not kids]
    assert not empty, f"{len(empty)} of {len(table._children)} entries are empty sets"
    # Every entry names a page that really follows that hash, so the index is bounded by the pages.
    followers = sum(len(kids) for kids in table._children.values())
    assert followers <= PAGES
    for prev_hash, kids in table._children.items():
        assert all(table.pages[p].prev_hash == prev_hash for p in kids)
