"""Paged attention over a ragged batch, in plain torch.

Layout of the KV cache for one layer (pages are shared between sequences through block tables):

    k_cache, v_cache: [num_pages, page_size, num_kv_heads, head_dim]
    block_tables:     [num_seqs, max_pages_per_seq]   page ids, in order; unused entries are ignored
    seq_lens:         [num_seqs]  tokens in the cache for each sequence after this step's K/V is written
    query_lens:       host ints; the last query_lens[i] of a sequence's seq_lens[i] tokens are its queries

Queries of all sequences are concatenated on the token axis: q is [num_tokens, num_q_heads, head_dim].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from kernels.torch_ref import kv_quant
from kernels.torch_ref.paged_decode import decode_attention


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> bool:
    """Store new K/V rows at flat slots (page_id * page_size + offset)."""
    if k_cache.dtype == torch.uint8:
        return kv_quant.write_kv(k_cache, v_cache, k, v, slot_mapping)
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if k_cache.is_contiguous() and v_cache.is_contiguous():
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))
        return True
    # A strided cache (head-major memory on the CPU): address slots as (page, offset) pairs.
    page_size = k_cache.shape[1]
    pages, offsets = slot_mapping // page_size, slot_mapping % page_size
    k_cache.index_put_((pages, offsets), k.to(k_cache.dtype))
    v_cache.index_put_((pages, offsets), v.to(v_cache.dtype))
    return True


def _window_mask(q_pos: torch.Tensor, kv_len: int, sliding_window: int | None) -> torch.Tensor:
    """Boolean [q, kv] mask: causal, and within the sliding window when one is set."""
    kv_pos = torch.arange(kv_len, device=q_pos.device)
    mask = kv_pos[None, :] <= q_pos[:, None]
    if sliding_window is not None:
        mask &= kv_pos[None, :] > q_pos[:, None] - sliding_window
    return mask


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None = None,
    page_runs: Sequence[int] | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new queries over its cached keys/values -> [num_tokens, Hq, D].

    `page_runs` (optional, host ints): per sequence, the first page id when its pages are consecutive
    ids (else -1); such a sequence's keys and values are read as a view of the cache, with no gather.
    """
    if k_cache.dtype == torch.uint8:
        args = (q, k_cache, v_cache, block_tables, seq_lens, query_lens, seq_lens_host, scale, sliding_window)
        return _quantized_attention(*args)
    num_seqs = len(query_lens)
    runs = list(page_runs) if page_runs else [-1] * num_seqs
    if all(n == 1 for n in query_lens) and (num_seqs > 1 or sliding_window is not None):
        # Several sequences: one page-split pass over all their pages beats any per-sequence loop.
        return decode_attention(q, k_cache, v_cache, block_tables, seq_lens_host, scale, sliding_window)
    if num_seqs == 1 and query_lens[0] == 1:
        # One sequence: its pages read as a view (no gather), and its exact length needs no mask.
        if not _viewable(k_cache, seq_lens_host[0], runs[0]):
            return decode_attention(q, k_cache, v_cache, block_tables, seq_lens_host, scale, sliding_window)
        k, v = _keys_values(k_cache, v_cache, block_tables[0], seq_lens_host[0], runs[0])
        qi = q[0, :, None].to(k.dtype)[None]  # [1, Hq, 1, D]
        return F.scaled_dot_product_attention(qi, k, v, scale=scale, enable_gqa=True)[0, :, 0][None]

    out = torch.empty(q.shape, dtype=k_cache.dtype, device=q.device)
    start = 0
    for i in range(num_seqs):
        q_len, kv_len = query_lens[i], seq_lens_host[i]
        k, v = _keys_values(k_cache, v_cache, block_tables[i], kv_len, runs[i])
        qi = q[start : start + q_len].transpose(0, 1).to(k.dtype)[None]  # [1, Hq, q_len, D]
        if q_len == kv_len and sliding_window is None:
            o = F.scaled_dot_product_attention(qi, k, v, is_causal=True, scale=scale, enable_gqa=True)
        else:
            q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)
            mask = _window_mask(q_pos, kv_len, sliding_window)
            o = F.scaled_dot_product_attention(qi, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        out[start : start + q_len] = o[0].transpose(0, 1)
        start += q_len
    return out


def _viewable(k_cache: torch.Tensor, kv_len: int, run: int) -> bool:
    """Whether `_keys_values` can return a view: one run of pages whose slots merge into one axis."""
    page_size = k_cache.shape[1]
    return run >= 0 and (kv_len <= page_size or k_cache.stride(0) == page_size * k_cache.stride(1))


def _keys_values(
    k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor, kv_len: int, run: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's first kv_len keys and values as [1, Hkv, kv_len, D]: a view of the cache when its
    pages are one run starting at page `run`, else gathered page by page.

    4-D because with 3-D inputs SDPA takes a slow path that materializes the score matrix.
    """
    page_size, num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    num_pages = (kv_len + page_size - 1) // page_size
    if run >= 0:
        k, v = k_cache.narrow(0, run, num_pages), v_cache.narrow(0, run, num_pages)
    else:
        pages = table[:num_pages]
        k, v = k_cache.index_select(0, pages), v_cache.index_select(0, pages)
    # reshape is a view when the pages' slots merge (a plain cache, or a single head-major page), else a copy
    k = k.reshape(-1, num_kv_heads, head_dim)[:kv_len].transpose(0, 1)[None]
    v = v.reshape(-1, num_kv_heads, head_dim)[:kv_len].transpose(0, 1)[None]
    return k, v


def paged_attention_key_ends(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None,
    key_ends: torch.Tensor,
) -> torch.Tensor:
    """`paged_attention` where new token t sees the keys at positions < key_ends[t] instead of <= its own.

    key_ends [num_tokens] int64; position + 1 everywhere is plain causal attention. A run of tokens that
    attend to each other in both directions (Gemma 3's image tokens) sets its key_ends to the run's end,
    which must lie within the sequence. The sliding window still counts back from the token's own position.
    """
    if k_cache.dtype == torch.uint8:
        args = (q, k_cache, v_cache, block_tables, seq_lens, query_lens, seq_lens_host, scale, sliding_window)
        return _quantized_attention(*args, key_ends=key_ends)
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    page_size = k_cache.shape[1]
    out = torch.empty(q.shape, dtype=k_cache.dtype, device=q.device)
    start = 0
    for i, (q_len, kv_len) in enumerate(zip(query_lens, seq_lens_host)):
        pages = block_tables[i, : (kv_len + page_size - 1) // page_size]
        k = k_cache.index_select(0, pages).reshape(-1, num_kv_heads, head_dim)[:kv_len].transpose(0, 1)[None]
        v = v_cache.index_select(0, pages).reshape(-1, num_kv_heads, head_dim)[:kv_len].transpose(0, 1)[None]
        qi = q[start : start + q_len].transpose(0, 1).to(k.dtype)[None]  # [1, Hq, q_len, D]
        kv_pos = torch.arange(kv_len, device=q.device)
        mask = kv_pos[None, :] < key_ends[start : start + q_len, None]  # [q_len, kv_len]
        if sliding_window is not None:
            q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)
            mask &= kv_pos[None, :] > q_pos[:, None] - sliding_window
        o = F.scaled_dot_product_attention(qi, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        out[start : start + q_len] = o[0].transpose(0, 1)
        start += q_len
    return out


def _float_pages(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens_host: Sequence[int],
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The quantized pages the sequences read, dequantized into a compact float32 cache, and the tables
    renumbered to it."""
    bits = kv_quant.bits_of(k_cache, head_dim)
    page_size = k_cache.shape[1]
    used = [(length + page_size - 1) // page_size for length in seq_lens_host]
    tables = block_tables.to(device="cpu", dtype=torch.int64)
    ids = sorted({int(p) for row, n in zip(tables.tolist(), used) for p in row[:n]})
    index = torch.tensor(ids, dtype=torch.int64, device=k_cache.device)
    renumber = {page: i for i, page in enumerate(ids)}
    compact = torch.zeros_like(tables)
    for i, (row, n) in enumerate(zip(tables.tolist(), used)):
        compact[i, :n] = torch.tensor([renumber[p] for p in row[:n]], dtype=torch.int64)
    k = kv_quant.dequantize(k_cache.index_select(0, index), bits, head_dim).contiguous()
    v = kv_quant.dequantize(v_cache.index_select(0, index), bits, head_dim).contiguous()
    return k, v, compact.to(block_tables.device)


def _quantized_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sliding_window: int | None = None,
    key_ends: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention over quantized pages (kv_quant.py) -> [num_tokens, Hq, D] in q's dtype: the float twin on the
    pages the sequences read, dequantized, with the query rotated in and the output rotated back."""
    head_dim = q.shape[-1]
    k, v, tables = _float_pages(k_cache, v_cache, block_tables, seq_lens_host, head_dim)
    args = (kv_quant.rotate(q), k, v, tables, seq_lens, query_lens, seq_lens_host, scale, sliding_window)
    out = paged_attention(*args) if key_ends is None else paged_attention_key_ends(*args, key_ends)
    return kv_quant.rotate(out).to(q.dtype)


# Query rows scored at once by `paged_attention_sinks`, per head: bounds its float32 score block (heads x rows x
# keys) on a long prompt.
_SINK_ROWS = 256


def paged_attention_sinks(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_lens: Sequence[int],
    seq_lens_host: Sequence[int],
    scale: float,
    sinks: torch.Tensor,
    sliding_window: int | None = None,
    page_runs: Sequence[int] | None = None,
) -> torch.Tensor:
    """`paged_attention` with a learned sink per query head (gpt-oss): `sinks` [Hq] float32 is one more logit in
    each row's softmax, a key every query sees that has no value, so a row can give attention to nothing:

        out = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink_h - m)),  m = max(max_j s_j, sink_h)

    Scores are formed explicitly in float32 with the sink as an extra column (dropped after the softmax), a few
    hundred query rows at a time; quantized pages go through `_float_pages` as `_quantized_attention` does."""
    if k_cache.dtype == torch.uint8:
        k, v, tables = _float_pages(k_cache, v_cache, block_tables, seq_lens_host, q.shape[-1])
        args = (kv_quant.rotate(q), k, v, tables, seq_lens, query_lens, seq_lens_host, scale, sinks, sliding_window)
        return kv_quant.rotate(paged_attention_sinks(*args)).to(q.dtype)
    num_heads = q.shape[1]
    runs = list(page_runs) if page_runs else [-1] * len(query_lens)
    sink = sinks.to(device=q.device, dtype=torch.float32)[:, None, None]  # [Hq, 1, 1]
    out = torch.empty(q.shape, dtype=k_cache.dtype, device=q.device)
    start = 0
    for i, (q_len, kv_len) in enumerate(zip(query_lens, seq_lens_host)):
        k, v = _keys_values(k_cache, v_cache, block_tables[i], kv_len, runs[i])  # [1, Hkv, kv_len, D]
        group = num_heads // k.shape[1]
        k = k[0].float().repeat_interleave(group, dim=0)  # [Hq, kv_len, D]
        v = v[0].float().repeat_interleave(group, dim=0)
        for lo in range(0, q_len, _SINK_ROWS):
            hi = min(q_len, lo + _SINK_ROWS)
            qi = q[start + lo : start + hi].transpose(0, 1).float()  # [Hq, rows, D]
            scores = torch.matmul(qi, k.transpose(1, 2)) * scale  # [Hq, rows, kv_len]
            q_pos = torch.arange(kv_len - q_len + lo, kv_len - q_len + hi, device=q.device)
            scores = scores.masked_fill(~_window_mask(q_pos, kv_len, sliding_window), float("-inf"))
            logits = torch.cat((scores, sink.expand(-1, hi - lo, 1)), dim=-1)
            probs = torch.softmax(logits, dim=-1)[..., :-1]
            out[start + lo : start + hi] = torch.matmul(probs, v).transpose(0, 1).to(out.dtype)
        start += q_len
    return out
