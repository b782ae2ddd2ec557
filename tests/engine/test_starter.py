"""The starter model (SmolLM2-135M-Instruct Q4_1 GGUF): our greedy chat completions equal transformers'."""

from __future__ import annotations

import pytest
import torch

from engine.cache import Cache
from engine.chat_template import ChatTemplate
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.loading.starter import STARTER_SHA256, _sha256, fetch_starter
from engine.models import Model

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
]


@pytest.fixture(scope="module")
def ours(starter_gguf):
    return Model.load(starter_gguf, dtype=torch.float32)


@pytest.fixture(scope="module")
def theirs(starter_hf_tokenizer, starter_hf_model):
    return starter_hf_tokenizer, starter_hf_model


def test_fetch_is_idempotent_and_verified(starter_gguf):
    assert fetch_starter() == starter_gguf
    assert _sha256(starter_gguf) == STARTER_SHA256


def test_greedy_chat_completions_equal_transformers(ours, theirs):
    hf_tok, hf_model = theirs
    template = ChatTemplate.from_tokenizer(ours.tokenizer)
    gen = DynamicGenerator(ours, Cache(ours, max_seq_len=1024, page_size=256), ours.tokenizer)
    jobs = []
    for i, prompt in enumerate(PROMPTS):
        text = template.render([{"role": "user", "content": prompt}], add_generation_prompt=True)
        ids = ours.tokenizer.encode(text, encode_special_tokens=True)
        hf_ids = hf_tok(text, return_tensors="pt", add_special_tokens=False).input_ids
        assert ids.tolist() == hf_ids.tolist()
        jobs.append(DynamicJob(ids, 48, gen_settings=SamplerSettings.greedy(), identifier=i))
    gen.enqueue(jobs)
    tokens = {i: [] for i in range(len(PROMPTS))}
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if "token_ids" in r:
                tokens[r["identifier"]] += r["token_ids"][0].tolist()
    for job in jobs:
        with torch.no_grad():
            prompt = torch.tensor([job.prompt_ids])
            # The pad id is <|im_end|>, which the template itself uses: an explicit mask stops generate()
            # from inferring one that hides those tokens.
            ref = hf_model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=48,
                min_new_tokens=48,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=hf_tok.pad_token_id,
            )[0, prompt.shape[1] :].tolist()
        assert tokens[job.identifier] == ref, f"prompt {job.identifier}: {hf_tok.decode(ref)!r}"
