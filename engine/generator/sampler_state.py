"""SamplerState: one job's sampler state (seeded generator, mirostat mu, DRY breakers, token history)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from numbers import Integral
from typing import Any

import torch

from engine.generator.sampler_settings import SamplerSettings

__all__ = ["SamplerState", "tokenize_breakers"]


def _token_list(encoded: Any) -> list[int]:
    ids = getattr(encoded, "ids", encoded)  # tokenizers.Encoding carries .ids
    return [int(t) for t in torch.as_tensor(ids).flatten().tolist()]


def tokenize_breakers(breakers: Sequence[str], tokenizer: Any) -> list[int]:
    """Token ids of DRY sequence-breaker strings.

    Each string is encoded after a leading ``"a"`` and its last token taken, so tokenizers that
    prepend a space marker (SentencePiece) still give the breaker's own token.
    ``tokenizer`` is a callable ``str -> ids`` or an object with ``encode``.
    """
    encode = tokenizer.encode if hasattr(tokenizer, "encode") else tokenizer
    ids = []
    for text in breakers:
        encoded = _token_list(encode("a" + text))
        if encoded:
            ids.append(encoded[-1])
    return sorted(set(ids))


class SamplerState:
    """Per-job sampler state: one per job, even when jobs share a :class:`SamplerSettings`.

    Holds the job's seeded ``torch.Generator`` (CPU, so draws are the same on every device),
    mirostat's ``mu``, the DRY sequence-breaker ids, and the token history (prompt + generated)
    used by the penalties and DRY. :func:`sample` updates ``mu``; the caller appends each
    accepted token with :meth:`append` and rewinds with :meth:`truncate`.
    """

    def __init__(
        self,
        settings: SamplerSettings | None = None,
        prompt_ids: Sequence[int] | torch.Tensor = (),
        *,
        seed: int | None = None,
        tokenizer: Any = None,
        dry_breaker_ids: Iterable[int] | None = None,
        prompt_penalties: bool = True,
    ) -> None:
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little") >> 1
        if isinstance(seed, bool) or not isinstance(seed, Integral) or not 0 <= seed < 2**64:
            raise ValueError(f"seed must be None or an int in [0, 2**64), got {seed!r}")
        self.seed = int(seed)
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(self.seed)
        self.mirostat_mu: torch.Tensor | None = None  # 0-d float64, set on first mirostat step
        if dry_breaker_ids is None:
            breakers = settings.dry_sequence_breakers if settings is not None else ()
            if breakers and tokenizer is None and settings is not None and settings.dry_multiplier > 0:
                raise ValueError(
                    "DRY is on (dry_multiplier > 0) but no tokenizer was given to turn "
                    "dry_sequence_breakers into token ids; pass tokenizer= or dry_breaker_ids="
                )
            dry_breaker_ids = tokenize_breakers(breakers, tokenizer) if tokenizer is not None else ()
        self.dry_breaker_ids = torch.tensor(sorted(set(int(t) for t in dry_breaker_ids)), dtype=torch.int64)
        self._tokens = torch.zeros(64, dtype=torch.int64)  # grows by doubling
        self._num_tokens = 0
        self.append(prompt_ids)
        self.num_prompt_tokens = self._num_tokens
        # False: presence and frequency penalties count generated tokens only (DynamicJob.prompt_penalties)
        self.prompt_penalties = prompt_penalties

    @property
    def history(self) -> torch.Tensor:
        """The job's tokens so far, ``[num_tokens]`` int64 (a view; do not modify)."""
        return self._tokens[: self._num_tokens]

    def append(self, token_ids: int | Sequence[int] | torch.Tensor) -> None:
        """Add accepted tokens to the history (ints, a list, or a tensor on any device)."""
        new = torch.as_tensor(token_ids, dtype=torch.int64).flatten()
        end = self._num_tokens + new.numel()
        if end > self._tokens.numel():
            grown = torch.zeros(max(end, 2 * self._tokens.numel()), dtype=torch.int64, device=self._tokens.device)
            grown[: self._num_tokens] = self.history
            self._tokens = grown
        self._tokens[self._num_tokens : end] = new.to(self._tokens.device)
        self._num_tokens = end

    def truncate(self, num_tokens: int) -> None:
        """Drop history after the first ``num_tokens`` tokens (e.g. a banned-string rewind)."""
        if not 0 <= num_tokens <= self._num_tokens:
            raise ValueError(f"truncate: num_tokens must be in [0, {self._num_tokens}], got {num_tokens}")
        self._num_tokens = num_tokens
        self.num_prompt_tokens = min(self.num_prompt_tokens, num_tokens)

    def history_on(self, device: torch.device) -> torch.Tensor:
        """The history on ``device`` (the sampler's logits' device), moved there once with the DRY breaker ids."""
        if self._tokens.device != device:
            self._tokens = self._tokens.to(device)
            self.dry_breaker_ids = self.dry_breaker_ids.to(device)
        return self.history
