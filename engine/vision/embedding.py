"""`MMEmbedding`: the embedding rows of one image and the token ids that stand for them in a prompt.

Each image occupies a run of token ids outside every vocabulary. The run's first id is derived from a
hash of the image content (and of the embedding rows, so two models never share ids for different
rows), which gives the same image the same ids in every job and every turn: the generator's page hashes
see identical ids and reuse the cached pages.
"""

from __future__ import annotations

import hashlib

import torch

# Image ids start far above any vocabulary (the largest today are ~260k) and stay below 2**62, so they
# fit int64 tensors. Each image gets a slot of MAX_TOKENS_PER_IMAGE ids chosen by its hash.
FIRST_MM_ID = 1 << 40
MAX_TOKENS_PER_IMAGE = 1 << 16
# 2**45 slots: the birthday chance of two distinct images sharing a slot is ~4e-7 among 5,000 images.
_SLOTS = 1 << 45


def is_mm_id(token_id: int) -> bool:
    """Whether `token_id` belongs to an image's id run (and so has no row in the vocabulary)."""
    return token_id >= FIRST_MM_ID


def content_hash(data: bytes) -> str:
    """A stable hex digest of image bytes (decoded pixels, so two encodings of one picture agree)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class MMEmbedding:
    """The embeddings for one image: `embeddings` [num_tokens, hidden] in the model's dtype and device.

    `text_alias` is a placeholder string to put in the prompt (made from the hash when not given);
    `tokenizer.encode(text, embeddings=[...])` replaces it with `get_ids()`, the run
    `first_id .. last_id` (inclusive). `image_hash` is the digest of the image content.
    """

    def __init__(self, embeddings: torch.Tensor, image_hash: str, text_alias: str | None = None):
        if embeddings.dim() != 2 or embeddings.shape[0] < 1:
            raise ValueError(
                f"embeddings must be [num_tokens, hidden] with num_tokens >= 1, got {list(embeddings.shape)}"
            )
        if embeddings.shape[0] > MAX_TOKENS_PER_IMAGE:
            raise ValueError(
                f"an image may use at most {MAX_TOKENS_PER_IMAGE} tokens, got {embeddings.shape[0]}; "
                "use a smaller image size or a model with fewer image tokens"
            )
        self.embeddings = embeddings
        self.image_hash = image_hash
        # The slot mixes the image hash with the rows' shape, so the same image embedded by two models
        # (different hidden sizes or token counts) never gets the same ids.
        key = f"{image_hash}:{embeddings.shape[0]}x{embeddings.shape[1]}:{embeddings.dtype}".encode()
        slot = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % _SLOTS
        self.first_id = FIRST_MM_ID + slot * MAX_TOKENS_PER_IMAGE
        self.last_id = self.first_id + embeddings.shape[0] - 1
        self.text_alias = text_alias if text_alias is not None else f"<$IMG_{image_hash[:16]}$>"

    @property
    def num_tokens(self) -> int:
        return self.embeddings.shape[0]

    def get_ids(self) -> torch.Tensor:
        """The token ids of this image, as a [1, num_tokens] tensor (exllamav2's shape)."""
        return torch.arange(self.first_id, self.last_id + 1, dtype=torch.long).unsqueeze(0)

    def owns(self, token_id: int) -> bool:
        return self.first_id <= token_id <= self.last_id

    def __repr__(self) -> str:
        return f"MMEmbedding({self.num_tokens} tokens, alias={self.text_alias!r}, hash={self.image_hash[:12]})"
