"""Request bodies -> checked job settings: every field read once, every bad or unknown field a 400 naming it.

Defaults are OpenAI's (temperature 1, top_p 1, no top-k, no penalties), not the engine's sampler defaults:
an API client that sends only `messages` expects what OpenAI would do with them. temperature 0 is greedy,
exactly as `python -m engine generate --greedy`. Extensions that vLLM's server also takes: top_k, min_p,
repetition_penalty, min_tokens. `reasoning_effort` (OpenAI's, for reasoning models) becomes the chat template
variable of that name, which gpt-oss's template writes into its system message. `tools`, `tool_choice` and
`parallel_tool_calls` are read by engine.tools.schema, whose errors name the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.generator.filters import Filter, JSONFilter
from engine.generator.sampler import SamplerSettings
from engine.reasoning import REASONING_EFFORTS
from engine.server.errors import bad_request
from engine.tools.schema import Tool, ToolChoice, ToolError, read_tool_choice, read_tools

MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20

# Fields clients send that change nothing here; anything else unknown is refused, so a misspelt
# parameter is never silently ignored.
_IGNORED = {"user", "metadata", "store", "service_tier"}


@dataclass(frozen=True)
class Generation:
    """What one request asks of its job."""

    model: str
    settings: SamplerSettings
    max_tokens: int | None  # None: as many as the context leaves after the prompt
    min_tokens: int
    stop: tuple[str, ...]
    seed: int | None
    filters: tuple[Filter, ...]
    logprobs: bool
    top_logprobs: int
    stream: bool
    include_usage: bool
    decode_special_tokens: bool = False  # set for a tool-call syntax made of special tokens


@dataclass(frozen=True)
class ChatRequest:
    generation: Generation
    messages: list[Any]  # as sent; engine.server.messages reads them
    # chat_template_kwargs (e.g. enable_thinking) and reasoning_effort
    template_options: dict[str, Any] = field(default_factory=dict)
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = ToolChoice("none")
    parallel_tool_calls: bool = True


@dataclass(frozen=True)
class CompletionRequest:
    generation: Generation
    prompt: str | list[int]


class _Fields:
    """Reads a JSON object field by field; `done()` refuses whatever was not read."""

    def __init__(self, body: Any):
        if not isinstance(body, Mapping):
            raise bad_request(f"The request body must be a JSON object, got {type(body).__name__}.")
        self.body = body
        self.read: set[str] = set()

    def get(self, name: str) -> Any:
        self.read.add(name)
        return self.body.get(name)  # an explicit null counts as absent, as in OpenAI's API

    def number(self, name: str, default: float, lo: float, hi: float) -> float:
        value = self.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
            raise bad_request(f"{name} must be a number from {lo} to {hi}, got {value!r}.", name)
        return float(value)

    def integer(self, name: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
        value = self.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            upto = f" to {hi}" if hi is not None else " or more"
            raise bad_request(f"{name} must be an integer from {lo}{upto}, got {value!r}.", name)
        return value

    def flag(self, name: str, default: bool = False) -> bool:
        value = self.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise bad_request(f"{name} must be true or false, got {value!r}.", name)
        return value

    def done(self) -> None:
        unknown = sorted(set(self.body) - self.read - _IGNORED)
        if unknown:
            raise bad_request(f"Unrecognized request argument supplied: {', '.join(unknown)}.", unknown[0])


def chat_request(body: Any) -> ChatRequest:
    f = _Fields(body)
    messages = f.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list of {role, content} objects.", "messages")
    logprobs = f.flag("logprobs")
    top = f.integer("top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if top and not logprobs:
        raise bad_request("top_logprobs needs logprobs set to true.", "top_logprobs")
    max_tokens = f.integer("max_tokens", None, 1)
    max_completion = f.integer("max_completion_tokens", None, 1)
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise bad_request(
            f"max_tokens ({max_tokens}) and max_completion_tokens ({max_completion}) disagree; send one of them.",
            "max_completion_tokens",
        )
    tools, choice = _tools(f)
    parallel = f.flag("parallel_tool_calls", True)
    generation = _generation(f, max_completion if max_completion is not None else max_tokens, logprobs, top)
    options = _template_options(f.get("chat_template_kwargs"))
    effort = _reasoning_effort(f.get("reasoning_effort"), options)
    if effort is not None:
        options["reasoning_effort"] = effort
    f.done()
    return ChatRequest(generation, messages, options, tools, choice, parallel)


def completion_request(body: Any) -> CompletionRequest:
    f = _Fields(body)
    prompt = f.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    is_ids = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if not (isinstance(prompt, str) or is_ids) or not prompt:
        raise bad_request(
            "prompt must be a non-empty string or list of token ids (one prompt per request; send several "
            "requests at once for several prompts, they run side by side).",
            "prompt",
        )
    top = f.integer("logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if f.flag("echo"):
        raise bad_request("echo is not supported; the prompt is not returned with the completion.", "echo")
    if f.get("suffix") is not None:
        raise bad_request("suffix (insertion) is not supported; send the text before the gap as the prompt.", "suffix")
    if f.integer("best_of", 1, 1) != 1:
        raise bad_request("best_of must be 1; send several requests to compare completions.", "best_of")
    generation = _generation(f, f.integer("max_tokens", 16, 1), logprobs=top > 0, top_logprobs=top)
    f.done()
    return CompletionRequest(generation, prompt)


def _tools(f: _Fields) -> tuple[tuple[Tool, ...], ToolChoice]:
    if f.get("functions") is not None or f.get("function_call") is not None:
        raise bad_request(
            "functions and function_call are OpenAI's retired names; send tools and tool_choice instead.", "functions"
        )
    try:
        tools = read_tools(f.get("tools"))
        return tools, read_tool_choice(f.get("tool_choice"), tools)
    except ToolError as e:
        raise bad_request(str(e), e.param) from None


def _generation(f: _Fields, max_tokens: int | None, logprobs: bool, top_logprobs: int) -> Generation:
    model = f.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model must name the served model (GET /v1/models lists it).", "model")
    if f.integer("n", 1, 1) != 1:
        raise bad_request("n must be 1; send several requests for several answers (they run side by side).", "n")
    stream = f.flag("stream")
    include_usage = _stream_options(f.get("stream_options"), stream)
    return Generation(
        model=model,
        settings=_sampler(f),
        max_tokens=max_tokens,
        min_tokens=f.integer("min_tokens", 0, 0),
        stop=_stop(f.get("stop")),
        seed=_seed(f.get("seed")),
        filters=_response_format(f.get("response_format")),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        stream=stream,
        include_usage=include_usage,
    )


def _sampler(f: _Fields) -> SamplerSettings:
    temperature = f.number("temperature", 1.0, 0.0, 2.0)
    top_p = f.number("top_p", 1.0, 0.0, 1.0)
    top_k = f.get("top_k")
    if top_k == -1:
        top_k = 0  # vLLM's "no top-k"
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise bad_request(f"top_k must be an integer >= 0 (0 or -1: off), got {top_k!r}.", "top_k")
    min_p = f.number("min_p", 0.0, 0.0, 1.0)
    penalties = {
        "token_repetition_penalty": f.number("repetition_penalty", 1.0, 0.01, 10.0),
        "token_presence_penalty": f.number("presence_penalty", 0.0, -2.0, 2.0),
        "token_frequency_penalty": f.number("frequency_penalty", 0.0, -2.0, 2.0),
        "token_bias": _logit_bias(f.get("logit_bias")),
    }
    if temperature == 0.0:
        return SamplerSettings.greedy(**penalties)
    return SamplerSettings(temperature=temperature, top_p=top_p, top_k=top_k or 0, min_p=min_p, **penalties)


def _logit_bias(value: Any) -> dict[int, float] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad_request('logit_bias must map token ids to biases, e.g. {"50256": -100}.', "logit_bias")
    bias = {}
    for key, b in value.items():
        try:
            token_id = int(key)
        except (TypeError, ValueError):
            raise bad_request(f"logit_bias keys must be token ids, got {key!r}.", "logit_bias") from None
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100 <= b <= 100:
            raise bad_request(f"logit_bias values must be numbers from -100 to 100, got {b!r}.", "logit_bias")
        bias[token_id] = float(b)
    return bias or None


def _template_options(value: Any) -> dict[str, Any]:
    """chat_template_kwargs (as vLLM takes them): variables for the chat template, e.g. {"enable_thinking":
    false}. Names must be identifiers and values plain JSON scalars; they cannot replace the messages."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise bad_request("chat_template_kwargs must be an object of template variables.", "chat_template_kwargs")
    reserved = {"messages", "tools", "documents", "add_generation_prompt"}
    for name, item in value.items():
        if not name.isidentifier() or name in reserved or name.startswith("_"):
            raise bad_request(f"chat_template_kwargs cannot set {name!r}.", "chat_template_kwargs")
        if item is not None and not isinstance(item, (bool, int, float, str)):
            raise bad_request(
                f"chat_template_kwargs.{name} must be a string, number, boolean or null.", "chat_template_kwargs"
            )
    return dict(value)


def _reasoning_effort(value: Any, options: dict[str, Any]) -> str | None:
    """reasoning_effort (how long a reasoning model thinks), one of REASONING_EFFORTS; chat_template_kwargs may
    set the same variable, but not to another value."""
    if value is None:
        return None
    if value not in REASONING_EFFORTS:
        raise bad_request(
            f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {value!r}.", "reasoning_effort"
        )
    if options.get("reasoning_effort", value) != value:
        raise bad_request(
            f"reasoning_effort ({value!r}) and chat_template_kwargs.reasoning_effort "
            f"({options['reasoning_effort']!r}) disagree; send one of them.",
            "reasoning_effort",
        )
    return value


def _stream_options(value: Any, stream: bool) -> bool:
    if value is None:
        return False
    if not stream:
        raise bad_request("stream_options is only allowed when stream is true.", "stream_options")
    if not isinstance(value, Mapping) or set(value) - {"include_usage", "continuous_usage_stats"}:
        raise bad_request('stream_options must be {"include_usage": true|false}.', "stream_options")
    include = value.get("include_usage", False)
    if not isinstance(include, bool):
        raise bad_request("stream_options.include_usage must be true or false.", "stream_options")
    return include


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("stop must be a string or a list of strings.", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(f"stop holds {len(stops)} strings; at most {MAX_STOP_STRINGS} are allowed.", "stop")
    return tuple(s for s in stops if s)


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**64:
        raise bad_request(f"seed must be an integer, got {value!r}.", "seed")
    return value % 2**64  # OpenAI takes any int64; the engine's seeds are unsigned


def _response_format(value: Any) -> tuple[Filter, ...]:
    if value is None:
        return ()
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind == "text":
        return ()
    if kind == "json_object":
        return (JSONFilter({"type": "object"}),)
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise bad_request(
                'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}.', "response_format"
            )
        try:
            return (JSONFilter(schema),)
        except ValueError as e:
            raise bad_request(f"response_format: {e}", "response_format") from None
    raise bad_request(
        f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}.", "response_format"
    )
