"""Chat prompts with images: the template writes its image placeholder, each placeholder becomes an alias.

A user message with images is `{"role": "user", "content": [{"type": "image"}, ..., {"type": "text",
"text": ...}]}`, the shape Hugging Face chat templates expect. The template renders each image part as
the model's placeholder (LLaVA: "<image>"); `render_with_images` swaps the placeholders, in order, for
the images' text aliases, which `tokenizer.encode(text, embeddings=...)` turns into their id runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.chat_template import ChatTemplate

DEFAULT_PLACEHOLDER = "<image>"


def user_message(text: str, num_images: int) -> dict[str, Any]:
    """A user message holding `num_images` images (first, as most VLM prompts put them) and `text`."""
    if num_images == 0:
        return {"role": "user", "content": text}
    parts: list[dict[str, Any]] = [{"type": "image"} for _ in range(num_images)]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def count_images(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(
        1
        for m in messages
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if isinstance(part, Mapping) and part.get("type") == "image"
    )


def _flattened(messages: Sequence[Mapping[str, Any]], placeholder: str) -> list[dict[str, Any]]:
    """Messages with list content turned into strings ("<image>\\n" per image, then the text), for
    templates that only print string content."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            text = "".join(
                placeholder + "\n" if part.get("type") == "image" else str(part.get("text", ""))
                for part in content
                if isinstance(part, Mapping)
            )
            m = {**m, "content": text}
        out.append(dict(m))
    return out


def render_with_images(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    images: Sequence[Any],
    placeholder: str = DEFAULT_PLACEHOLDER,
    add_generation_prompt: bool = True,
    **template_options: Any,
) -> str:
    """Render `messages` and put the i-th image's `text_alias` where the template wrote the i-th placeholder.

    `images` are MMEmbeddings in the order their image parts appear in `messages`. Raises ValueError when
    the counts disagree or the text already holds the placeholder (a user typing "<image>" must not be
    able to claim an image slot).
    """
    wanted = count_images(messages)
    if wanted != len(images):
        raise ValueError(f"the messages hold {wanted} image parts but {len(images)} image embeddings were given")
    if wanted == 0:
        return template.render(messages, add_generation_prompt=add_generation_prompt, **template_options)
    for m in messages:
        content = m.get("content")
        texts = (
            [content]
            if isinstance(content, str)
            else [p.get("text", "") for p in content or [] if p.get("type") == "text"]
        )
        if any(placeholder in str(t) for t in texts):
            raise ValueError(
                f"a message's text contains the image placeholder {placeholder!r}; remove it from the text "
                "(images are attached as image parts, not typed)"
            )
    text = template.render(messages, add_generation_prompt=add_generation_prompt, **template_options)
    if text.count(placeholder) != wanted:
        # The template ignores image parts (most text-model templates print only string content).
        flat = _flattened(messages, placeholder)
        text = template.render(flat, add_generation_prompt=add_generation_prompt, **template_options)
    if text.count(placeholder) != wanted:
        raise ValueError(
            f"the chat template wrote {text.count(placeholder)} image placeholders {placeholder!r} for {wanted} "
            "images; this model's template does not place images, so it cannot take them"
        )
    pieces = text.split(placeholder)
    # An image may stand for more text than its alias (Gemma 3 puts it between blank lines): its `prompt_text`.
    texts = [getattr(image, "prompt_text", image.text_alias) for image in images]
    return pieces[0] + "".join(t + piece for t, piece in zip(texts, pieces[1:]))
