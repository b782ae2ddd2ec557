"""The cache manager's interface: lookup, allocate (all or none), commit, rewind and free keep pages exact."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cache.manager import CacheManager, PageCopy
from engine.cache.page_table import chain_hash
from engine.generator.scheduler import Seq

PS = 4


def make_seq(serial: int, prompt: list[int], max_new: int = 4, may_rewind: bool = False) -> Seq:
    return Seq(serial, list(prompt), len(prompt), max_new, max_skips=4, may_rewind=may_rewind)


def admit(manager: CacheManager, *seqs: Seq) -> list[PageCopy] | None:
    hits = [manager.lookup(s.tokens[: s.prompt_len]) for s in seqs]
    return manager.allocate(seqs, [s.total_tokens for s in seqs], hits)


def test_lookup_finds_the_pages_a_freed_sequence_committed():
    manager = CacheManager(num_pages=8, page_size=PS)
    prompt = list(range(10, 21))  # two full pages and three tokens
    a = make_seq(0, prompt)
    assert admit(manager, a) == []
    assert manager.lookup(prompt).pending  # a twin prompt learns that `a` is computing its pages
    manager.commit(a, len(prompt))
    assert not manager.lookup(prompt).pending
    a_pages = [p.page_id for p in a.pages]
    manager.free(a)
    assert manager.num_free == 8 and a.pages == []

    longer = prompt + [99]
    hit = manager.lookup(longer)
    assert [p.page_id for p in hit.pages] == a_pages[:2] and hit.num_tokens == 8 and not hit.pending
    b = make_seq(1, longer)
    copies = admit(manager, b)
    # The third page's three rows are copied rather than computed again; the last prompt token never is.
    assert copies == [PageCopy(src=a_pages[2], dst=b.pages[2].page_id, num_tokens=3)]
    assert [p.page_id for p in b.pages[:2]] == a_pages[:2]
    assert b.num_computed == 11 and manager.pages_for(b.num_computed) == 3
    manager.copies_done()
    manager.commit(b, len(longer))
    manager.free(b)
    assert manager.num_free == 8 and manager.table.referenced_pages() == []


def test_rewind_unnames_dropped_rows_and_free_returns_every_page():
    manager = CacheManager(num_pages=6, page_size=PS)
    s = make_seq(0, [1, 2, 3, 4, 5], max_new=12)
    admit(manager, s)
    s.tokens += [6, 7, 8, 9, 10, 11, 12]  # generated
    manager.commit(s, 11)
    assert manager.lookup(s.tokens[:9] + [0]).num_tokens == 8
    manager.rewind(s, 6)
    assert s.num_computed == 6 and s.pages[1].token_ids == [5, 6] and s.pages[2].token_ids == []
    assert manager.lookup(s.tokens[:9] + [0]).num_tokens == 4  # the second page is no longer full
    manager.free(s)
    assert manager.num_free == 6 and manager.table.referenced_pages() == []


def test_generated_rows_of_a_rewindable_sequence_are_named_only_when_freed():
    manager = CacheManager(num_pages=4, page_size=PS)
    s = make_seq(0, [1, 2, 3], max_new=8, may_rewind=True)
    admit(manager, s)
    s.tokens += [4, 5, 6, 7, 8]
    manager.commit(s, 8)  # two full pages, holding rows a banned string may still undo
    assert manager.lookup(s.tokens + [0]).num_tokens == 0
    manager.free(s)
    assert manager.lookup(s.tokens + [0]).num_tokens == 8


def test_a_group_gets_its_pages_together_or_not_at_all():
    manager = CacheManager(num_pages=4, page_size=PS)
    a, b = make_seq(0, [1] * 5, max_new=3), make_seq(0, [2] * 6, max_new=3)  # 2 + 3 pages
    assert admit(manager, a, b) is None
    assert manager.num_free == 4 and a.pages == [] and b.pages == [] and manager.table.referenced_pages() == []


def test_a_prefix_two_sequences_of_a_group_share_counts_once():
    manager = CacheManager(num_pages=3, page_size=PS)
    first = make_seq(0, [7, 7, 7, 7, 1], max_new=0)
    admit(manager, first)
    manager.commit(first, 5)
    manager.free(first)  # [7, 7, 7, 7] stays cached in an unreferenced page
    a, b = make_seq(1, [7, 7, 7, 7, 1], max_new=3), make_seq(1, [7, 7, 7, 7, 2], max_new=3)
    assert admit(manager, a, b) == []  # one cached page + one fresh page each: exactly the three pages
    assert a.pages[0] is b.pages[0] and a.pages[0].ref_count == 2 and manager.num_free == 0
    manager.free(a)
    manager.free(b)
    assert manager.num_free == 3


# Random admissions (single and paired), prefill and decode steps, rewinds and frees from a few shared stems,
# so prefix hits, partial copies, pending pages and all-or-none refusals all happen.
STEMS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [5, 6, 7, 8, 20, 21], [30, 31, 32, 33, 34, 35, 36, 37]]
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("admit"),
            st.integers(0, 2),
            st.lists(st.integers(3, 9), max_size=6),
            st.integers(0, 10),
            st.booleans(),
            st.one_of(st.none(), st.integers(0, 2)),
        ),
        st.tuples(st.just("step"), st.integers(0, 50), st.integers(1, 16)),
        st.tuples(st.just("step"), st.integers(0, 50), st.integers(1, 16)),
        st.tuples(st.just("rewind"), st.integers(0, 50), st.floats(0, 1)),
        st.tuples(st.just("free"), st.integers(0, 50)),
    ),
    min_size=1,
    max_size=60,
)


def check_invariants(manager: CacheManager, live: list[Seq]) -> None:
    holders = Counter(p.page_id for s in live for p in s.pages)
    for page in manager.table.pages:
        assert page.ref_count == holders[page.page_id], f"page {page.page_id}: refs {page.ref_count} != holders"
    assert manager.num_free == sum(1 for p in manager.table.pages if p.ref_count == 0)
    for h, page_id in manager.table._by_hash.items():
        page = manager.table.pages[page_id]
        assert page.hash == h and page.num_valid == PS and chain_hash(page.prev_hash, page.token_ids) == h
    for s in live:
        assert len(s.pages) == manager.pages_for(s.total_tokens)
        for i, page in enumerate(s.pages):
            n = min(PS, max(0, s.num_computed - i * PS))
            assert page.token_ids == s.tokens[i * PS : i * PS + n], f"seq {s.serial} page {i}"


@settings(max_examples=60, deadline=None)
@given(ops)
def test_random_operations_keep_ref_counts_exact(operations):
    manager = CacheManager(num_pages=12, page_size=PS)
    rng = random.Random(0)
    live: list[Seq] = []
    serial = 0
    for op in operations:
        if op[0] == "admit":
            _, stem, tail, max_new, may_rewind, negative = op
            group = [make_seq(serial, STEMS[stem] + tail, max_new, may_rewind)]
            if negative is not None:
                group.append(make_seq(serial, STEMS[negative], max_new, may_rewind))
            serial += 1
            hits = [manager.lookup(s.tokens) for s in group]
            free_before = manager.num_free
            copies = None if any(h.pending for h in hits) else admit(manager, *group)
            if copies is None:
                assert manager.num_free == free_before and all(s.pages == [] for s in group)
                continue
            for c in copies:  # the copied rows are the ones the destination page claims
                s, idx = next((s, i) for s in group for i, p in enumerate(s.pages) if p.page_id == c.dst)
                rows = s.tokens[idx * PS : idx * PS + c.num_tokens]
                assert manager.table.pages[c.src].token_ids[: c.num_tokens] == rows == s.pages[idx].token_ids
            manager.copies_done()
            live += group
        elif op[0] == "step" and live:
            s = live[op[1] % len(live)]
            if s.num_computed < len(s.tokens):
                manager.commit(s, min(len(s.tokens), s.num_computed + op[2]))
            elif len(s.tokens) < s.total_tokens:
                s.tokens.append(rng.randrange(3, 9))
        elif op[0] == "rewind" and live:
            s = live[op[1] % len(live)]
            if s.may_rewind:  # only a sequence whose generated pages stay unnamed may be rewound
                keep = s.prompt_len + int(op[2] * (len(s.tokens) - s.prompt_len))
                del s.tokens[keep:]
                manager.rewind(s, keep - 1)
        elif op[0] == "free" and live:
            manager.free(live.pop(op[1] % len(live)))
        check_invariants(manager, live)
        for s in live:  # a hit is always the prompt's own tokens
            hit = manager.lookup(s.tokens[: s.prompt_len])
            assert [t for p in hit.pages for t in p.token_ids] == s.tokens[: hit.num_tokens]
    for s in live:
        manager.free(s)
    assert manager.table.referenced_pages() == [] and manager.num_free == manager.num_pages
