"""`python -m engine serve --cache-dir`: a restarted server reads a long prompt's prefix from disk and answers the
same, through the official openai client."""

from __future__ import annotations

import subprocess
import sys

import openai

from engine.cache.disk import SUFFIX

PROMPT = "Summarize this list of facts about the sea. " + " ".join(
    f"Fact {i}: the sea holds water, salt and fish number {i}." for i in range(60)
)


def serve_and_ask(gguf, cache_dir, kv_format: str = "bf16") -> tuple[str, int]:
    """Start the real command, ask once (greedy), stop it; returns (answer, cached prompt tokens)."""
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "engine",
            "serve",
            str(gguf),
            "--port",
            "0",
            "--context",
            "2048",
            "--model-id",
            "m",
            "--cache-dir",
            str(cache_dir),
            "--kv-format",
            kv_format,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = serve.stdout.readline()
        assert line.startswith("Serving m at http://127.0.0.1:"), line + serve.stderr.read()
        assert line.rstrip().endswith("tokens)" if kv_format == "bf16" else f"tokens in {kv_format})"), line
        url = line.split(" at ")[1].split()[0]
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
        answer = c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": PROMPT}], temperature=0, max_tokens=16
        )
        assert answer.usage.prompt_tokens > 512  # at least two full pages of 256
        return answer.choices[0].message.content, answer.usage.prompt_tokens_details.cached_tokens
    finally:
        serve.terminate()
        serve.wait(60)


def test_a_restarted_server_reads_the_prompt_prefix_from_disk(starter_gguf, tmp_path):
    first, cached = serve_and_ask(starter_gguf, tmp_path)
    assert cached == 0
    assert len(list(tmp_path.rglob(f"*{SUFFIX}"))) >= 2
    again, cached = serve_and_ask(starter_gguf, tmp_path)
    assert again == first
    assert cached >= 512


def test_quantized_pages_come_back_from_disk_and_stay_apart_from_other_formats(starter_gguf, tmp_path):
    """`--kv-format q4` pages on disk: a restart reads them and answers the same; a server with another
    format never reads them (their identity differs), so it computes the prompt and answers as it would cold."""
    first, cached = serve_and_ask(starter_gguf, tmp_path, "q4")
    assert cached == 0
    again, cached = serve_and_ask(starter_gguf, tmp_path, "q4")
    assert again == first and cached > 512
    _, cached = serve_and_ask(starter_gguf, tmp_path, "q8")
    assert cached == 0
