"""A job's result dicts -> what a reply needs: text pieces, token log-probabilities, finish reason, usage.

Log-probabilities are the model's own (log-softmax of its logits for that position), as OpenAI and vLLM
report them, not the sampler's final distribution, which for greedy decoding is 1 for the chosen token
and 0 for every other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.generator.dynamic_async import DynamicJobAsync
from engine.tools.calls import CallDelta
from engine.tools.stream import ToolCallParser


@dataclass(frozen=True)
class TokenLogprob:
    text: str
    data: bytes
    logprob: float
    top: tuple[tuple[str, bytes, float], ...] = ()


@dataclass
class Piece:
    """New text of one result; `final` is the eos result (usage, finish reason) on the last piece. For a job
    that tells reasoning apart, `text` is the answer's part and `reasoning` the thinking's; for one that may call
    tools, `text` is the answer's content and `tool_calls` the calls it added to."""

    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    final: dict[str, Any] | None = None
    reasoning: str = ""
    tool_calls: list[CallDelta] = field(default_factory=list)


async def pieces(
    job: DynamicJobAsync, tokenizer: Any, top_logprobs: int, want_logprobs: bool, tools: ToolCallParser | None = None
) -> AsyncIterator[Piece]:
    """The job's output as pieces, ending with the eos result; `tools` reads calls out of the answer. Leaving
    early cancels the job (its `async for`)."""
    async for result in job:
        if result["stage"] != "streaming":
            continue
        entries = _logprobs(result, tokenizer, top_logprobs) if want_logprobs else []
        final = result if result["eos"] else None
        split = "reasoning" in result
        text = result["answer"] if split else result.get("text", "")
        calls: list[CallDelta] = []
        if tools is not None:
            delta = tools.read_result(result)
            text, calls = delta.content, delta.calls
        yield Piece(text, entries, final, result["reasoning"] if split else "", calls)


def _logprobs(result: dict[str, Any], tokenizer: Any, top: int) -> list[TokenLogprob]:
    ids = result["token_ids"][0].tolist()
    logits = result.get("logits")
    if logits is None or not ids:
        return []
    if result["eos"] and result.get("eos_reason") == "stop_token":
        ids = ids[:-1]  # the end token is not part of the answer
    vocab = tokenizer.vocab_size
    # [n, vocab] over the tokenizer's ids only: an output head may be padded past the vocabulary.
    logprobs = torch.log_softmax(logits[0, : len(ids), :vocab].float(), dim=-1)
    best = logprobs.topk(top, dim=-1) if top else None
    out = []
    for i, token_id in enumerate(ids):
        alternatives = ()
        if best is not None:
            alternatives = tuple(
                (*_token(tokenizer, t), float(lp))
                for t, lp in zip(best.indices[i].tolist(), best.values[i].tolist(), strict=True)
            )
        out.append(TokenLogprob(*_token(tokenizer, token_id), float(logprobs[i, token_id]), alternatives))
    return out


def _token(tokenizer: Any, token_id: int) -> tuple[str, bytes]:
    data = tokenizer.token_bytes[token_id]
    return data.decode("utf-8", errors="replace"), data


def finish_reason(result: dict[str, Any], called: bool = False) -> str:
    """The reply's finish reason: length when the token limit cut it off, else tool_calls when it `called`."""
    if result.get("eos_reason") == "max_new_tokens":
        return "length"
    return "tool_calls" if called else "stop"


def usage(result: dict[str, Any]) -> dict[str, Any]:
    prompt, completion = result["prompt_tokens"], result["new_tokens"]
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        # Prompt tokens whose keys and values came from the prefix cache instead of being computed.
        "prompt_tokens_details": {"cached_tokens": result["cached_tokens"]},
    }
