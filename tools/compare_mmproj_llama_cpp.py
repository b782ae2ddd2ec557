"""Greedy answers to one image prompt from Tandem and from llama.cpp, on the same GGUF pair.

    python tools/compare_mmproj_llama_cpp.py TEXT.gguf MMPROJ.gguf [--server PATH | --cli PATH] [--size 80x64]
        [--tokens 16] [--image PICTURE] [--before TEXT --after TEXT]

With `--server` (or $LLAMA_SERVER): starts llama-server with `--mmproj` on a free local port and compares token
ids. With `--cli`: runs llama-mtmd-cli once (`--temp 0`, the prompt passed through a chat template that adds
nothing) and compares the answer's text, which is all it prints. Both are built by
../shared/tools/build-llama-cpp.sh, their libraries found beside them. The prompt is ChatML holding a seeded noise
picture (or --image; --before / --after: the prompt's text around the picture, for a model with another
format); prints both answers and exits 0 when they are equal, 1 when not. The picture's sides should need no
resizing by either side (multiples of the model's patch grid, within its pixel limits; a fixed-size tower's own
size): llama.cpp resizes with its own filters, so a resized picture may differ by rounding.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.models import Model

# The prompt's text before and after the picture (ChatML; --before / --after for a model with another format).
CHATML = ("<|im_start|>user\n", "What is in the picture?<|im_end|>\n<|im_start|>assistant\n")


def picture(width: int, height: int) -> Image.Image:
    rng = np.random.default_rng(2)
    img = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    ImageDraw.Draw(img).ellipse((width // 5, height // 6, width * 3 // 4, height * 4 // 5), fill="red")
    return img


def tandem_tokens(
    text: Path, mmproj: Path, img: Image.Image, num_tokens: int, prompt: tuple[str, str] = CHATML, model=None
) -> list[int]:
    model = model or Model.load(text, dtype=torch.float32, mmproj=mmproj)
    if model.vision_error:
        raise SystemExit(f"Tandem did not pair the files: {model.vision_error}")
    emb = model.vision.get_image_embeddings(image=img)
    image = getattr(emb, "prompt_text", emb.text_alias)  # with the model's own wrapping, as llama.cpp adds it
    ids = model.tokenizer.encode(prompt[0] + image + prompt[1], encode_special_tokens=True, embeddings=[emb])
    job = DynamicJob(ids, num_tokens, gen_settings=SamplerSettings.greedy(), identifier=0, embeddings=[emb])
    gen = DynamicGenerator(model, Cache(model, max_seq_len=2048, page_size=16), model.tokenizer)
    gen.enqueue(job)
    out: list[int] = []
    while gen.num_remaining_jobs():
        out += [t for r in gen.iterate() if "token_ids" in r for t in r["token_ids"][0].tolist()]
    return out


def _get(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)


def llama_cpp_tokens(
    server: Path, text: Path, mmproj: Path, img: Image.Image, num_tokens: int, prompt: tuple[str, str] = CHATML
) -> list[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "LD_LIBRARY_PATH": str(server.parent)}
    args = [str(server), "-m", str(text), "--mmproj", str(mmproj), "--port", str(port), "-c", "2048", "-t", "1"]
    proc = subprocess.Popen(args + ["--no-warmup"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(120):
            if proc.poll() is not None:
                raise SystemExit(f"llama-server exited: {proc.stderr.read().decode()[-1500:]}")
            try:
                if _get(f"{url}/health").get("status") == "ok":
                    break
            except OSError:
                time.sleep(0.5)
        # The server names its media marker per run; the image goes where it stands.
        marker = _get(f"{url}/props")["media_marker"]
        buffer = io.BytesIO()
        img.save(buffer, format="PNG")
        prompt = {
            "prompt_string": prompt[0] + marker + prompt[1],
            "multimodal_data": [base64.b64encode(buffer.getvalue()).decode()],
        }
        body = {"prompt": prompt, "n_predict": num_tokens, "samplers": ["top_k"], "top_k": 1, "return_tokens": True}
        return _get(f"{url}/completion", {**body, "cache_prompt": False})["tokens"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# llama-mtmd-cli always formats -p as a chat message: this template gives the message back as it is, so the
# prompt is the same text as Tandem's (its media marker where the picture goes).
_AS_IS_TEMPLATE = "{% for message in messages %}{{ message.content }}{% endfor %}"


def llama_cpp_cli_text(
    cli: Path, text: Path, mmproj: Path, img: Image.Image, num_tokens: int, prompt: tuple[str, str] = CHATML
) -> str:
    """llama-mtmd-cli's greedy answer (it prints text, not ids; it stops at an end-of-generation token)."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(cli.parent)}
    with tempfile.TemporaryDirectory() as tmp:
        picture_path = Path(tmp) / "picture.png"
        img.save(picture_path)
        args = [str(cli), "-m", str(text), "--mmproj", str(mmproj), "--image", str(picture_path)]
        args += ["-p", prompt[0] + "<__media__>" + prompt[1], "--jinja", "--chat-template", _AS_IS_TEMPLATE]
        args += ["--temp", "0", "-n", str(num_tokens), "-c", "2048", "-t", "1", "--no-warmup"]
        done = subprocess.run(args, env=env, capture_output=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"llama-mtmd-cli failed: {done.stderr.decode(errors='replace')[-1500:]}")
    # It prints a line break before the answer and after it; bytes that are no UTF-8 read as the tokenizer does.
    return done.stdout.decode(errors="replace").strip("\n")


def tandem_text(text: Path, mmproj: Path, img: Image.Image, num_tokens: int, prompt: tuple[str, str] = CHATML) -> str:
    """Tandem's greedy answer as llama-mtmd-cli shows one: up to the first end-of-reply token, specials as text."""
    model = Model.load(text, dtype=torch.float32, mmproj=mmproj)
    tokens = tandem_tokens(text, mmproj, img, num_tokens, prompt, model)
    ends = [i for i, t in enumerate(tokens) if t in model.tokenizer.eos_token_ids]
    return model.tokenizer.decode(tokens[: ends[0]] if ends else tokens, decode_special_tokens=True).strip("\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("text", type=Path)
    parser.add_argument("mmproj", type=Path)
    parser.add_argument("--server", type=Path, default=os.environ.get("LLAMA_SERVER"))
    parser.add_argument("--cli", type=Path, help="llama-mtmd-cli instead of llama-server: compares the answer's text")
    parser.add_argument("--size", default="80x64", help="the picture's WIDTHxHEIGHT")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--image", type=Path, help="a picture file in place of the seeded noise one")
    parser.add_argument("--before", default=CHATML[0], help="the prompt's text before the picture")
    parser.add_argument("--after", default=CHATML[1], help="the prompt's text after the picture")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))
    img = Image.open(args.image).convert("RGB") if args.image else picture(width, height)
    prompt = (args.before.replace("\\n", "\n"), args.after.replace("\\n", "\n"))  # \n typed in a shell
    if args.cli is not None:
        if not args.cli.is_file():
            raise SystemExit(f"{args.cli} does not exist; build-llama-cpp.sh builds llama-mtmd-cli")
        ours_text = tandem_text(args.text, args.mmproj, img, args.tokens, prompt)
        theirs_text = llama_cpp_cli_text(args.cli, args.text, args.mmproj, img, args.tokens, prompt)
        same = ours_text == theirs_text
        print(f"Tandem:    {ours_text!r}\nllama.cpp: {theirs_text!r}\n{'equal' if same else 'DIFFERENT'}")
        return 0 if same else 1
    if args.server is None or not args.server.is_file():
        raise SystemExit("pass --server PATH/llama-server (or set $LLAMA_SERVER); build-llama-cpp.sh builds it")
    ours = tandem_tokens(args.text, args.mmproj, img, args.tokens, prompt)
    theirs = llama_cpp_tokens(args.server, args.text, args.mmproj, img, args.tokens, prompt)
    print(f"Tandem:    {ours}\nllama.cpp: {theirs}\n{'equal' if ours == theirs else 'DIFFERENT'}")
    return 0 if ours == theirs else 1


if __name__ == "__main__":
    sys.exit(main())
