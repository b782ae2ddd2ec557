"""Rotary embedding tables: inverse frequencies (with linear/llama3/yarn/longrope scaling) and per-position
cos/sin."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from engine.config.model import ModelConfig, RopeScaling
from engine.errors import ModelLoadError
from engine.models.batch import Batch


def inverse_frequencies(
    config: ModelConfig, freq_factors: torch.Tensor | None = None, long: bool = False
) -> torch.Tensor:
    """[rotary_dim / 2] float32 inverse frequencies, scaled as the config's rope_scaling says (under longrope,
    the short factors' unless `long`)."""
    dim = config.rotary_dim
    # Explicit CPU device: models are built under torch.device("meta"), and these numbers must be real.
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim))
    scaling = config.rope_scaling
    if scaling is not None and scaling.rope_type == "linear":
        inv = inv / scaling.factor
    elif scaling is not None and scaling.rope_type == "llama3":
        # Long wavelengths are slowed by `factor`, short ones kept, and the band between blended smoothly.
        old_ctx = scaling.original_max_position_embeddings
        wavelen = 2 * math.pi / inv
        low_wavelen = old_ctx / scaling.low_freq_factor
        high_wavelen = old_ctx / scaling.high_freq_factor
        smooth = (old_ctx / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
        blended = (1 - smooth) * inv / scaling.factor + smooth * inv
        inv = torch.where(
            wavelen > low_wavelen, inv / scaling.factor, torch.where(wavelen < high_wavelen, inv, blended)
        )
    elif scaling is not None and scaling.rope_type == "yarn":
        inv = _yarn(inv, dim, config.rope_theta, scaling)
    elif scaling is not None and scaling.rope_type == "longrope":
        inv = inv / _per_frequency(scaling.long_factor if long else scaling.short_factor, dim)
    if freq_factors is not None:
        # GGUF files store llama3-style scaling as explicit per-frequency divisors.
        inv = inv / freq_factors.to(torch.float64)
    return inv.float()


def _yarn(inv: torch.Tensor, dim: int, base: float, scaling: RopeScaling) -> torch.Tensor:
    """YaRN: frequencies that turn more than `beta_fast` times within the original context are kept
    (extrapolated), those turning fewer than `beta_slow` times are divided by `factor` (interpolated), and a
    linear ramp over the frequency index blends the band between (transformers' `_compute_yarn_parameters`)."""

    def index_turning(turns: float) -> float:  # the frequency index that turns `turns` times in the context
        return dim * math.log(scaling.original_max_position_embeddings / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = index_turning(scaling.beta_fast), index_turning(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a one-index ramp, not a division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float64, device="cpu") - low) / (high - low)).clamp(0, 1)
    return inv / scaling.factor * ramp + inv * (1 - ramp)


def _per_frequency(factors: Sequence[float], dim: int) -> torch.Tensor:
    """LongRoPE's divisors as a [dim / 2] tensor, one for each frequency of a rotary of `dim` dimensions."""
    if len(factors) != dim // 2:
        raise ModelLoadError(
            f"rope_scaling's longrope factors list {len(factors)} numbers, but a rotary of {dim} dimensions has "
            f"{dim // 2} frequencies. The config (or GGUF file) is damaged or not this model's; use its own."
        )
    return torch.tensor(factors, dtype=torch.float64, device="cpu")


class RotaryTable:
    """cos/sin for positions 0..n, grown on demand (decided from host-side lengths, never by a device sync).

    Both are multiplied by `attention_factor` (yarn's magnitude correction, 1 otherwise), as transformers does:
    every attention that takes its cos/sin from here, prompt, decode plan or kernel, gets it."""

    def __init__(self, inv_freq: torch.Tensor, attention_factor: float = 1.0):
        self.inv_freq = inv_freq
        self.attention_factor = attention_factor
        self.cos = torch.empty(0)
        self.sin = torch.empty(0)

    @classmethod
    def for_config(cls, config: ModelConfig, freq_factors: torch.Tensor | None = None) -> RotaryTable:
        """The table of `config`'s rope: its frequencies and, under yarn, its attention factor."""
        scaling = config.rope_scaling
        if scaling is not None and scaling.rope_type == "longrope":
            long = inverse_frequencies(config, freq_factors, long=True)
            return LongRopeTable(inverse_frequencies(config, freq_factors), long, scaling)
        return cls(inverse_frequencies(config, freq_factors), 1.0 if scaling is None else scaling.attention_factor)

    def lookup_batch(self, positions: torch.Tensor, batch: Batch, dtype: torch.dtype):
        """Per-token (cos, sin) of one forward step over `batch`, whose tokens are at `positions`."""
        return self.lookup(positions, max(batch.seq_lens_host), dtype)

    def lookup(
        self, positions: torch.Tensor, max_position: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token (cos, sin), each [num_tokens, head_dim], for positions all below `max_position`."""
        if self.cos.shape[0] < max_position or self.cos.device != positions.device or self.cos.dtype != dtype:
            n = max(max_position, 2 * self.cos.shape[0], 256)
            t = torch.arange(n, dtype=torch.float32, device=positions.device)
            freqs = torch.outer(t, self.inv_freq.to(positions.device))
            emb = torch.cat((freqs, freqs), dim=-1)  # [n, head_dim]
            # Scaled in float32 before the cast, as transformers does.
            factor = self.attention_factor
            self.cos, self.sin = (emb.cos() * factor).to(dtype), (emb.sin() * factor).to(dtype)
        return self.cos[positions], self.sin[positions]


class LongRopeTable(RotaryTable):
    """LongRoPE (Phi-3, Phi-4-mini): the short factors' frequencies (this table's own) or the long factors'
    (`long`), both scaled by the attention factor.

    Which set a step takes is fixed by the cache's context, as vLLM (max_model_len) and llama.cpp (n_ctx) fix it:
    the long set where the cache can hold a sequence longer than `original_max_position_embeddings`, the short
    set otherwise. transformers decides by the sequence, and recomputes every cached key with the long set when
    a sequence grows past the original context (Phi3ForCausalLM.prepare_inputs_for_generation); deciding by the
    cache gives the same numbers wherever the two agree (sequences past the original context in a long cache,
    every sequence in a short one), and keeps keys valid as a sequence grows: no recompute, and chunked prefill,
    prefix reuse and batching give what one pass gives."""

    def __init__(self, short_inv_freq: torch.Tensor, long_inv_freq: torch.Tensor, scaling: RopeScaling):
        super().__init__(short_inv_freq, scaling.attention_factor)
        self.long = RotaryTable(long_inv_freq, scaling.attention_factor)
        self.original = scaling.original_max_position_embeddings

    def lookup(
        self, positions: torch.Tensor, max_position: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Without a cache to decide by: the long set when the longest sequence (`max_position`) is past the
        original context, as transformers decides one forward pass."""
        if max_position > self.original:
            return self.long.lookup(positions, max_position, dtype)
        return super().lookup(positions, max_position, dtype)

    def lookup_batch(self, positions: torch.Tensor, batch: Batch, dtype: torch.dtype):
        longest = max(batch.seq_lens_host)
        if batch.cache.max_seq_len > self.original:
            return self.long.lookup(positions, longest, dtype)
        return super().lookup(positions, longest, dtype)


class MultimodalRotaryTable(RotaryTable):
    """M-RoPE (Qwen2-VL): positions have three rows (time, height, width), and each band of rotary
    frequencies turns by one row's position. `sections` lists the bands' sizes in frequencies; band i
    reads row i % 3. One-row positions mean all three rows are equal, which is plain RoPE."""

    def __init__(self, inv_freq: torch.Tensor, sections: list[int], attention_factor: float = 1.0):
        super().__init__(inv_freq, attention_factor)
        if sum(sections) != inv_freq.numel():
            raise ValueError(f"mrope_section {sections} must add up to {inv_freq.numel()} (head_dim / 2)")
        rows = [i % 3 for i, size in enumerate(sections) for _ in range(size)]
        self.row_of_dim = torch.tensor(rows + rows, device="cpu")  # [head_dim]; both rotate-half halves alike

    def lookup(
        self, positions: torch.Tensor, max_position: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [num_tokens, head_dim] for positions [num_tokens] or [3, num_tokens]."""
        if positions.dim() == 1:
            return super().lookup(positions, max_position, dtype)
        super().lookup(positions[0], max_position, dtype)  # grows the table; the rows are picked below
        index = positions[self.row_of_dim.to(positions.device)].T  # [num_tokens, head_dim]: each column's position
        return self.cos.gather(0, index), self.sin.gather(0, index)
