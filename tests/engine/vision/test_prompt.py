"""Chat prompts with images: placeholders from the template become the images' aliases, in order."""

from __future__ import annotations

import pytest
import torch

from engine.chat_template import ChatTemplate
from engine.vision.embedding import MMEmbedding
from engine.vision.prompt import render_with_images, user_message

# A LLaVA-style template that prints image parts itself.
PARTS = (
    "{% for m in messages %}{{ m['role'] }}: "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>{% else %}{{ p['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{{ '\n' }}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def emb(tag: str) -> MMEmbedding:
    return MMEmbedding(torch.zeros(3, 8), image_hash=tag * 32)


def test_template_with_image_parts_gets_aliases_in_order():
    a, b = emb("a"), emb("b")
    text = render_with_images(ChatTemplate(PARTS), [user_message("Compare them.", 2)], [a, b])
    assert text == f"user: {a.text_alias}{b.text_alias}Compare them.\nassistant:"


def test_string_only_template_gets_placeholders_before_the_text():
    a = emb("a")
    text = render_with_images(ChatTemplate(None), [user_message("Describe this image.", 1)], [a])  # ChatML
    assert f"{a.text_alias}\nDescribe this image." in text
    assert "<image>" not in text


def test_earlier_turns_keep_their_images():
    a, b = emb("a"), emb("b")
    messages = [user_message("first", 1), {"role": "assistant", "content": "ok"}, user_message("second", 1)]
    text = render_with_images(ChatTemplate(PARTS), messages, [a, b])
    assert text.index(a.text_alias) < text.index("first") < text.index(b.text_alias) < text.index("second")


def test_count_mismatch_and_typed_placeholder_are_refused():
    with pytest.raises(ValueError, match="2 image parts but 1"):
        render_with_images(ChatTemplate(PARTS), [user_message("x", 2)], [emb("a")])
    with pytest.raises(ValueError, match="contains the image placeholder"):
        render_with_images(ChatTemplate(PARTS), [user_message("what is <image>?", 1)], [emb("a")])


def test_text_only_messages_render_unchanged():
    messages = [{"role": "user", "content": "hi"}]
    assert render_with_images(ChatTemplate(PARTS), messages, []) == ChatTemplate(PARTS).render(messages)
