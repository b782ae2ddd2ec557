"""Chat messages (and their images) -> the prompt ids a chat model answers: the one home of that step.

The front door (engine.chat.door), the command line and the bench build every chat prompt here, so the same
conversation gives the same ids wherever it comes from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from engine.chat_template import ChatTemplate
from engine.vision.prompt import DEFAULT_PLACEHOLDER, render_with_images


def encode_chat(
    tokenizer: Any,
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    images: Sequence[Any] = (),
    image_placeholder: str | None = None,
    **template_options: Any,
) -> torch.Tensor:
    """Token ids [1, n] of `messages` in the chat template, ending with the prompt for the assistant's reply.

    `messages` are {"role", "content"} dicts; a user message may hold images as content parts ({"type":
    "image"}, see engine.vision.prompt.user_message) and `images` are their MMEmbeddings in the order the
    parts appear, each becoming its run of image token ids. `image_placeholder` is what the template writes
    for an image (the vision handle's `image_placeholder`; "<image>" when None). Special-token text in the
    rendered template becomes special tokens. Raises ChatTemplateError when the template rejects the
    conversation, ValueError when images and image parts disagree. `template_options` become template
    variables (enable_thinking=False switches a Qwen3-style model's thinking off).
    """
    images = list(images)
    placeholder = image_placeholder or DEFAULT_PLACEHOLDER
    text = render_with_images(template, messages, images, placeholder=placeholder, **template_options)
    # Templates usually write BOS themselves; add it only where the model wants it and the text lacks it.
    bos = tokenizer.bos_token
    add_bos = bool(tokenizer.add_bos_token) and not (bos and text.startswith(bos))
    return tokenizer.encode(text, add_bos=add_bos, encode_special_tokens=True, embeddings=images or None)
