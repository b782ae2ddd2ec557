"""Qwen2-VL and Qwen2.5-VL: a dynamic-resolution vision transformer and a Qwen2 language model with M-RoPE.

An image keeps its aspect ratio: the processor resizes it to a grid of patches (processor.py), the
vision model (tower.py) turns each 2x2 block of patches into one row, and those rows stand in the prompt
where the processor writes <|image_pad|> tokens:

    <|vision_start|> [image rows: an MMEmbedding, grid_h/2 x grid_w/2 of them] <|vision_end|>

The MMEmbedding holds the image rows only; <|vision_start|> and <|vision_end|> stay text
(`Qwen2VLImageEmbedding.prompt_text`), so the ids equal the reference processor's with each image's
<|image_pad|> run replaced by the image's id run.

M-RoPE: every token has three positions (time, height, width). Text tokens have all three equal. An image's
rows, starting at position s, take (s, s + row, s + column) of their block in the merged grid; the text
after the image continues at s + max(rows, columns), not at s + number of rows. So a token's position
depends on every image before it, which a prefill chunk or a decode step does not hold: the generator
calls `mrope_positions(token_ids, start, length, embeddings)` with the sequence's whole token list, and the
images' grids come from their embeddings (`grid_thw`), found by their ids. The positions of a token depend
only on the tokens before it and their grids (part of the image ids), so cached pages stay valid for any
job that shares the prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from engine.config.model import ModelConfig
from engine.errors import ModelLoadError
from engine.models.qwen2_vl.tower import Grid, Qwen2VisionConfig, Qwen2VisionTransformer
from engine.models.rope import MultimodalRotaryTable, inverse_frequencies
from engine.models.vlm import VisionLanguageModel
from engine.vision.embedding import MMEmbedding
from engine.vision.handle import VisionHandle
from engine.vision.layers import config_int

# transformers' Qwen2VLConfig / Qwen2_5_VLConfig defaults.
_DEFAULT_IMAGE_ID = 151655
_DEFAULT_VISION_START_ID = 151652
_DEFAULT_VISION_END_ID = 151653
_DEFAULT_MROPE_SECTION = [16, 24, 24]


class Qwen2VLImageEmbedding(MMEmbedding):
    """An MMEmbedding of one image's rows with its patch grid `grid_thw` (t, h, w), which the text model's
    positions need. In a rendered chat it stands between <|vision_start|> and <|vision_end|> (`prompt_text`).

    The grid is part of `image_hash` (content digest, then ":TxHxW"), so two grids never share ids: their
    positions differ, and so would the cached keys of every later token.
    """

    def __init__(
        self,
        embeddings: torch.Tensor,
        image_hash: str,
        grid_thw: Grid,
        text_alias: str | None = None,
        wrap: tuple[str, str] = ("<|vision_start|>", "<|vision_end|>"),
    ):
        t, h, w = grid_thw
        super().__init__(embeddings, image_hash=f"{image_hash}:{t}x{h}x{w}", text_alias=text_alias)
        self.grid_thw: Grid = (int(t), int(h), int(w))
        self.wrap = wrap

    @property
    def prompt_text(self) -> str:
        return f"{self.wrap[0]}{self.text_alias}{self.wrap[1]}"


class Qwen2VLForConditionalGeneration(VisionLanguageModel):
    """Qwen2-VL over a paged KV cache (transformers' Qwen2VLForConditionalGeneration).

    `forward(inputs, positions, batch)` is the language model's; `positions` are [num_tokens] (text only) or
    [3, num_tokens] M-RoPE positions from `mrope_positions`. `encode_images` turns patches into image rows;
    `vision` (also `vision_model`) is the handle with `get_image_embeddings`.
    """

    architectures = ("Qwen2VLForConditionalGeneration",)
    is_v2_5 = False
    default_text_architecture = "Qwen2ForCausalLM"
    text_architectures = ("Qwen2ForCausalLM",)
    # The released layout (which transformers 5's save_pretrained writes back) and the transformers 4.5x one
    # with everything under "model.". Order matters: "model.visual." before the plain "model.".
    checkpoint_parts = (
        ("model.visual.", "visual", ""),
        ("visual.", "visual", ""),
        ("model.language_model.", "language_model", "model."),
        ("model.", "language_model", "model."),
        ("lm_head.", "language_model", "lm_head."),
    )

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        extra = config.extra
        self.language_model = self.build_language_model(config)
        self.mrope_section = _mrope_section(extra)
        try:
            inv_freq = inverse_frequencies(self.language_model.config)
            factor = self.language_model.rope.attention_factor  # yarn's scale on cos and sin, 1 without
            self.language_model.rope = MultimodalRotaryTable(inv_freq, self.mrope_section, factor)
        except ValueError as e:
            raise ModelLoadError(f"config.json rope_scaling: {e}; config.json is inconsistent.") from None

        vision = extra.get("vision_config") or {}
        if not isinstance(vision, dict):
            raise ModelLoadError(f"config.json vision_config must be an object, got {type(vision).__name__}")
        self.vision_config = Qwen2VisionConfig.from_hf_dict(vision, self.is_v2_5)
        if self.vision_config.out_hidden_size != config.hidden_size:
            raise ModelLoadError(
                f"config.json: the vision model puts out rows of width {self.vision_config.out_hidden_size} but the "
                f"language model's hidden_size is {config.hidden_size}; the config is inconsistent."
            )
        self.visual = Qwen2VisionTransformer(self.vision_config)
        self.spatial_merge_size = self.vision_config.spatial_merge_size
        self.image_token_id = _DEFAULT_IMAGE_ID if config.image_token_id is None else config.image_token_id
        self.vision_start_token_id = config_int(extra, "vision_start_token_id", _DEFAULT_VISION_START_ID)
        self.vision_end_token_id = config_int(extra, "vision_end_token_id", _DEFAULT_VISION_END_ID)
        self.vision = Qwen2VLVision(self)

    @torch.no_grad()
    def encode_images(self, pixel_values: torch.Tensor, grids: Sequence[Grid]) -> torch.Tensor:
        """Image rows [sum of t*h*w / merge**2, hidden] for patches [sum of t*h*w, patch_dim] of images with
        patch grids `grids` (t, h, w), one after another."""
        return self.visual(pixel_values.to(self.device), [tuple(int(v) for v in g) for g in grids])

    def mrope_positions(
        self, token_ids: Sequence[int], start: int, length: int, embeddings: Sequence[Any] = ()
    ) -> torch.Tensor:
        """M-RoPE positions [3, length] (int64, on the CPU) of token_ids[start:start + length].

        `token_ids` is the sequence's whole token list (at least start + length long) and `embeddings` the
        images whose id runs it may hold, each with its `grid_thw`. Images after the slice are not looked at.
        """
        if not isinstance(token_ids, list):
            token_ids = list(token_ids.tolist() if isinstance(token_ids, torch.Tensor) else token_ids)
        end = start + length
        if start < 0 or length < 0 or end > len(token_ids):
            raise ValueError(f"tokens {start}..{end} are outside a sequence of {len(token_ids)}")
        merge = self.spatial_merge_size
        pieces: list[torch.Tensor] = []
        shift = 0  # a text token's position minus its index, after the images passed so far
        cursor = start  # the first index of the slice not yet given positions
        for begin, image in _image_runs(token_ids, end, embeddings):
            t, h, w = _merged_grid(image, merge)
            n = t * h * w
            if begin > cursor:
                pieces.append(torch.arange(cursor, begin).expand(3, -1) + shift)
            lo, hi = max(0, start - begin), min(n, end - begin)
            if lo < hi:
                row = torch.arange(lo, hi)
                first = begin + shift  # the image's first position, as the text before it would continue
                pieces.append(torch.stack([first + row // (h * w), first + row // w % h, first + row % w]))
            shift += max(h, w) - n
            cursor = max(cursor, begin + n)
        if cursor < end:
            pieces.append(torch.arange(cursor, end).expand(3, -1) + shift)
        return torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.long)


class Qwen2_5_VLForConditionalGeneration(Qwen2VLForConditionalGeneration):
    """Qwen2.5-VL: Qwen2-VL with a vision model that attends within windows in most layers, uses RMSNorm and a
    gated MLP. Positions, prompts and the language model are Qwen2-VL's."""

    architectures = ("Qwen2_5_VLForConditionalGeneration",)
    is_v2_5 = True


class Qwen2VLVision(VisionHandle):
    """The image side of a loaded Qwen2-VL: preprocessing (from the folder's processor config), the chat
    template's placeholder, `get_image_embeddings` (exllamav2's call shape) and `count_image_tokens` (one id
    per merged block of the picture's dynamic patch grid)."""

    def read_processor(self, folder: Path):
        from engine.models.qwen2_vl.processor import Qwen2VLImageProcessor

        return Qwen2VLImageProcessor.from_folder(folder)

    def check_processor(self, value) -> None:
        vc = self.model.vision_config
        mine = (vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size)
        theirs = (value.patch_size, value.merge_size, value.temporal_patch_size)
        if mine != theirs:
            raise ValueError(
                f"the image processor cuts (patch_size, merge_size, temporal_patch_size) = {theirs} but the vision "
                f"model takes {mine}; the processor config and config.json do not belong together"
            )

    @property
    def image_placeholder(self) -> str | None:
        """What the chat template writes for an image ("<|vision_start|><|image_pad|><|vision_end|>"), or None
        without a usable tokenizer."""
        m = self.model
        pieces = [self.piece(i) for i in (m.vision_start_token_id, m.image_token_id, m.vision_end_token_id)]
        return None if None in pieces else "".join(pieces)

    def embed_picture(self, picture: Image.Image, tokenizer: Any | None) -> torch.Tensor:
        patched = self.processor(picture)
        return self.model.encode_images(patched.pixel_values, [patched.grid_thw])

    def num_image_tokens(self, height: int, width: int) -> int:
        t, h, w = self.processor.grid_thw(height, width)
        return t * h * w // self.model.spatial_merge_size**2

    def wrap(
        self, rows: torch.Tensor, image_hash: str, height: int, width: int, text_alias: str | None
    ) -> Qwen2VLImageEmbedding:
        start, end = self.piece(self.model.vision_start_token_id), self.piece(self.model.vision_end_token_id)
        wrap = (start, end) if start is not None and end is not None else ("<|vision_start|>", "<|vision_end|>")
        grid = self.processor.grid_thw(height, width)
        return Qwen2VLImageEmbedding(rows, image_hash=image_hash, grid_thw=grid, text_alias=text_alias, wrap=wrap)


def _image_runs(token_ids: list[int], end: int, embeddings: Sequence[Any]) -> list[tuple[int, Any]]:
    """(index of the first id, embedding) of every image run starting in token_ids[:end], in prompt order.

    An image may appear several times (the same picture sent twice); list.index keeps the scan in C, so a
    decode step over a long chat costs little.
    """
    runs, seen = [], set()
    for e in embeddings:
        if e.first_id in seen:
            continue
        seen.add(e.first_id)
        i = -1
        while True:
            try:
                i = token_ids.index(e.first_id, i + 1, end)
            except ValueError:
                break
            runs.append((i, e))
    runs.sort(key=lambda r: r[0])
    return runs


def _merged_grid(image: Any, merge: int) -> Grid:
    """(t, h, w) of an image's rows: its patch grid with h and w divided by the merge size."""
    grid = getattr(image, "grid_thw", None)
    if grid is None:
        raise ValueError(
            f"the image embedding {image!r} has no grid_thw, which Qwen2-VL's positions need; make it with "
            "this model's vision.get_image_embeddings(...)"
        )
    t, h, w = grid
    if h % merge or w % merge or t * (h // merge) * (w // merge) != image.num_tokens:
        raise ValueError(
            f"the image embedding {image!r} has grid {tuple(grid)}, which does not give its {image.num_tokens} "
            f"rows with merge size {merge}; make it with this model's vision.get_image_embeddings(...)"
        )
    return t, h // merge, w // merge


def _mrope_section(extra: dict[str, Any]) -> list[int]:
    """The M-RoPE bands from rope_parameters / rope_scaling, in text_config or (released configs) at the top."""
    for d in (extra.get("text_config") or {}, extra):
        for key in ("rope_parameters", "rope_scaling"):
            rope = d.get(key)
            if isinstance(rope, dict) and rope.get("mrope_section") is not None:
                section = rope["mrope_section"]
                if not isinstance(section, list) or not all(isinstance(s, int) and s >= 0 for s in section):
                    raise ModelLoadError(f"config.json {key}.mrope_section must be a list of counts, got {section!r}")
                return section
    return list(_DEFAULT_MROPE_SECTION)
