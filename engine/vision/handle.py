"""What every model's vision handle shares: the image processor read from the model folder, the call shape of
exllamav2's vision model, and counting the ids a picture will take without running the vision tower."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from PIL import Image

from engine.errors import ModelLoadError
from engine.vision.embedding import MMEmbedding, content_hash
from engine.vision.image import ImageSource, decode_image, oriented_size


def vision_of(model: object) -> VisionHandle | None:
    """The vision handle of `model` (its `vision` attribute), or None when the model is text-only: how callers
    ask whether a loaded model can see images."""
    return getattr(model, "vision", None)


class VisionHandle:
    """Base of the `model.vision` objects: the image side of a loaded vision-language model, shaped like
    exllamav2's vision model so code written for it runs.

    A subclass says how to read its processor (`read_processor`, optionally checked by `check_processor`), how
    to turn a picture into its embedding rows (`embed_picture`), how many rows a picture of a given size takes
    (`num_image_tokens`), and, where its prompt differs, which MMEmbedding wraps the rows (`wrap`).
    """

    def __init__(self, model: Any):
        self.model = model
        self._processor = None

    # --- the image processor ---------------------------------------------------------------------------

    def read_processor(self, folder: Path) -> Any:
        raise NotImplementedError

    def check_processor(self, value: Any) -> None:
        """Raise ValueError when `value` cannot serve this model; any processor by default."""

    @property
    def processor(self) -> Any:
        """The model's image processor, read from its folder on first use (settable)."""
        if self._processor is None:
            source = self.model.source_path
            if source is None:
                raise RuntimeError(
                    "this model was not loaded from a folder, so it has no preprocessor_config.json; "
                    "set model.vision.processor to an image processor built with from_dict(...)"
                )
            self.processor = self.read_processor(Path(source))
        return self._processor

    @processor.setter
    def processor(self, value: Any) -> None:
        self.check_processor(value)
        self._processor = value

    # --- prompt text -----------------------------------------------------------------------------------

    def piece(self, token_id: int) -> str | None:
        """The model tokenizer's text for `token_id`, or None without a usable tokenizer."""
        try:
            tokenizer = self.model.tokenizer
        except (AttributeError, ModelLoadError):
            return None
        return tokenizer.id_to_piece(token_id)

    @property
    def image_placeholder(self) -> str | None:
        """What the chat template writes for an image (the image token's text by default), or None without a
        usable tokenizer."""
        return self.piece(self.model.image_token_id)

    # --- embedding -------------------------------------------------------------------------------------

    def get_image_embeddings(
        self,
        model: object | None = None,
        tokenizer: object | None = None,
        image: ImageSource | None = None,
        text_alias: str | None = None,
    ) -> MMEmbedding:
        """Embed one image (a PIL image, a path, encoded bytes, or a DecodedImage) as an MMEmbedding of this
        model's rows.

        `model` is accepted for exllamav2's call shape (this handle already belongs to its model). `tokenizer`
        tokenizes marker text for models whose image run holds some (the model's own tokenizer when None);
        the embedding's token ids come from the image content (`DecodedImage.content_hash`), not the
        tokenizer. A DecodedImage is neither read, checked nor hashed again.
        """
        if image is None:
            raise ValueError("get_image_embeddings needs image= (a PIL image, a file path or image bytes)")
        decoded = decode_image(image)
        picture = decoded.picture
        rows = self.embed_picture(picture, tokenizer)
        return self.wrap(rows, decoded.content_hash, picture.height, picture.width, text_alias)

    def embed_picture(self, picture: Image.Image, tokenizer: Any | None) -> torch.Tensor:
        """The rows [num_tokens, hidden] of a decoded RGB picture's whole id run."""
        raise NotImplementedError

    def wrap(self, rows: torch.Tensor, image_hash: str, height: int, width: int, text_alias: str | None) -> MMEmbedding:
        """The MMEmbedding holding `rows` of a height x width picture (a plain one by default)."""
        return MMEmbedding(rows, image_hash=image_hash, text_alias=text_alias)

    def layout_rows(self, ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Rows [num_tokens, hidden] of an image run laid out as token `ids` [num_tokens]: each image token
        takes the next of `features` [num_image_tokens, hidden], every other (marker) token its vocabulary
        embedding, which does not depend on its position."""
        ids = ids.to(self.model.device)
        is_image = ids == self.model.image_token_id
        with torch.no_grad():
            rows = self.model.embed(torch.where(is_image, torch.zeros_like(ids), ids))  # [num_tokens, hidden]
        rows[is_image] = features.reshape(-1, features.shape[-1]).to(rows.dtype)
        return rows

    # --- counting --------------------------------------------------------------------------------------

    def count_image_tokens(self, image: ImageSource) -> int:
        """How many prompt ids the image's run will take (`get_image_embeddings(image=image).num_tokens`),
        from its size alone: the pixels are not decoded and the vision tower does not run."""
        width, height = oriented_size(image)
        return self.num_image_tokens(height, width)

    def num_image_tokens(self, height: int, width: int) -> int:
        """Ids of the run of a height x width picture (after its EXIF orientation)."""
        raise NotImplementedError

    def stand_in(self, image: ImageSource, text_alias: str | None = None) -> MMEmbedding:
        """An MMEmbedding with the prompt shape `get_image_embeddings(image=image)` will have (the same class,
        number of ids and prompt text) but no rows (meta device), for counting a whole prompt's tokens with
        the tokenizer and chat template, image wrappers included, without running the vision tower.

        Its ids are not the image's (they come from the picture's size, not its content): count with it, do
        not generate with it."""
        width, height = oriented_size(image)
        dtype = next(self.model.parameters()).dtype
        rows = torch.empty(
            self.num_image_tokens(height, width), self.model.config.hidden_size, dtype=dtype, device="meta"
        )
        # One digest per size: stand-ins of one size share their alias and ids, which counts them the same.
        return self.wrap(rows, content_hash(f"stand-in:{width}x{height}".encode()), height, width, text_alias)
