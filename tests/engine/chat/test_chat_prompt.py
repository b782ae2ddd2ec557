"""engine.chat.prompt.encode_chat: the template's text as special tokens, BOS only where wanted and missing."""

from __future__ import annotations

from engine.chat.prompt import encode_chat
from engine.chat_template import ChatTemplate
from engine.tokenizer.tokenizer import Tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


def test_the_rendered_template_becomes_special_tokens(tiny_folder):
    tokenizer = Tokenizer.load(tiny_folder)
    template = ChatTemplate.from_tokenizer(tokenizer)
    ids = encode_chat(tokenizer, template, MESSAGES)[0].tolist()
    text = template.render(MESSAGES, add_generation_prompt=True)
    assert ids == tokenizer.encode(text, encode_special_tokens=True)[0].tolist()
    assert tokenizer.piece_to_id("<|im_start|>") in ids


def test_bos_is_added_only_where_the_tokenizer_wants_it_and_the_text_lacks_it(tiny_folder):
    tokenizer = Tokenizer.load(tiny_folder)
    tokenizer.add_bos_token = True
    tokenizer.bos_token_id = tokenizer.piece_to_id("<|endoftext|>")
    chatml = ChatTemplate.from_tokenizer(tokenizer)  # starts with <|im_start|>, not BOS
    ids = encode_chat(tokenizer, chatml, MESSAGES)[0].tolist()
    assert ids[0] == tokenizer.bos_token_id and ids[1] == tokenizer.piece_to_id("<|im_start|>")

    writes_bos = ChatTemplate("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}", "<|endoftext|>")
    ids = encode_chat(tokenizer, writes_bos, MESSAGES)[0].tolist()
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id

    tokenizer.add_bos_token = False
    assert encode_chat(tokenizer, chatml, MESSAGES)[0, 0].item() == tokenizer.piece_to_id("<|im_start|>")
