"""`python -m engine serve MODEL`: load the model, bind the address, print the URL, serve until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import socket
import sys

from engine.cache.cache import KV_FORMATS
from engine.chat.overflow import OverflowPolicy
from engine.loading.builtin import MODEL_HELP
from engine.server.sizing import CACHE_TOKENS

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
# One default for `engine serve` and the app's local server: LM Studio's port, which many OpenAI clients and
# editor plugins already point at for a local model (vLLM's 8000 is often taken by web development servers).
DEFAULT_PORT = 1234


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--host", default=LOOPBACK, help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port to bind (default {DEFAULT_PORT}; 0: any free port)"
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="key clients must send as 'Authorization: Bearer KEY' (default: $TANDEM_API_KEY)",
    )
    p.add_argument(
        "--max-concurrent",
        type=int,
        default=None,
        help="most requests generating at once (default: as many as the cache's free pages hold)",
    )
    p.add_argument(
        "--cache-tokens",
        type=int,
        default=None,
        help=f"tokens of KV cache that all requests share (default {CACHE_TOKENS}, at least one --context)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="requests allowed to wait beyond those running before 503 (default 64)",
    )
    p.add_argument(
        "--context",
        type=int,
        default=None,
        help="most tokens of one request, prompt + completion (default: the model's context, at most 8192)",
    )
    p.add_argument(
        "--context-overflow",
        choices=[p.value for p in OverflowPolicy],
        default=OverflowPolicy.STOP.value,
        help="a chat longer than --context: stop (400, the default), truncate-middle (keep the system prompt and "
        "first exchange, drop the oldest turns after them) or rolling-window (drop the oldest turns)",
    )
    p.add_argument(
        "--kv-format",
        choices=KV_FORMATS,
        default="bf16",
        help="the KV cache's pages: bf16 (unquantized, the default), or q8, q6, q4 (8-, 6- or 4-bit codes: about "
        "0.53x, 0.41x or 0.28x the memory, so --cache-tokens can be that much larger)",
    )
    p.add_argument("--model-id", default=None, help="the model's name in the API (default: the file or folder name)")
    p.add_argument("--max-body-mb", type=float, default=32.0, help="largest request body in MiB (default 32)")
    p.add_argument(
        "--cache-dir",
        default=None,
        help="also keep finished KV pages in this folder (at most 2 GB), so a restarted server reads a long "
        "prompt's prefix back instead of computing it (default: memory only)",
    )
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    p.add_argument("--device", default="cpu", help="cpu or cuda")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port; ValueError saying what to do when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(
            f"cannot listen on {host}:{port} ({e.strerror}); pass another --port (0 picks a free one)"
        ) from e
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"


def make_server(app, log_level: str = "warning"):
    """A uvicorn server for `app`; `await server.serve(sockets=[sock])` runs it, `server.should_exit` stops it."""
    import uvicorn

    # Open streams would hold a graceful shutdown forever; after 5 s they are cut (and their jobs cancelled).
    config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=5)
    return uvicorn.Server(config)


def run(args: argparse.Namespace, model_path) -> int:
    import torch

    from engine.server.app import ServerOptions, create_app
    from engine.server.served import ServedModel

    context = args.context if args.context is not None else 8192
    max_concurrent, cache_tokens = args.max_concurrent, args.cache_tokens
    if (
        context < 2
        or (max_concurrent is not None and max_concurrent < 1)
        or (cache_tokens is not None and cache_tokens < 1)
        or args.max_queue < 0
        or args.max_body_mb <= 0
    ):
        raise ValueError(
            "--context must be >= 2, --max-concurrent >= 1, --cache-tokens >= 1, --max-queue >= 0 and --max-body-mb > 0"
        )
    served = ServedModel.load(
        model_path,
        model_id=args.model_id,
        dtype=getattr(torch, args.dtype) if args.dtype else None,
        device=args.device,
        context=context,
        max_concurrent=max_concurrent,
        max_queue=args.max_queue,
        cache_tokens=cache_tokens,
        overflow=args.context_overflow,
        kv_format=args.kv_format,
    )
    if args.cache_dir is not None:
        try:
            served.cache.use_disk(args.cache_dir)  # before the generator starts: it reads the cache's disk tier
        except OSError as e:
            raise ValueError(f"--cache-dir {args.cache_dir} cannot be used ({e}); pass a writable folder") from e
    api_key = args.api_key or os.environ.get("TANDEM_API_KEY") or None
    options = ServerOptions(api_key=api_key, max_body_bytes=int(args.max_body_mb * 1024 * 1024))
    sock = bind(args.host, args.port)
    if api_key is None and not _is_loopback(args.host):
        print(
            f"warning: serving on {args.host} without --api-key: anyone who can reach this machine can use the model",
            file=sys.stderr,
        )
    print(
        f"Serving {served.model_id} at {url_of(sock)} (context {served.context} tokens, cache "
        f"{served.cache.max_seq_len} tokens{'' if served.cache.kv_format == 'bf16' else ' in ' + served.cache.kv_format})",
        flush=True,
    )
    server = make_server(create_app(served, options), log_level="info" if log.isEnabledFor(logging.INFO) else "warning")
    asyncio.run(server.serve(sockets=[sock]))
    return 0


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
