"""Page allocation keeps a sequence's pages consecutive when it can, without evicting cached prefixes early."""

from __future__ import annotations

from engine.cache.page_table import ROOT_HASH, PageTable
from engine.models.batch import _run_start


def test_allocation_follows_the_previous_page_when_it_is_empty():
    table = PageTable(num_pages=8, page_size=4)
    a = table.allocate(ROOT_HASH, owner=1)
    b = table.allocate(ROOT_HASH, owner=2)
    a2 = table.allocate(ROOT_HASH, owner=1, after=a.page_id)  # a+1 is taken by b: the next free page
    assert (a.page_id, b.page_id, a2.page_id) == (0, 1, 2)
    b2 = table.allocate(ROOT_HASH, owner=2, after=b.page_id)  # b+1 is taken too
    b3 = table.allocate(ROOT_HASH, owner=2, after=b2.page_id)  # b2+1 is free and empty: taken
    assert b3.page_id == b2.page_id + 1


def test_allocation_does_not_evict_a_cached_page_out_of_lru_order():
    table = PageTable(num_pages=4, page_size=2)
    pages = [table.allocate(ROOT_HASH, owner=1) for _ in range(4)]
    pages[1].token_ids = [5, 6]
    table.register_full(pages[1])
    for p in pages:
        table.release(p)  # page 1 keeps its prefix; 0, 2, 3 are empty and come first
    fresh = table.allocate(ROOT_HASH, owner=2, after=0)
    assert fresh.page_id != 1


def test_run_start():
    assert _run_start([4, 5, 6, 0], 3) == 4
    assert _run_start([4, 6, 7], 3) == -1
    assert _run_start([4, 6, 7], 1) == 4
