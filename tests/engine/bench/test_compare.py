"""`python -m engine bench` end to end on the tiny random model: both sides run, every row prints; the feature
rows (speculation, constrained JSON) run on our engine alone with `--only features`.

Bad inputs tried: --new-tokens 1, --jobs 0, --threads 0, --draft-layers 0 / "two" / "4,-1", a missing model path.
"""

from __future__ import annotations

import argparse
import json
import math

import pytest

from engine.bench import compare as bench
from engine.bench.table import build_rows
from engine.bench.workload import build_workload

ROW_LABELS = [
    "single-stream decode tok/s",
    "single-stream time to first token",
    "aggregate tok/s, 3 concurrent jobs",
    "second chat turn, time to first token",
    "same prompt, cold (fresh cache)",
    "prompt tok/s (",
    "decode bound:",
    "single-stream decode tok/s, another program keeping one core busy",
    "peak RSS of the whole process",
    "of which after imports, before loading",
    "of which after loading the model",
    "load time",
    "runnable time spent waiting for a CPU",
]
FEATURE_LABELS = [
    "speculation prompt (quotes code, asks it back), no speculation",
    "n-gram speculation (max_ngram 4)",
    "self-speculation draft: first 1 of 2 layers, 4 draft tokens",
    "JSON prompt, unconstrained",
    "constrained by a JSON schema (JSONFilter; ended by",
]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def small_args(folder, *extra: str) -> argparse.Namespace:
    return parse(
        str(folder), "--dtype", "float32", "--threads", "1", "--new-tokens", "4", "--jobs", "3",
        "--max-prompt-tokens", "48", "--history-tokens", "120", "--page-size", "16", *extra,
    )  # fmt: skip


def test_bench_runs_both_sides_and_prints_every_row(tiny_folder, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.run(small_args(tiny_folder, "--hf-batched", "--draft-layers", "1", "--json", str(out))) == 0
    table = capsys.readouterr().out
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == [
        "metric",
        "ours",
        "transformers",
        "target",
        "result",
    ]
    for label in ROW_LABELS + FEATURE_LABELS:
        assert any(label in line for line in lines), f"row {label!r} missing from:\n{table}"
    assert len(lines) == 1 + len(ROW_LABELS) + len(FEATURE_LABELS)
    single, _, aggregate, second_turn = lines[1:5]
    assert "n/a" not in "\n".join(lines[1:4]), table  # both sides filled the speed rows
    for verdict_row in (single, aggregate, second_turn):
        assert "PASS (" in verdict_row or "MISS (" in verdict_row

    data = json.loads(out.read_text())
    ours, hf = data["sides"]["ours"], data["sides"]["transformers"]
    for side in (ours, hf):
        for key in ("single_decode_tps", "single_ttft_s", "turn2_cold_ttft_s", "peak_rss_mib", "load_s"):
            assert side[key] > 0 and math.isfinite(side[key]), (key, side[key])
        assert side["threads"] == 1
    for key in ("prompt_tps", "busy_decode_tps"):  # the load rows: ours only (transformers has neither)
        assert ours[key] > 0 and math.isfinite(ours[key]), (key, ours[key])
        assert 0 <= side["cpu_wait_share"] <= 1
    assert ours["aggregate_tps"] > 0 and ours["turn2_warm_ttft_s"] > 0 and hf["batched_tps"] > 0
    # The second turn extends the first, so every full 16-token page of turn 1's prompt is reused.
    turn1_len = len(build_workload(_tokenizer(tiny_folder), small_args(tiny_folder))["turn1"])
    assert ours["turn2_cached_tokens"] >= turn1_len // 16 * 16
    assert ours["turn2_prompt_tokens"] > turn1_len
    assert len(data["config"]["prompt_tokens"]["jobs"]) == 3


def test_skip_transformers_runs_our_rows_only(tiny_folder, capsys):
    assert bench.run(small_args(tiny_folder, "--skip-transformers", "--only", "core")) == 0
    table = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == len(ROW_LABELS)
    assert all(cells[2].strip().startswith("n/a") for cells in rows)  # the transformers column
    assert all(not cells[1].strip().startswith("n/a") for cells in rows)  # ours
    assert "transformers skipped (--skip-transformers)" in table
    assert table.startswith("Tandem engine on tiny-gen")


def test_feature_rows_run_on_our_engine_alone(tiny_folder, tmp_path, capsys):
    out = tmp_path / "features.json"
    argv = ["--only", "features", "--draft-layers", "1,5", "--new-tokens", "12", "--json", str(out)]
    assert bench.run(small_args(tiny_folder, *argv)) == 0
    table = capsys.readouterr().out
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(lines) == 1 + len(FEATURE_LABELS), table  # no core rows; the 5-layer draft is skipped (2 layers)
    for label, line in zip(FEATURE_LABELS, lines[1:], strict=True):
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert label in cells[0], line
        assert float(cells[1].replace(",", "")) > 0, line  # ours: a rate
        assert cells[2] == "n/a"  # transformers did not run
    assert "--only features" in table and "departs" not in table  # float32: greedy speculation changes nothing

    ours = json.loads(out.read_text())["sides"]["ours"]
    for key in ("spec_plain_tps", "spec_ngram_tps", "json_tps", "json_free_tps"):
        assert ours[key] > 0 and math.isfinite(ours[key]), (key, ours[key])
    assert math.isnan(ours["spec_ngram_acceptance"]) or 0 <= ours["spec_ngram_acceptance"] <= 1
    assert ours["spec_ngram_departs_at"] is None
    (draft,) = ours["spec_drafts"]
    assert draft["layers"] == 1 and draft["tps"] > 0 and 0 <= draft["acceptance"] <= 1
    assert draft["departs_at"] is None
    assert 1 <= ours["json_new_tokens"] <= 12 and ours["json_completion"].startswith("{")
    assert ours["json_eos_reason"] in ("end_filter", "max_new_tokens", "stop_token")
    assert "single_decode_tps" not in ours and "transformers" not in json.loads(out.read_text())["sides"]


def test_feature_rows_compare_against_no_speculation():
    args = parse("x", "--only", "features")
    ours = {
        "num_layers": 30, "spec_plain_tps": 20.0, "spec_ngram_tps": 40.0, "spec_ngram_acceptance": 0.5,
        "spec_ngram_departs_at": None, "json_tps": 16.0, "json_free_tps": 20.0, "json_new_tokens": 27,
        "json_eos_reason": "end_filter",
        "spec_drafts": [{"layers": 8, "tps": 10.0, "acceptance": 0.01, "departs_at": 370}],
    }  # fmt: skip
    rows = build_rows(args, {}, {"ours": ours})
    assert [r["ours"] for r in rows] == ["20.0", "40.0", "10.0", "20.0", "16.0"]
    assert rows[1]["result"] == "2.00x no speculation; 50% of drafts accepted"
    assert rows[2]["metric"].strip() == "self-speculation draft: first 8 of 30 layers, 4 draft tokens"
    assert (
        rows[2]["result"]
        == "0.50x no speculation; 1% of drafts accepted; output departs from plain decoding at character 370"
    )
    assert rows[3]["metric"].startswith("JSON prompt, unconstrained, tok/s (27 new")
    assert rows[4]["result"] == "+25% time per token"  # 1/16 s vs 1/20 s per token
    assert all(r["transformers"] == "n/a" and r["target"] == "" for r in rows)
    ours["spec_ngram_acceptance"] = math.nan  # the prompt gave the n-gram drafter nothing to find
    assert build_rows(args, {}, {"ours": ours})[1]["result"] == "2.00x no speculation; no drafts"


def _tokenizer(folder):
    from engine.tokenizer.tokenizer import Tokenizer

    return Tokenizer.load(folder)


def test_workload_mixes_lengths_without_shared_prefixes(tiny_folder):
    args = small_args(tiny_folder, "--jobs", "5", "--max-prompt-tokens", "200")
    jobs = build_workload(_tokenizer(tiny_folder), args)["jobs"]
    lengths = [len(j) for j in jobs]
    assert max(lengths) >= 200 and max(lengths) - min(lengths) > 100

    # After the shared template start the prompts differ, so the prefix cache cannot favour the job mix.
    def shared_prefix(x: list[int], y: list[int]) -> int:
        return next((i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), min(len(x), len(y)))

    assert max(shared_prefix(x, y) for x in jobs for y in jobs if x is not y) < 16


def test_rows_without_transformers_say_na(tiny_folder):
    args = small_args(tiny_folder)
    workload = build_workload(_tokenizer(tiny_folder), args)
    ours = {
        "single_decode_tps": 10.0, "single_ttft_s": 0.1, "aggregate_tps": 50.0, "turn2_warm_ttft_s": 0.01,
        "turn2_cold_ttft_s": 0.2, "turn2_cached_tokens": 96, "turn2": [1] * 120, "peak_rss_mib": 500.0,
        "rss_after_import_mib": 300.0, "load_s": 1.0,
    }  # fmt: skip
    rows = build_rows(args, workload, {"ours": ours})
    assert [r["transformers"] for r in rows[:2]] == ["n/a", "n/a"]
    assert rows[0]["result"] == rows[2]["result"] == "n/a"  # no baseline, no verdict
    assert rows[3]["result"] == "PASS (5.0%)" and rows[3]["ours"] == "10 ms"
    ours["turn2_warm_ttft_s"] = 0.03
    assert build_rows(args, workload, {"ours": ours})[3]["result"] == "MISS (15.0%)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--new-tokens", "1"], "--new-tokens must be >= 2"),
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--threads", "0"], "--threads must be >= 1"),
        (["--draft-layers", "0"], "--draft-layers takes positive layer counts such as 8,16; got '0'"),
        (["--draft-layers", "two"], "got 'two'"),
        (["--draft-layers", "4,-1"], "got '-1'"),
    ],
)
def test_bad_options_are_rejected_before_any_work(tiny_folder, argv, message):
    with pytest.raises(ValueError, match=message):
        bench.run(parse(str(tiny_folder), *argv))


def test_missing_model_path_names_the_path(tmp_path):
    with pytest.raises(ValueError, match="nope.gguf does not exist"):
        bench.run(parse(str(tmp_path / "nope.gguf")))


def test_llama_batched_bench_rows_give_generated_tokens_per_second_of_wall_time():
    from engine.bench import llama_batched as bench_batched

    # the table llama-batched-bench 0.3.36 prints (its run on the 1B Q4_K_M file, 8 sequences)
    output = """
llama_batched_bench: n_kv_max = 8192, n_batch = 2048, n_ubatch = 512, flash_attn = -1, is_pp_shared = 0

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|   250 |    128 |    8 |   3024 |    7.509 |   266.35 |   11.099 |    92.26 |   18.608 |   162.51 |
"""
    got = bench_batched.parse(output, jobs=8, new=128)
    assert got["prompt_tokens"] == 250 and abs(got["aggregate_tps"] - 8 * 128 / 18.608) < 1e-9
    assert bench_batched.parse(output, jobs=4, new=128) is None  # not the batch size asked for
    assert bench_batched.parse("error: failed to load model", jobs=8, new=128) is None


def test_workers_import_the_engine_from_the_folder_that_holds_it():
    # with engine/ itself on PYTHONPATH, engine/gguf/ stood in for the gguf package and every GGUF bench failed
    from engine.bench.compare import PACKAGE_ROOT

    assert (PACKAGE_ROOT / "engine" / "__init__.py").is_file()
    assert not (PACKAGE_ROOT / "gguf").exists()
