"""The sliding-window memory rows: real Cache sizing on Gemma 3's shapes built on the meta device."""

from __future__ import annotations

from engine.bench import kv_windows
from engine.memory_fit import kv_bytes_per_token


def test_every_page_kept_is_the_plain_cache_and_the_pools_hold_less():
    measured = kv_windows.measure()
    assert set(measured) == set(kv_windows.GEMMA3_SHAPES)
    for name, sizes in measured.items():
        layers, _, kv_heads, head_dim, _, _ = kv_windows.GEMMA3_SHAPES[name]
        assert sizes["every_page"] == kv_bytes_per_token(layers, kv_heads, head_dim, 2) * kv_windows.CONTEXT
        # five layers in six keep a pool; the full ones keep every page
        assert sizes["every_page"] / 6 < sizes["one_job_pool"] < sizes["default_pool"] < sizes["every_page"]
    rows = kv_windows.rows(measured)
    assert len(rows) == len(measured) and all(r["result"].endswith("saved") for r in rows)
