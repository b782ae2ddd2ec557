"""A chat's context-overflow policy (engine.chat.overflow) applied to a remote model, whose tokenizer is not here.

    start_answer ─> RemoteFit.fit(context_length)      known context: keep_messages on counted tokens, before sending
                    server 400 "context exceeded" ─> RemoteFit.refit(error)   the count was short, or the context
                                                      unknown: one more block of old turns dropped, then sent again

Tokens are counted per message (TokenCounter) and added up with a conservative allowance for what the chat template
puts around them, so a count is at least what the server will see for ordinary text:

    prompt tokens <= FIXED_OVERHEAD + sum(message tokens + PER_MESSAGE_OVERHEAD) + IMAGE_TOKENS per image

Where the count was still short (an image larger than IMAGE_TOKENS, text the estimate underrates), or the
server never said its context, its refusal for length (app.service.remote_errors.context_exceeded) is the
measure: the refusal's stated context, when it names one, is fitted to at once; otherwise one more block of
old turns goes per refusal, at most MAX_REFITS times, and only before any text was streamed. With `stop` the
conversation goes as it is and the server's refusal is what the user sees.

Which turns survive follows keep_messages: whole blocks of old turns, so the kept prefix (and the server's
prefix cache) stays the same for several turns. `first_seen` indexes the chat's messages (the system prompt
not counted), as the local backend's answer does, so the chat draws the same "no longer seen" divider.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx2

from engine.chat.overflow import OverflowPolicy, View, keep_messages

log = logging.getLogger(__name__)

# What a chat template adds, in tokens: BOS, the reply prompt and a template's own default system prompt
# (SmolLM's and Qwen's name the model, about 20 tokens; Llama 3.1's dates, about 25) ...
FIXED_OVERHEAD = 64
# ... and each message's role markers (<|im_start|>user\n ... <|im_end|>\n: 5 in ChatML, about as many in
# Llama 3, Gemma and Mistral), with slack for tokens merged differently across a content's edges.
PER_MESSAGE_OVERHEAD = 10
# An image's tokens, which only the server's vision processor knows (LLaVA 576, Gemma 3 256, Qwen-VL by size).
IMAGE_TOKENS = 1024
# Refusals for length answered by dropping more, per answer: each is a request the server refuses before prefill.
MAX_REFITS = 6
# Message texts whose server token counts are kept (a chat's history is counted once, then only its new turns).
MAX_CACHED_COUNTS = 4096
MAX_PARALLEL_COUNTS = 8


def estimate_tokens(text: str) -> int:
    """A conservative guess at `text`'s tokens without its tokenizer: a digit each (many tokenizers split
    numbers into digits), other ASCII characters three to a token (English runs four to five, code about
    four), and anything else a token per UTF-8 byte (byte-level tokenizers' worst case)."""
    data = text.encode()
    num_ascii = len(text.encode("ascii", "ignore"))
    num_digits = sum(text.count(d) for d in "0123456789")
    return num_digits + math.ceil((num_ascii - num_digits) / 3) + (len(data) - num_ascii)


class TokenCounter:
    """Tokens of message texts on one server: from its own tokenizer where it offers one, else estimated.

    The server's tokenizer is asked through POST {root}/tokenize, in llama-server's form ({"content": text},
    answered {"tokens": [...]}) or vLLM's ({"model", "prompt": text}, answered {"count", "tokens"}); the form
    that works is found on first use and kept. Tandem's own server, `transformers serve` and most hosted
    APIs have no such endpoint (404): their texts are counted by `estimate_tokens`. `source` says which.
    """

    def __init__(self, root_url: str, make_client: Callable[[], httpx2.AsyncClient]):
        self._url = f"{root_url}/tokenize"
        self._make_client = make_client
        self._form: str | None = None  # "llama-server", "vllm" or "estimate"; None: not found out yet
        self._counts: OrderedDict[str, int] = OrderedDict()

    @property
    def source(self) -> str:
        """Where counts come from: "llama-server" or "vllm" (its /tokenize), "estimate", or "unknown" yet."""
        return self._form or "unknown"

    async def count(self, texts: Sequence[str], model: str | None) -> list[int]:
        """Tokens of each text (no BOS). A server that cannot be reached now leaves these counts estimated."""
        wanted = [t for t in dict.fromkeys(texts) if t and t not in self._counts]
        if wanted and self._form != "estimate":
            try:
                async with self._make_client() as client:
                    await self._ask(client, wanted, model)
            except httpx2.HTTPError as e:
                log.info("%s could not count tokens (%s); estimating them", self._url, e)
        return [self._counts.get(t) or estimate_tokens(t) for t in texts]

    async def _ask(self, client: httpx2.AsyncClient, texts: list[str], model: str | None) -> None:
        if self._form is None:
            self._form = await self._probe(client, texts[0], model)
            log.info("token counts for %s: %s", self._url, self._form)
            if self._form == "estimate":
                return
        limit = asyncio.Semaphore(MAX_PARALLEL_COUNTS)

        async def one(text: str) -> None:
            async with limit:
                num = await self._tokenize(client, self._form or "", text, model)
            if num is not None:
                self._remember(text, num)

        await asyncio.gather(*(one(t) for t in texts))

    async def _probe(self, client: httpx2.AsyncClient, text: str, model: str | None) -> str:
        """The form of /tokenize this server answers (llama-server's first: vLLM refuses it, 400), or "estimate"."""
        for form in ("llama-server", "vllm"):
            num = await self._tokenize(client, form, text, model)
            if num:  # a text of characters has tokens: 0 is a server that ignored the field
                self._remember(text, num)
                return form
        return "estimate"

    async def _tokenize(self, client: httpx2.AsyncClient, form: str, text: str, model: str | None) -> int | None:
        """The server's token count of `text` in `form`; None when it gave none (no such page, another form)."""
        if form == "llama-server":
            body: dict[str, Any] = {"content": text, "add_special": False}
        else:
            body = {"prompt": text, "add_special_tokens": False, **({"model": model} if model else {})}
        response = await client.post(self._url, json=body)
        if response.status_code != 200:
            return None
        try:
            data = response.json()
        except ValueError:
            return None
        tokens = data.get("tokens") if isinstance(data, dict) else None
        return len(tokens) if isinstance(tokens, list) else None

    def _remember(self, text: str, num: int) -> None:
        self._counts[text] = num
        while len(self._counts) > MAX_CACHED_COUNTS:
            self._counts.popitem(last=False)


class RemoteFit:
    """One answer's conversation fitted to the remote model's context under the chat's overflow policy.

    `messages` are the OpenAI messages to send, the system prompt first when there is one (`num_system`: 0 or
    1); `max_tokens` the answer's length the settings ask for. `view` is what is sent now; `first_seen` the
    index, in the chat's messages, of the first one the model still sees (None: all of them).
    """

    def __init__(
        self,
        messages: Sequence[Mapping[str, Any]],
        num_system: int,
        policy: OverflowPolicy,
        max_tokens: int,
        counter: TokenCounter,
        model: Callable[[], str | None],
        on_context: Callable[[int], None] | None = None,
    ):
        self._messages = tuple(messages)
        self._num_system = num_system
        self.policy = policy
        self._max_tokens = max_tokens
        self._counter = counter
        self._model = model
        self._on_context = on_context  # told the context a refusal states, where it is not the one fitted to
        self._context = 0
        self._weights: dict[int, int] = {}  # id(message) -> its tokens, counted when first needed (_count)
        self.view = View(self._messages, range(num_system, num_system))
        self._sent: tuple[int, int | None] = (len(self._messages), max_tokens)  # messages and max_tokens sent last
        self.num_refits = 0

    @property
    def first_seen(self) -> int | None:
        """Index, in the chat's messages (no system prompt), of the first one sent after dropped turns."""
        first = self.view.first_seen
        return None if first is None else first - self._num_system

    async def fit(self, context_length: int) -> dict[str, Any]:
        """The request's "messages" and "max_tokens" for a model of `context_length` tokens (0: unknown, and
        nothing is dropped until the server refuses): the policy keeps the turns that leave the answer the room
        it asks for (at most half the context, as the local engine does), and the answer is held to the room
        the kept turns leave."""
        self._context = context_length
        if self.policy is OverflowPolicy.STOP or context_length < 1:
            return {}
        await self._count()
        return self._keep(self._budget())

    async def refit(self, stated_context: int) -> dict[str, Any] | None:
        """After the server refused the request for length: the "messages" (and "max_tokens") to send instead, or
        None when the policy is stop, nothing more can go, or MAX_REFITS refusals were answered already.

        A context the refusal states (`stated_context`, 0: none) that differs from the one fitted to is fitted
        to (and told to `on_context`); where that changes nothing, the count was short and one more block of old
        turns goes."""
        if self.policy is OverflowPolicy.STOP or self.num_refits >= MAX_REFITS:
            return None
        self.num_refits += 1
        await self._count()
        sent = self._sent
        if stated_context > 0 and stated_context != self._context:
            self._context = stated_context
            if self._on_context is not None:
                self._on_context(stated_context)
            patch = self._keep(self._budget())
            if self._sent != sent:
                return patch
        # Any view smaller than the one refused is the next block of old turns dropped.
        patch = self._keep(self._tokens(self.view.messages) - 1)
        return patch if self._sent[0] < sent[0] else None

    def _budget(self) -> int:
        reserve = min(self._max_tokens, max(1, self._context // 2))
        return self._context - reserve

    def _keep(self, budget: int) -> dict[str, Any]:
        self.view = keep_messages(self._messages, self.policy, budget, self._tokens, self._weight)
        patch: dict[str, Any] = {"messages": [dict(m) for m in self.view.messages]}
        room = self._context - self._tokens(self.view.messages)
        if self._context and room >= 1:
            patch["max_tokens"] = min(self._max_tokens, room)
        self._sent = (len(self.view.messages), patch.get("max_tokens", self._sent[1]))
        if self.view.dropped:
            log.info(
                "context overflow (%s, %s tokens, counts %s): messages %d to %d left out",
                self.policy.value,
                self._context or "unknown",
                self._counter.source,
                self.view.dropped.start,
                self.view.dropped.stop - 1,
            )
        return patch

    async def _count(self) -> None:
        if self._weights:
            return
        texts = [_text_of(m) for m in self._messages]
        counts = await self._counter.count(texts, self._model())
        self._weights = {id(m): n + IMAGE_TOKENS * _num_images(m) for m, n in zip(self._messages, counts, strict=True)}

    def _weight(self, message: Mapping[str, Any]) -> int:
        return self._weights[id(message)]

    def _tokens(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return FIXED_OVERHEAD + sum(self._weight(m) + PER_MESSAGE_OVERHEAD for m in messages)


def _text_of(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return content if isinstance(content, str) else ""


def _num_images(message: Mapping[str, Any]) -> int:
    content = message.get("content")
    if not isinstance(content, list):
        return 0
    return sum(1 for p in content if isinstance(p, Mapping) and p.get("type") in ("image_url", "image"))
