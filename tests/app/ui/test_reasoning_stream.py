"""A reasoning answer streamed into the real chat tab shows the engine's split, chunk by chunk: thinking in the
Thinking block, the answer in the body, and the app never splits the whole text again while it streams.

The model is a tiny Qwen3 (R1-style template: the prompt opens the <think> block) whose weights are set so
that greedy decoding writes a fixed script: each layer adds nothing to the residual stream (o_proj and
down_proj are zero), so the logits depend on the newest token alone, and lm_head maps each script token's
normalised embedding to the next token of the script.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import app.service.reasoning as reasoning
from app.service import EngineService
from app.ui.message_view import MessageWidget

THINKING = "The user wants three colours"
ANSWER = "Red green and blue."
SCRIPT = THINKING + "</think>" + ANSWER


def build_scripted_qwen3(folder, reasoning_models) -> None:
    tokenizer = reasoning_models.tag_tokenizer(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = reasoning_models.R1_STYLE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    prompt_end = tokenizer.encode("<think>\n")[0].tolist()[-1]  # the last token of every R1-style prompt
    script = [prompt_end, *tokenizer.encode(SCRIPT)[0].tolist(), *sorted(tokenizer.eos_token_ids)[:1]]
    assert len(set(script)) == len(script), "each script token must lead to one next token"
    cfg = transformers.Qwen3Config(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    hf = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = hf.model.embed_tokens.weight
        normed = embed / embed.pow(2).mean(-1, keepdim=True).sqrt()  # what the final RMSNorm makes of them
        head = torch.zeros_like(hf.lm_head.weight)  # [vocab, hidden]
        for token, after in zip(script, script[1:]):
            head[after] += normed[token]
        hf.lm_head.weight.copy_(head)
    hf.save_pretrained(folder)


@pytest.fixture
def scripted_service(tmp_path, reasoning_models, run):
    folder = tmp_path / "scripted"
    folder.mkdir()
    build_scripted_qwen3(folder, reasoning_models)
    service = EngineService(dtype=torch.float32)

    async def load():
        service.load_model(folder, "scripted-r1")
        return await service.wait_loaded()

    assert run(load())
    yield service
    run(service.close())


def test_the_chat_shows_the_engines_split_without_splitting_per_chunk(
    scripted_service, app_store, run, ui, monkeypatch
):
    calls: list[str] = []  # every whole-text split the app makes (app.service.reasoning.split, answer_only)
    split_reasoning = reasoning.split_reasoning
    monkeypatch.setattr(reasoning, "split_reasoning", lambda text, *a: calls.append(text) or split_reasoning(text, *a))
    window = ui.open_window(app_store, scripted_service)
    try:
        tab = window.current_tab()
        tab.set_settings(ui.greedy_settings(scripted_service, 40, allow_eos=True))
        shown: list[tuple[str, str, int]] = []  # (thinking, answer, splits so far) as each chunk arrives

        def on_chunk(_text: str) -> None:
            # the split the widget holds, not its label: a loaded machine coalesces renders past the thinking
            widget = tab.message_widgets()[-1]
            shown.append((widget.thinking_text, widget.answer_text, len(calls)))

        tab.answer.chunk_received.connect(on_chunk)
        tab.input.setPlainText("Colours?")

        async def send():
            assert tab.send()
            await ui.wait_idle(window)

        run(send())
        answer = app_store.messages(tab.chat_id)[-1]
        assert answer.role == "assistant" and answer.complete and answer.text == SCRIPT
        assert answer.stats["reasoning"] == {"start": "<think>", "end": "</think>", "inside": True}
        assert answer.stats["eos_reason"] == "stop_token" and answer.stats["thinking_seconds"] >= 0
        # Streamed: the chunks came split, so the window split no text while they came.
        assert len(shown) >= 10 and all(splits == 0 for _, _, splits in shown)
        assert not any("think>" in thinking + said for thinking, said, _ in shown)
        assert any(thinking and not said for thinking, said, _ in shown)  # thinking shown before the answer
        widget = tab.message_widgets()[-1]
        assert widget.thinking.text.text() == THINKING and widget.answer_text == ANSWER
        assert widget.thinking.toggle.text().startswith("▸ Thought for")
        assert ANSWER in widget.body.toPlainText() and "think" not in widget.body.toPlainText()

        # A stored answer is split once when it is shown again.
        before = len(calls)
        reopened = MessageWidget(answer.id, "assistant", answer.text, stats=answer.stats)
        assert len(calls) == before + 1
        assert reopened.thinking.text.text() == THINKING and reopened.answer_text == ANSWER
        reopened.deleteLater()
    finally:
        run(ui.close_window(window))
