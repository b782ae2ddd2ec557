"""Property test: random enqueue/cancel/iterate sequences keep page ref counts exact and free every page."""

from __future__ import annotations

from collections import Counter

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings

PAGE, PAGES = 4, 24

# Prompts drawn from a few shared stems, so prefix matches, partial copies and twin admissions all happen.
STEMS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [5, 6, 7, 8, 20, 21], [30, 31, 32, 33, 34, 35, 36, 37]]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), st.integers(0, 2), st.lists(st.integers(3, 60), max_size=6), st.integers(1, 12)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("iterate"), st.integers(1, 4)),
    ),
    min_size=1,
    max_size=30,
)


def check_invariants(gen: DynamicGenerator) -> None:
    table, sched = gen.page_table, gen.scheduler
    holders = Counter(p.page_id for seq in sched.active for p in seq.pages)
    for page in table.pages:
        assert page.ref_count == holders[page.page_id], f"page {page.page_id}: refs {page.ref_count} != holders"
    assert table.num_free == sum(1 for p in table.pages if p.ref_count == 0)
    for h, page_id in table._by_hash.items():
        page = table.pages[page_id]
        assert page.hash == h and page.num_valid == PAGE
    for seq in sched.waiting:
        assert not seq.pages
    for seq in sched.active:
        assert len(seq.pages) == table.pages_for(seq.total_tokens)
        for i, page in enumerate(seq.pages):
            if (i + 1) * PAGE <= seq.num_computed:
                assert page.token_ids == seq.tokens[i * PAGE : (i + 1) * PAGE]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops)
def test_random_schedules_keep_ref_counts_exact(tiny_model, operations):
    gen = DynamicGenerator(tiny_model, Cache(tiny_model, PAGE * PAGES, PAGE), tiny_model.tokenizer, max_chunk_size=5)
    jobs: list[DynamicJob] = []
    for op in operations:
        if op[0] == "enqueue":
            _, stem, tail, n = op
            job = DynamicJob(torch.tensor([STEMS[stem] + tail]), n, gen_settings=SamplerSettings.greedy())
            gen.enqueue(job)
            jobs.append(job)
        elif op[0] == "cancel" and jobs:
            gen.cancel(jobs[op[1] % len(jobs)])
        else:
            for _ in range(op[1]):
                gen.iterate()
        check_invariants(gen)
    for _ in range(2000):
        if not gen.num_remaining_jobs():
            break
        gen.iterate()
        check_invariants(gen)
    assert gen.num_remaining_jobs() == 0
    assert all(p.ref_count == 0 for p in gen.page_table.pages)
    assert gen.page_table.num_free == PAGES
    # Every page is reusable: a job that needs the whole cache runs to completion.
    big = DynamicJob(torch.tensor([[40] * (PAGE * PAGES - 8)]), 8, gen_settings=SamplerSettings.greedy())
    gen.enqueue(big)
    while gen.num_remaining_jobs():
        gen.iterate()
    assert gen.page_table.num_free == PAGES
