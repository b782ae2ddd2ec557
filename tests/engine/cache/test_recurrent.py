"""Recurrent-state slots: the pool a hybrid model's cache sizes from its layers (and refuses when too small), the
slot bookkeeping (live slots, spares, snapshots in LRU order that give way to sequences), and the manager's rules
for them: a snapshot when a page boundary is reached with the state there, prefix hits cut back to the deepest
snapshot and restored from it, rewinds restored from the deepest kept state, drafts' state set aside and
restored. Ids only here; tests/engine/generator/test_hybrid_prefix.py runs them on a model."""

from __future__ import annotations

import pytest
import torch

from engine.cache import Cache
from engine.cache.cache import SNAPSHOTS_PER_SEQ, STATE_SEQS
from engine.cache.manager import CacheManager
from engine.cache.page_table import ROOT_HASH, chain_hash
from engine.cache.recurrent import RecurrentState, StateCopy, StateShape, StateSlots
from engine.config.model import ModelConfig
from engine.generator.checks import check_job
from engine.generator.job import DynamicJob
from engine.generator.scheduler import Seq
from engine.models.qwen3_5 import Qwen3_5ForCausalLM

PS = 4
SHAPES = {0: StateShape(conv_dim=10, conv_width=3, num_heads=2, key_dim=4, value_dim=5), 2: StateShape(6, 1, 1, 2, 3)}


def make_seq(serial: int, prompt: list[int], max_new: int = 4, may_rewind: bool = False) -> Seq:
    return Seq(serial, list(prompt), len(prompt), max_new, max_skips=4, may_rewind=may_rewind)


def admit(manager: CacheManager, *seqs: Seq):
    hits = [manager.lookup(s.tokens[: s.prompt_len]) for s in seqs]
    return manager.allocate(seqs, [s.total_tokens for s in seqs], hits)


@pytest.fixture(scope="module")
def model():
    """An untrained Qwen3.5 (uninitialized weights: the cache reads only its layers' shapes)."""
    config = ModelConfig.from_hf_dict(
        {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_text",
            "vocab_size": 64,
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 4,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "linear_num_key_heads": 1,
            "linear_num_value_heads": 2,
            "linear_key_head_dim": 8,
            "linear_value_head_dim": 8,
            "linear_conv_kernel_dim": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        }
    )
    return Qwen3_5ForCausalLM(config).float()


def test_the_slot_size_is_every_linear_layers_conv_window_and_delta_state():
    per_slot = (10 * 3 + 6 * 1) * 2 + (2 * 4 * 5 + 1 * 2 * 3) * 4  # conv windows in bfloat16, delta states float32
    state = RecurrentState.for_budget(SHAPES, 3 * per_slot + per_slot - 1, torch.bfloat16, torch.device("cpu"))
    assert state.bytes_per_slot == per_slot and state.num_slots == state.num_live == 3
    state = RecurrentState.for_budget(SHAPES, per_slot, torch.bfloat16, torch.device("cpu"), 2 * per_slot + 5)
    assert (state.num_live, state.num_slots, state.num_bytes) == (1, 3, 3 * per_slot)
    assert tuple(state.conv[0].shape) == (3, 10, 3) and state.conv[0].dtype == torch.bfloat16
    assert tuple(state.delta[2].shape) == (3, 1, 2, 3) and state.delta[2].dtype == torch.float32
    with pytest.raises(ValueError, match=f"state_bytes >= {per_slot:,}"):
        RecurrentState.for_budget(SHAPES, per_slot - 1, torch.bfloat16, torch.device("cpu"))


def test_copy_slot_copies_every_layer():
    state = RecurrentState(SHAPES, 2, torch.float32, torch.device("cpu"))
    for t in [*state.conv.values(), *state.delta.values()]:
        t[0].normal_()
    state.copy_slot(0, 1)
    for t in [*state.conv.values(), *state.delta.values()]:
        assert torch.equal(t[1], t[0])


def run(manager: CacheManager, seq: Seq, end: int) -> None:
    """A forward of seq.tokens[num_computed:end] and its commit, as the generator drives them."""
    manager.step(seq, seq.num_computed, end)
    manager.commit(seq, end)


def page_hashes(tokens: list[int], num_pages: int) -> list[int]:
    hashes, h = [], ROOT_HASH
    for i in range(num_pages):
        h = chain_hash(h, tokens[i * PS : (i + 1) * PS])
        hashes.append(h)
    return hashes


def test_sequences_take_live_slots_up_to_the_live_count_and_spares_from_the_rest():
    slots = StateSlots(4, num_live=2)
    a, b, c = make_seq(0, [1]), make_seq(1, [2]), make_seq(2, [3])
    assert slots.can_take(2, 2) and not slots.can_take(3) and not slots.can_take(2, 3)
    slots.take(a, spare=True)
    assert (a.state_slot, a.spare_slot, a.state_at, a.spare_at) == (0, 1, 0, -1)
    with pytest.raises(RuntimeError, match="already holds"):
        slots.take(a)
    slots.take(b)
    assert slots.num_free == 1 and not slots.can_take(1)  # a slot is left, but both live ones run
    slots.release(a)
    assert a.state_slot == a.spare_slot == -1 and slots.num_free == 3
    slots.take(c, spare=True)
    slots.release(a)  # holds none: nothing happens
    assert slots.num_free == 1


def test_snapshots_are_used_least_recently_first_and_give_way_to_sequences():
    slots = StateSlots(3, num_live=1)
    a, b = make_seq(0, [1]), make_seq(1, [2])
    slots.take(a)
    first, second = slots.keep(101), slots.keep(102)
    assert {first, second} == {1, 2} and slots.keep(102) is None  # kept already
    assert slots.snapshot(101) == first  # now the most recently used
    assert slots.keep(103) == second and not slots.has(102)  # evicts the least recently used
    assert slots.num_snapshots == 2 and slots.num_free == 2
    slots.pin([101])
    assert slots.can_take(0, 1, keep=[101]) and not slots.can_take(0, 2, keep=[101])
    assert slots.keep(104) == second and slots.has(101)  # a pinned snapshot stays
    slots.unpin()
    slots.release(a)
    slots.take(b, spare=True)  # a free slot, then the least recently used snapshot's
    assert b.state_slot == 0 and b.spare_slot == first and not slots.has(101) and slots.has(104)
    assert not slots.can_take(1)  # the live slot is b's
    assert slots.keep(105) == second and slots.num_snapshots == 1  # snapshots have what sequences leave


def test_the_cache_keeps_state_slots_not_pages_for_linear_layers(model):
    cache = Cache(model, max_seq_len=8 * PS, page_size=PS, dtype=torch.float32)
    assert cache.state_layers == {0, 1, 2} and cache.state.num_live == STATE_SEQS
    assert cache.state.num_slots == STATE_SEQS * (1 + SNAPSHOTS_PER_SEQ)
    assert [k.shape[0] for k in cache.k] == [0, 0, 0, 8]
    pages = sum(t.numel() * 4 for t in cache.k + cache.v)
    assert cache.num_bytes == pages + cache.state.num_slots * cache.state.bytes_per_slot
    assert cache.bytes_per_token == pages // (8 * PS)
    cache.k[3][1].normal_()
    cache.copy_page(1, 2)  # the linear layers have no rows to copy
    assert torch.equal(cache.k[3][2], cache.k[3][1])
    one = cache.state.bytes_per_slot
    small = Cache(model, max_seq_len=8 * PS, page_size=PS, dtype=torch.float32, state_bytes=one, snapshot_bytes=0)
    assert small.state.num_slots == small.state.num_live == 1
    with pytest.raises(ValueError, match="holds no sequence's recurrent state"):
        Cache(model, max_seq_len=8 * PS, page_size=PS, state_bytes=one - 1)


def test_a_sequence_waits_for_a_live_slot_and_gets_the_freed_one():
    manager = CacheManager(num_pages=16, page_size=PS, states=StateSlots(1))
    a, b = make_seq(0, [1, 2, 3]), make_seq(1, [4, 5, 6])
    assert admit(manager, a) == [] and a.state_slot == 0
    assert admit(manager, b) is None and b.pages == []  # pages to spare, but no slot: it waits
    manager.free(a)
    assert a.state_slot == -1
    assert admit(manager, b) == [] and b.state_slot == 0


def test_a_snapshot_is_kept_where_a_step_ends_on_a_page_boundary():
    manager = CacheManager(num_pages=16, page_size=PS, states=StateSlots(4, num_live=1))
    prompt = list(range(10, 21))  # two full pages and three tokens
    a = make_seq(0, prompt)
    admit(manager, a)
    run(manager, a, 4)
    run(manager, a, 6)
    run(manager, a, 8)
    run(manager, a, 10)
    hashes = page_hashes(prompt, 2)
    copies = manager.take_state_copies()
    assert copies == [StateCopy(0, manager.states.snapshot(h)) for h in hashes]
    assert manager.step_room(a) == 2  # the next chunk ends at the next boundary
    with pytest.raises(RuntimeError, match="state is after token 10"):
        manager.step(a, 8, 9)


def test_a_prefix_resumes_from_the_deepest_page_with_a_snapshot_and_not_mid_page():
    manager = CacheManager(num_pages=16, page_size=PS, states=StateSlots(4, num_live=1))
    prompt = list(range(10, 21))
    a = make_seq(0, prompt)
    admit(manager, a)
    for end in (4, 8, 11):
        run(manager, a, end)
    manager.free(a)
    manager.take_state_copies()
    hashes = page_hashes(prompt, 2)
    other = prompt[:10] + [99, 98]  # leaves the first sequence in its third page
    hit = manager.lookup(other)
    assert hit.num_tokens == 8 and [p.hash for p in hit.pages] == hashes and not hit.pending
    b = make_seq(1, other)
    assert admit(manager, b) == []  # no copy of the third page's rows: no state there
    assert (b.num_computed, b.state_at) == (8, 8)
    assert manager.take_state_copies() == [StateCopy(manager.states.snapshot(hashes[1]), b.state_slot)]
    manager.free(b)
    for h in (1001, 1002, 1003, 1004):  # push out every snapshot of the prompt: those at 4 and 8, its tail
        manager.states.keep(h)
    assert manager.lookup(prompt).num_tokens == 0 and manager.lookup(other).num_tokens == 0


def test_a_prompt_continuing_a_finished_sequence_takes_over_its_last_page_and_state():
    manager = CacheManager(num_pages=16, page_size=PS, states=StateSlots(4, num_live=1))
    prompt = list(range(10, 21))
    a = make_seq(0, prompt, max_new=2)
    admit(manager, a)
    for end in (4, 8, 11):
        run(manager, a, end)
    a.tokens.append(21)  # its first token, not computed
    last_page = a.pages[2]
    manager.free(a)
    tail = chain_hash(page_hashes(prompt, 2)[1], [18, 19, 20])
    assert manager.take_state_copies()[-1] == StateCopy(0, manager.states.snapshot(tail))  # kept at free()
    follow = prompt + [21, 22, 23]
    hit = manager.lookup(follow)
    assert hit.num_tokens == 11 and hit.pages[-1] is last_page and hit.state_hash == tail
    b = make_seq(1, follow)
    assert admit(manager, b) == [] and b.pages[2] is last_page and last_page.ref_count == 1
    assert (b.num_computed, b.state_at) == (11, 11)
    assert manager.take_state_copies() == [StateCopy(manager.states.snapshot(tail), b.state_slot)]
    run(manager, b, 13)
    assert last_page.hash == chain_hash(page_hashes(prompt, 2)[1], [18, 19, 20, 21])  # named when full


def test_a_rewind_restores_the_deepest_kept_state():
    manager = CacheManager(num_pages=16, page_size=PS, states=StateSlots(8, num_live=1))
    s = make_seq(0, [1, 2, 3, 4, 5], max_new=12)
    admit(manager, s)
    run(manager, s, 5)
    s.tokens += [6, 7, 8, 9, 10, 11, 12, 13, 14]
    for end in range(6, 14):
        run(manager, s, end)
    hashes = page_hashes(s.tokens, 3)
    manager.take_state_copies()
    manager.rewind(s, 13)  # nothing dropped: the state stays where it is
    assert s.num_computed == s.state_at == 13 and manager.take_state_copies() == []
    manager.rewind(s, 11)
    assert s.num_computed == s.state_at == 8
    assert manager.take_state_copies() == [StateCopy(manager.states.snapshot(hashes[1]), s.state_slot)]
    assert [p.num_valid for p in s.pages[:3]] == [4, 4, 0]
    manager.rewind(s, 3)
    assert s.num_computed == s.state_at == 0 and manager.take_state_copies() == []  # the zero state: no copy


def test_a_verify_step_sets_the_state_before_its_drafts_aside_and_settles_back_to_it():
    manager = CacheManager(num_pages=16, page_size=PS, states=StateSlots(4, num_live=2), speculative=True)
    s = make_seq(0, [1, 2, 3, 4, 5, 6], max_new=8)
    admit(manager, s)
    run(manager, s, 6)
    s.tokens.append(7)  # the newest token, then three drafts fed with it
    assert manager.draft_room(s) == 1  # drafts stop at the page boundary at 8
    manager.take_state_copies()
    manager.step(s, 6, 10)
    assert manager.take_state_copies() == [StateCopy(s.state_slot, s.spare_slot)]
    assert (s.spare_at, s.state_at) == (6, 10)
    manager.commit(s, 7)  # the newest token; its first draft was accepted, the others not
    s.tokens.append(8)
    manager.commit(s, 8)
    manager.settle(s)
    assert (s.num_computed, s.state_at) == (6, 6)
    assert manager.take_state_copies() == [StateCopy(s.spare_slot, s.state_slot)]
    run(manager, s, 8)  # computed again: now the state is at the boundary, and a snapshot is kept there
    assert len(manager.take_state_copies()) == 1 and manager.states.num_snapshots == 1


def test_a_sequence_that_may_rewind_keeps_the_state_before_its_last_prompt_page_in_its_spare():
    manager = CacheManager(num_pages=16, page_size=PS, states=StateSlots(4, num_live=1))
    s = make_seq(0, list(range(1, 11)), may_rewind=True)  # the last prompt token is in the page from 8
    admit(manager, s)
    assert s.spare_slot >= 0
    run(manager, s, 4)
    run(manager, s, 8)
    assert s.spare_at == 8 and StateCopy(s.state_slot, s.spare_slot) in manager.take_state_copies()
    run(manager, s, 10)
    s.tokens += [11, 12, 13]
    run(manager, s, 12)
    manager.states.keep(1001)  # the snapshots at 4, 8 and 12 give way to others
    manager.states.keep(1002)
    manager.take_state_copies()
    manager.rewind(s, 11)
    assert s.state_at == 8 and manager.take_state_copies() == [StateCopy(s.spare_slot, s.state_slot)]


def test_a_job_needing_more_slots_than_the_pool_holds_is_refused_at_enqueue(model):
    manager = CacheManager(num_pages=16, page_size=PS, states=StateSlots(1, bytes_per_slot=1000))
    check_job(DynamicJob([1, 2, 3], max_new_tokens=4), model, manager, 8, 64)
    with pytest.raises(ValueError, match=r"a spare each.*2 in all.*state_bytes \+ snapshot_bytes >= 2,000"):
        check_job(DynamicJob([1, 2, 3], max_new_tokens=4, banned_strings=["x"]), model, manager, 8, 64)
    cfg = DynamicJob([1, 2, 3], max_new_tokens=4)
    cfg.negative_ids = [1, 2]  # (a CFG pair's second prompt)
    with pytest.raises(ValueError, match="CFG job.*state_bytes >= 2,000"):
        check_job(cfg, model, manager, 8, 64)
