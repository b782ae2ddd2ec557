"""RemoteBackend: a model served by a remote OpenAI-compatible server (vLLM, llama.cpp's llama-server,
`transformers serve`, another Tandem's `python -m engine serve`), used like the local engine.

The chat sends {"role", "content"} messages and its settings; this module turns them into one streamed
/chat/completions request (images as data: URLs), its old turns left out as the chat's overflow policy says
when it is longer than the model's context (app.service.remote_overflow), and reads the reply as the
engine's result dicts (app.service.remote_stream). Nothing here imports Qt: it runs on whatever asyncio loop calls it (qasync's
in the app). What goes wrong on the way or at the server is a RemoteError raised from the job, with a message
for the user (app.service.remote_errors); a conversation that cannot be sent as it is, a ValueError at once.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import httpx2
from PIL import Image

from app.service.generation import DEFAULT_OVERFLOW
from app.service.images import ImageSource, read_image
from app.service.remote_errors import (
    RemoteBadReply,
    RemoteError,
    RemoteNotFound,
    RemoteRefused,
    not_openai,
    status_error,
    transport_error,
)
from app.service.remote_overflow import RemoteFit, TokenCounter
from app.service.remote_stream import RemoteJob
from app.service.tool_request import ToolRequest
from engine.chat.overflow import OverflowPolicy
from engine.vision.prompt import count_images

if TYPE_CHECKING:
    from app.service.generation import GenerationSettings

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 120.0  # seconds to connect, and between two pieces of a reply (a long prompt's prefill)

# Fields not every server takes: sampler fields beyond OpenAI's that vLLM, SGLang and our own server take
# (llama-server names the penalty repeat_penalty), template variables, and reasoning_effort (OpenAI's own, which
# its non-reasoning models refuse). Sent only when they change something; dropped for a server that refuses them.
OPTIONAL_FIELDS = ("top_k", "min_p", "repetition_penalty", "repeat_penalty", "chat_template_kwargs", "reasoning_effort")


class RemoteBackend:
    """One model on a remote OpenAI-compatible server.

    `base_url` is the API's root, usually ending in /v1 (http://host:8000/v1); `api_key` is sent as a bearer
    token; `model` is the served model's id (None: the first one GET /models lists, see `list_models`);
    `sees_images` is the user's word that the model reads images (the API cannot tell); `timeout` bounds
    connecting and each wait for the next piece of a reply, in seconds.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        model: str | None = None,
        sees_images: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
    ):
        url = base_url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"The server URL must start with http:// or https://, got {base_url!r}.")
        if timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}.")
        self.base_url = url
        self.api_key = api_key or None
        self.model = model or None
        self.sees_images = sees_images
        self.timeout = float(timeout)
        self._context_length = 0
        self._penalty_field = "repetition_penalty"
        self._optional_refused = False
        self._listed = False  # GET /models has answered (see _ensure_listed)
        self._counter = TokenCounter(self.base_url.removesuffix("/v1"), self._client)

    # --- what the app asks of any backend ------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.model or self.base_url

    @property
    def is_loaded(self) -> bool:
        """A model is chosen (given, or the first the server listed); the server is not asked again."""
        return self.model is not None

    @property
    def context_length(self) -> int:
        """The model's context in tokens when the server told it (vLLM's max_model_len, llama-server's
        n_ctx, or the context a refusal for length stated), else 0: unknown."""
        return self._context_length

    @property
    def can_see_images(self) -> bool:
        return self.sees_images

    @property
    def images_off_reason(self) -> str | None:
        return None  # a server says only whether it takes images

    def count_tokens(
        self,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str = "",
        *,
        image_sources: Sequence[ImageSource] | None = None,
    ) -> None:
        """Unknown: the server's tokenizer is not here (OpenAI's API has no count endpoint)."""
        return None

    # --- models --------------------------------------------------------------------------------------------

    async def list_models(self) -> list[str]:
        """The model ids GET {base_url}/models lists; `model` becomes the first when none was chosen, and the
        model's context length is read where the listing (or llama-server's /props) gives it."""
        url = f"{self.base_url}/models"
        async with self._client() as client:
            try:
                response = await client.get(url)
            except httpx2.TransportError as e:
                raise transport_error(e, self.base_url, self.timeout, 0) from None
            if response.status_code >= 400:
                raise status_error(response.status_code, response.content, url, None)
            cards = _model_cards(url, response)
            ids = [card["id"] for card in cards]
            if not ids:
                raise RemoteError(f"The server at {self.base_url} lists no models. Load a model on the server first.")
            if self.model is None:
                self.model = ids[0]
            card = next((c for c in cards if c["id"] == self.model), {})
            if any(c.get("owned_by") == "llamacpp" for c in cards):
                self._penalty_field = "repeat_penalty"
            self._context_length = _context_of(card) or await self._props_context(client)
        self._listed = True
        return ids

    async def _props_context(self, client: httpx2.AsyncClient) -> int:
        """llama-server's n_ctx from its /props (beside /v1); 0 where there is no such page."""
        root = self.base_url.removesuffix("/v1")
        try:
            response = await client.get(f"{root}/props")
            settings = response.json().get("default_generation_settings", {}) if response.status_code == 200 else {}
            return _positive_int(settings.get("n_ctx"))
        except (httpx2.HTTPError, ValueError, AttributeError):
            return 0  # best effort: an unknown context is allowed

    # --- answers -------------------------------------------------------------------------------------------

    async def start_answer(
        self,
        messages: Sequence[Mapping[str, Any]],
        system_prompt: str,
        images: Sequence[ImageSource],
        settings: GenerationSettings,
        identifier: object = None,
        tools: ToolRequest | None = None,
    ) -> RemoteJob:
        """Send the conversation and start streaming its answer; `async for result in job` reads it.

        `messages` are {"role", "content"} dicts; a user message's content may be a list of parts holding
        {"type": "image"}, and `images` are those images' files (or bytes) in the order the parts appear.
        `settings` is a GenerationSettings (sampler fields, seed, max_new_tokens, json_mode, overflow). Raises
        ValueError at once when images go to a model the user has not marked as seeing images, or an image
        cannot be read; what the server says (no server, no such model, ...) is a RemoteError raised from the
        job. The first answer lists the server's models (see list_models) unless that was done already.

        Past the model's context the chat's overflow policy leaves old turns out (app.service.remote_overflow):
        this returns once they are chosen, and the job's `first_seen` says which message the model's view
        resumes at (None: it sees them all), as the local engine's answer does.

        `tools` go as the API's `tools`, `tool_choice` and `parallel_tool_calls`; the calls streamed back come on
        the last chunk's "tool_calls", and messages may carry assistant `tool_calls` and tool results.
        """
        if images and not self.sees_images:
            raise ValueError(
                f"'{self.name}' is not marked as seeing images, so the images cannot be sent. If the model reads "
                "images (a vision-language model), tick 'sees images' for this endpoint; otherwise remove them."
            )
        _count_image_parts(messages, len(images))
        policy = OverflowPolicy.parse(settings.overflow or DEFAULT_OVERFLOW)
        wire = _wire_messages(messages, system_prompt, await asyncio.to_thread(_data_urls, list(images)))
        num_system = len(wire) - len(messages)
        fit = RemoteFit(
            wire, num_system, policy, int(settings.max_new_tokens), self._counter, lambda: self.model, self._learn
        )

        async def body() -> dict[str, Any]:
            # In the job's task, so that a server which cannot be reached fails the job, as the engine's do.
            await self._ensure_listed()
            out = {**self.request_body(wire, settings), **await fit.fit(self._context_length)}
            if tools is not None and tools.tools:
                out["tools"] = [dict(t) for t in tools.tools]
                out["tool_choice"] = tools.choice
                out["parallel_tool_calls"] = tools.parallel
            if self._optional_refused:
                out = {k: v for k, v in out.items() if k not in OPTIONAL_FIELDS}
            return out

        job = RemoteJob(
            self._client,
            f"{self.base_url}/chat/completions",
            body,
            self.base_url,
            self.timeout,
            identifier=identifier,
            optional_fields=OPTIONAL_FIELDS,
            on_optional_refused=self._remember_optional_refused,
            fit=fit,
        )
        job.start()
        try:
            await job.ready()  # the turns kept are known (first_seen) before the chat shows the answer
        except asyncio.CancelledError:
            await job.cancel()
            raise
        return job

    async def _ensure_listed(self) -> None:
        """List the models once: it picks the default model and tells llama-server (whose penalty field has
        another name) from the rest. A chosen model is asked for even where /models is missing or odd."""
        if self._listed:
            return
        try:
            await self.list_models()
        except (RemoteNotFound, RemoteBadReply, RemoteRefused) as e:
            if self.model is None:
                raise
            log.info("%s lists no models (%s); asking for '%s' anyway", self.base_url, e, self.model)
            self._listed = True

    def request_body(self, messages: list[dict[str, Any]], settings: GenerationSettings) -> dict[str, Any]:
        """The streamed /chat/completions body for `messages` under `settings`.

        The engine's greedy forms (temperature 0, or top_k 1) become temperature 0; neutral settings are left
        out, so a server's own defaults never fight a value that switches a step off.
        """
        greedy = settings.temperature == 0 or settings.top_k == 1
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": int(settings.max_new_tokens),
            "temperature": 0.0 if greedy else float(settings.temperature),
        }
        if not greedy and 0 < settings.top_p < 1:
            body["top_p"] = float(settings.top_p)
        if not greedy and settings.top_k > 1:
            body["top_k"] = int(settings.top_k)
        if not greedy and settings.min_p > 0:
            body["min_p"] = float(settings.min_p)
        if settings.token_repetition_penalty != 1:
            body[self._penalty_field] = float(settings.token_repetition_penalty)
        if settings.token_presence_penalty:
            body["presence_penalty"] = float(settings.token_presence_penalty)
        if settings.token_frequency_penalty:
            body["frequency_penalty"] = float(settings.token_frequency_penalty)
        if settings.seed is not None:
            body["seed"] = int(settings.seed)
        if settings.json_mode:
            body["response_format"] = {"type": "json_object"}
        if settings.thinking is not None:  # vLLM's and Tandem's servers pass these to the chat template
            body["chat_template_kwargs"] = {"enable_thinking": settings.thinking}
        if settings.reasoning_effort is not None:  # OpenAI's field; vLLM and Tandem pass it to the template
            body["reasoning_effort"] = settings.reasoning_effort
        return body

    def _remember_optional_refused(self) -> None:
        self._optional_refused = True

    def _learn(self, context_length: int) -> None:
        """A refusal for length stated the model's context: later answers fit to it before they are sent."""
        if context_length != self._context_length:
            log.info("%s: the server's context is %d tokens (it said so refusing a request)", self.name, context_length)
            self._context_length = context_length

    def _client(self) -> httpx2.AsyncClient:
        """A client for one request or one listing: a client belongs to the event loop it was first used on,
        and the app and the tests run more than one loop."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(self.timeout), follow_redirects=True)


def _model_cards(url: str, response: httpx2.Response) -> list[dict[str, Any]]:
    try:
        data = response.json()
    except ValueError:
        raise not_openai(url, response.headers.get("content-type", ""), response.content[:2000]) from None
    cards = data.get("data") if isinstance(data, dict) else None
    if not isinstance(cards, list) or not all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in cards):
        raise RemoteBadReply(
            f"The server at {url} answered without an OpenAI model list ({{'data': [{{'id': ...}}]}}). Check that "
            "the URL is an OpenAI-compatible API, usually ending in /v1."
        )
    return cards


def _context_of(card: Mapping[str, Any]) -> int:
    """A model card's context length: vLLM's (and ours) max_model_len, llama-server's meta.n_ctx, LM Studio's
    max_context_length; 0 when it says none."""
    meta = card.get("meta") if isinstance(card.get("meta"), dict) else {}
    for value in (card.get("max_model_len"), meta.get("n_ctx"), card.get("max_context_length")):
        if _positive_int(value):
            return int(value)
    return 0


def _positive_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _data_urls(images: list[ImageSource]) -> list[str]:
    """Each image as a data: URL (its own format's MIME type), read on a worker thread; ValueError naming an
    image that cannot be read."""
    urls = []
    for i, source in enumerate(images):
        data, name = read_image(source)
        name = name or f"image {i + 1}"
        try:
            with Image.open(io.BytesIO(data)) as image:
                mime = Image.MIME.get(image.format or "", "")
        except (OSError, ValueError):
            mime = ""
        if not mime:
            raise ValueError(f"{name} is not an image Pillow can read, so it cannot be sent. Attach a PNG or JPEG.")
        urls.append(f"data:{mime};base64,{base64.b64encode(data).decode()}")
    return urls


def _count_image_parts(messages: Sequence[Mapping[str, Any]], num_images: int) -> None:
    num_parts = count_images(messages)
    if num_parts != num_images:
        raise ValueError(f"{num_images} images were given for {num_parts} image parts in the messages.")


def _wire_messages(
    messages: Sequence[Mapping[str, Any]], system_prompt: str | None, image_urls: list[str]
) -> list[dict[str, Any]]:
    """The conversation as OpenAI messages: the system prompt first, each {"type": "image"} part an image_url
    part holding the next data URL (there is one per part: see _count_image_parts)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    urls = iter(image_urls)
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = [
                {"type": "image_url", "image_url": {"url": next(urls)}}
                if isinstance(part, Mapping) and part.get("type") == "image"
                else dict(part)
                for part in content
            ]
        wired = {"role": message["role"], "content": content}
        for key in ("tool_calls", "tool_call_id"):  # a tool loop's calls and results (app.service.tool_loop)
            if message.get(key):
                wired[key] = message[key]
        out.append(wired)
    return out
