"""`python -m engine bench --only kv` end to end on the tiny Llama with heads of 32: every KV row prints, the
quality rows hold the formats' budgets, and the disk tier's row reads the prompt back and gives the same token.

Bad input tried: --kv-new-tokens 1, --kv-context 0.
"""

from __future__ import annotations

import argparse
import json

import pytest

from engine.bench import compare as bench
from engine.bench import kv_formats


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_kv_rows_print_and_hold_their_budgets(tiny_wide_folder, tmp_path, capsys):
    out = tmp_path / "kv.json"
    args = parse(
        str(tiny_wide_folder), "--only", "kv", "--dtype", "float32", "--threads", "1", "--page-size", "16",
        "--kv-context", "200", "--kv-new-tokens", "4", "--kv-text-tokens", "300", "--kv-disk-tokens", "96",
        "--json", str(out),
    )  # fmt: skip
    assert bench.run(args) == 0
    table = capsys.readouterr().out
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    # header, KL per format, decode and prompt per format, disk, sliding-window memory per Gemma 3 size
    assert len(lines) == 1 + 3 + 2 * 4 + 1 + 4, table
    for name in ("Q8", "Q6", "Q4"):
        (row,) = [line for line in lines if f"KV {name}: mean KL" in line]
        assert "PASS" in row, row
    measured = json.loads(out.read_text())["sides"]["ours"]
    assert set(measured["windows"]) == {"Gemma 3 1B", "Gemma 3 4B", "Gemma 3 12B", "Gemma 3 27B"}
    assert set(measured["kl"]) == {"q8", "q6", "q4"} and measured["llama_cpp_kl"] == {}  # not a .gguf file
    assert measured["bytes_ratio"]["q4"] < measured["bytes_ratio"]["q6"] < measured["bytes_ratio"]["q8"] < 1
    assert all(s["decode_tps"] > 0 and s["prompt_tps"] > 0 for s in measured["speed"].values())
    assert all(s["cached_tokens"] > 0 for s in measured["speed"].values())  # later decode runs reuse the prompt
    disk = measured["disk"]
    assert disk["same_token"] and disk["disk_cached_tokens"] >= 80  # all full pages of 16 come from disk


@pytest.mark.parametrize(
    ("argv", "message"), [(["--kv-new-tokens", "1"], "kv-new-tokens"), (["--kv-context", "0"], "kv-context")]
)
def test_bad_kv_options_are_refused(tiny_wide_folder, argv, message):
    with pytest.raises(ValueError, match=message):
        bench.run(parse(str(tiny_wide_folder), "--only", "kv", *argv))


def test_the_quality_text_is_real_prose_from_the_docs(tiny_wide_model):
    ids, text = kv_formats.text_ids(tiny_wide_model.tokenizer, 500)
    assert len(ids) == 500 and "Tandem" in text
