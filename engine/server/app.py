"""The routes: read and check a request, build its prompt, start its job, reply whole or as a stream.

    POST /v1/chat/completions   messages -> chat template -> job      ChatFormat
    POST /v1/completions        prompt -> tokens -> job               CompletionFormat
    GET  /v1/models, /health

A route only translates: params.py checks fields, messages.py reads messages, served.py owns the model and
its generator, results.py/responses.py shape replies, stream.py streams them and watches the client.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.generator.dynamic_async import DynamicJobAsync, GeneratorClosedError
from engine.server.errors import EXCEPTION_HANDLERS, APIError, bad_request
from engine.server.guard import DEFAULT_MAX_BODY_BYTES, check_api_key, read_json
from engine.server.messages import read_messages
from engine.server.params import Generation, chat_request, completion_request
from engine.server.responses import ChatFormat, CompletionFormat
from engine.server.results import pieces
from engine.server.served import ServedModel
from engine.server.stream import DONE, ClientGone, EventStream, sse, unless_disconnected
from engine.tools.schema import ToolError
from engine.tools.stream import ToolCallParser

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerOptions:
    api_key: str | None = None  # None: no key needed
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


def create_app(
    served: ServedModel | Callable[[], ServedModel | None], options: ServerOptions = ServerOptions()
) -> Starlette:
    """The ASGI app serving `served`, whose generator starts with the app and closes with it; or, given a
    function, serving what it returns at each request (the app's current model, whose owner runs its
    generator), with 503 while it returns None."""
    owned = served if isinstance(served, ServedModel) else None
    current = (lambda: owned) if owned is not None else served

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        if owned is not None:
            owned.start()
        try:
            yield
        finally:
            if owned is not None:
                await owned.close()

    def serving() -> ServedModel:
        now = current()
        if now is None:
            raise APIError(503, "No model is loaded. Load one in Tandem's window, then retry.", code="model_not_loaded")
        return now

    async def models(request: Request) -> Response:
        check_api_key(request, options.api_key)
        served = serving()
        card = {
            "id": served.model_id,
            "object": "model",
            "created": served.created,
            "owned_by": "tandem",
            "max_model_len": served.context,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        # Open without a key, for load balancers and the app's running-state check.
        served = current()
        if served is None:
            return JSONResponse({"status": "no model", "model": None, "requests_in_flight": 0})
        return JSONResponse(
            {
                "status": "ok",
                "model": served.model_id,
                "requests_in_flight": served.in_flight,
                "cache_pages_in_use": served.pages_in_use(),
                "cache_pages": served.cache.num_pages,
            }
        )

    async def chat_completions(request: Request) -> Response:
        check_api_key(request, options.api_key)
        req = chat_request(await read_json(request, options.max_body_bytes))
        served = serving()  # one model for the whole request, even if the app swaps models meanwhile
        served.check_model(req.generation.model)
        chat = read_messages(req.messages)
        use = served.tool_use(req.tools, req.tool_choice, req.parallel_tool_calls)
        try:
            chat.messages = use.messages(chat.messages)
        except ToolError as e:
            raise bad_request(str(e), e.param) from None
        variables = {**req.template_options, **use.template_options()}
        ids, images = await served.chat_prompt(chat, variables, req.generation)
        generation, tools = served.tool_job(use, ids, req.generation)
        job = served.start_job(ids, images, generation)
        fmt = ChatFormat(served.model_id, generation.logprobs, tools)
        return await _reply(request, served, job, generation, fmt, tools)

    async def completions(request: Request) -> Response:
        check_api_key(request, options.api_key)
        req = completion_request(await read_json(request, options.max_body_bytes))
        served = serving()
        served.check_model(req.generation.model)
        ids = await served.completion_prompt(req.prompt)
        job = served.start_job(ids, [], req.generation, prompt_param="prompt")
        fmt = CompletionFormat(served.model_id, req.generation.logprobs)
        return await _reply(request, served, job, req.generation, fmt)

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS, lifespan=lifespan)


async def _reply(
    request: Request,
    served: ServedModel,
    job: DynamicJobAsync,
    gen: Generation,
    fmt: ChatFormat | CompletionFormat,
    tools: ToolCallParser | None = None,
) -> Response:
    """Stream the job's output or wait for all of it; either way the job ends and its slot is freed. `tools`
    reads tool calls out of the answer."""
    finished = False
    closed = False

    async def close() -> None:
        nonlocal closed
        if closed:
            return
        closed = True
        served.release()
        if not finished:
            await job.cancel()  # the reply ended early (client gone, an error): stop the job, free its pages

    results = pieces(job, served.tokenizer, gen.top_logprobs, gen.logprobs, tools)
    if gen.stream:

        async def events():
            nonlocal finished
            first = fmt.first_chunk(gen.include_usage)
            if first is not None:
                yield sse(first)
            try:
                async for piece in results:
                    chunk = fmt.chunk(piece, gen.include_usage)
                    if chunk is not None:
                        yield sse(chunk)
                    if piece.final is not None:
                        finished = True
                        _note_tokens(request, piece.final)
                        if gen.include_usage:
                            yield sse(fmt.usage_chunk(piece.final))
            except Exception as e:  # the job failed in the engine: say so in the stream, which has begun
                log.exception("a streamed job failed")
                yield sse(_failed(e).body())
            yield DONE

        return EventStream(events(), on_close=close)

    async def collect():
        nonlocal finished
        entries = []
        async for piece in results:
            entries += piece.logprobs
            if piece.final is not None:
                finished = True
                _note_tokens(request, piece.final)
                return piece.final, entries
        raise RuntimeError("the job ended without a final result")

    try:
        final, entries = await unless_disconnected(request.receive, collect())
    except ClientGone:
        return Response(status_code=499)  # nobody is left to read it
    except Exception as e:
        log.exception("a job failed")
        raise _failed(e) from None
    finally:
        await close()
    return JSONResponse(fmt.body(entries, final))


def _failed(e: Exception) -> APIError:
    if isinstance(e, GeneratorClosedError):  # a shared generator's owner (the app) swapped or unloaded the model
        return APIError(
            503, "The model was unloaded or replaced while this request ran. Send it again.", code="model_not_loaded"
        )
    return APIError(500, f"Generation failed: {type(e).__name__}: {e}")


def _note_tokens(request: Request, final: dict) -> None:
    # For whoever wraps this app and logs requests (the app's request log reads scope["state"]).
    request.state.completion_tokens = final["new_tokens"]
    request.state.prompt_tokens = final["prompt_tokens"]
