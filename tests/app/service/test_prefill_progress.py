"""EngineAnswer keeps the engine's prefill progress while a long prompt is read in chunks, for the chat to show
"Reading the conversation: read / total tokens" instead of "…"; the chunks themselves stay streaming ones."""

from __future__ import annotations

import asyncio

from app.service.engine_answer import EngineAnswer
from engine import Cache, DynamicJobAsync, Model, SamplerSettings
from engine.generator.dynamic_async import DynamicGeneratorAsync


def test_a_prompt_read_in_chunks_leaves_its_progress_on_the_answer(tiny_folder):
    model = Model.load(tiny_folder)
    prompt = model.tokenizer.encode("apples and pears " * 20)  # ~100 tokens, read 16 at a time
    num_prompt = int(prompt.shape[-1])
    seen: list[tuple[int, int] | None] = []

    async def go():
        generator = DynamicGeneratorAsync(model, Cache(model, 512, page_size=16), model.tokenizer, max_chunk_size=16)
        try:
            job = DynamicJobAsync(generator, input_ids=prompt, max_new_tokens=3, gen_settings=SamplerSettings.greedy())
            answer = EngineAnswer(job)
            assert answer.prefill is None
            chunks = []
            async for chunk in answer:
                seen.append(answer.prefill)
                chunks.append(chunk)
            return chunks
        finally:
            await generator.close()

    chunks = asyncio.run(go())
    assert all(c["stage"] == "streaming" for c in chunks) and chunks[-1]["eos"]
    read, total = seen[0]
    assert total == num_prompt and 16 <= read < num_prompt and read % 16 == 0
