"""The bench's table: one row per metric, a column per side, the target and whether it was met."""

from __future__ import annotations

import argparse
import math

from engine.bench import features as bench_features
from engine.bench import llama_batched as bench_batched
from engine.bench import workload as prompts_of


def fmt(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if unit == "ms":
        return f"{value * 1000:,.0f} ms"
    if unit == "MiB":
        return f"{value:,.0f} MiB"
    if unit == "%":
        return f"{value * 100:.0f}%"
    if unit == "s":
        return f"{value:,.1f} s"
    return f"{value:,.1f}"


def _verdict(ok: bool | None, detail: str) -> str:
    return "n/a" if ok is None else f"{'PASS' if ok else 'MISS'} ({detail})"


def build_rows(args: argparse.Namespace, workload: dict, sides: dict[str, dict | None]) -> list[dict[str, str]]:
    """The table: one dict per row with metric, one column per side, target and result."""
    core, features = prompts_of.groups(args)
    rows = _core_rows(args, workload, sides) if core else []
    if features:
        columns = ["transformers", *(["llama.cpp"] if sides.get("llama.cpp") is not None else [])]
        rows += bench_features.rows(sides.get("ours") or {}, args.new_tokens, fmt, columns)
    return rows


def _core_rows(args: argparse.Namespace, workload: dict, sides: dict[str, dict | None]) -> list[dict[str, str]]:
    ours = sides.get("ours") or {}
    hf = sides.get("transformers") or {}
    cpp = sides.get("llama.cpp")
    lens = [len(p) for p in workload["jobs"]]
    rows: list[dict[str, str]] = []

    def row(metric: str, key: str, unit: str, target: str = "", result: str = "", hf_key: str | None = None):
        cells = {
            "metric": metric,
            "ours": fmt(ours.get(key), unit),
            "transformers": fmt(hf.get(hf_key or key), unit),
        }
        if cpp is not None:
            cells["llama.cpp"] = fmt(cpp.get(key), unit)
        rows.append({**cells, "target": target, "result": result})

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    x = ratio(ours.get("single_decode_tps"), hf.get("single_decode_tps"))
    row(
        f"single-stream decode tok/s ({len(workload['single'])}-token prompt, {args.new_tokens} new, greedy)",
        "single_decode_tps",
        "tok/s",
        ">= 2x transformers",
        _verdict(None if x is None else x >= 2, f"{x or 0:.2f}x"),
    )
    row("single-stream time to first token", "single_ttft_s", "ms")
    x = ratio(ours.get("aggregate_tps"), hf.get("single_decode_tps"))
    rows.append(
        {
            "metric": f"aggregate tok/s, {args.jobs} concurrent jobs (prompts {min(lens)}-{max(lens)} "
            f"tokens, {args.new_tokens} new each; wall time incl. prefill)",
            "ours": fmt(ours.get("aggregate_tps"), "tok/s"),
            "transformers": fmt(hf.get("batched_tps"), "tok/s") + (" (padded batch)" if "batched_tps" in hf else ""),
            **({"llama.cpp": _batched_cell(cpp)} if cpp is not None else {}),
            "target": ">= 8x transformers single-stream",
            "result": _verdict(None if x is None else x >= 8, f"{x or 0:.2f}x"),
        }
    )
    warm, cold = ours.get("turn2_warm_ttft_s"), ours.get("turn2_cold_ttft_s")
    x = ratio(warm, cold)
    cached = ours.get("turn2_cached_tokens")
    row(
        f"second chat turn, time to first token ({len(ours.get('turn2', [])) or '?'}-token prompt; "
        f"{cached if cached is not None else '?'} tokens reused)",
        "turn2_warm_ttft_s",
        "ms",
        "<= 10% of cold",
        _verdict(None if x is None else x <= 0.10, f"{(x or 0) * 100:.1f}%"),
        hf_key="-",
    )
    row("same prompt, cold (fresh cache)", "turn2_cold_ttft_s", "ms")
    prompt_x = ratio(ours.get("prompt_tps"), (cpp or {}).get("prompt_tps"))
    row(
        f"prompt tok/s ({ours.get('prompt_tokens', '?')}-token prompt, cold)",
        "prompt_tps",
        "tok/s",
        ">= 1.0x llama.cpp" if cpp is not None else "",
        _verdict(None if prompt_x is None else prompt_x >= 1.0, f"{prompt_x or 0:.2f}x"),
        hf_key="-",
    )
    if cpp is not None:
        x = ratio(ours.get("single_decode_tps"), cpp.get("single_decode_tps"))
        rows.append(
            {
                "metric": "  single-stream decode against llama.cpp",
                "ours": "",
                "transformers": "",
                "llama.cpp": "",
                "target": ">= 1.0x llama.cpp",
                "result": _verdict(None if x is None else x >= 1.0, f"{x or 0:.2f}x"),
            }
        )
    if cpp is not None:
        x = ratio(ours.get("aggregate_tps"), cpp.get("aggregate_tps"))
        rows.append(
            {
                "metric": f"  {args.jobs} concurrent jobs against llama.cpp",
                "ours": "",
                "transformers": "",
                "llama.cpp": "",
                "target": ">= 1.5x llama.cpp",
                "result": _verdict(None if x is None else x >= 1.5, f"{x or 0:.2f}x"),
            }
        )
    rows += _bound_rows(ours, cpp)
    busy, quiet = ours.get("busy_decode_tps"), ours.get("single_decode_tps")
    kept, x = ratio(busy, quiet), ratio(busy, (cpp or {}).get("busy_decode_tps"))
    ok = None if kept is None else kept >= 0.5 and (x is None or x >= 1.5)
    detail = f"{(kept or 0) * 100:.0f}% of quiet" + (f", {x:.2f}x llama.cpp" if x is not None else "")
    row(
        "single-stream decode tok/s, another program keeping one core busy",
        "busy_decode_tps",
        "tok/s",
        ">= 50% of quiet" + (", >= 1.5x llama.cpp" if cpp is not None else ""),
        _verdict(ok, detail),
        hf_key="-",
    )
    row("peak RSS of the whole process", "peak_rss_mib", "MiB")
    row("  of which after imports, before loading", "rss_after_import_mib", "MiB")
    row("  of which after loading the model", "rss_after_load_mib", "MiB")
    rows += _model_memory_rows(ours, cpp)
    row("load time", "load_s", "s")
    row("runnable time spent waiting for a CPU (other load)", "cpu_wait_share", "%")
    return rows


def _bound_rows(ours: dict, cpp: dict | None) -> list[dict[str, str]]:
    """Single-stream decode beside the rate of a step that only reads its active weights (engine/bench/bound.py)."""
    active, gbs = ours.get("active_bytes"), ours.get("read_gbs")
    if not active or not gbs:
        return []
    limit = gbs * 1e9 / active  # tok/s of a step that only reads its active weights
    shares = [f"ours {ours.get('single_decode_tps', 0) / limit * 100:.0f}%"]
    if cpp is not None and cpp.get("single_decode_tps"):
        shares.append(f"llama.cpp {cpp['single_decode_tps'] / limit * 100:.0f}%")
    metric = f"  decode bound: {active / 2**20:,.0f} MiB of weights read a token, at {gbs:.1f} GB/s measured"
    cells = {"metric": metric, "ours": fmt(limit, "tok/s"), "transformers": "n/a"}
    return [{**cells, **({"llama.cpp": ""} if cpp is not None else {}), "target": "", "result": ", ".join(shares)}]


def _model_memory_rows(ours: dict, cpp: dict | None) -> list[dict[str, str]]:
    """What the model added to each side's resident memory once loaded and run for one short sequence (its weights
    touched, a small KV cache): after the single-stream phase minus before loading."""
    sides = (("ours", ours), ("llama.cpp", cpp or {}))
    if any("rss_after_single_mib" not in s or "rss_after_import_mib" not in s for _, s in sides):
        return []
    added = {side: s["rss_after_single_mib"] - s["rss_after_import_mib"] for side, s in sides}
    x = added["ours"] / added["llama.cpp"] if added["llama.cpp"] > 0 else None
    return [
        {
            "metric": "  of which the model added, loaded and run for one sequence (minus before loading)",
            "ours": fmt(added["ours"], "MiB"),
            "transformers": "n/a",
            "llama.cpp": fmt(added["llama.cpp"], "MiB"),
            "target": "<= 1.1x llama.cpp",
            "result": _verdict(None if x is None else x <= 1.1, f"{x or 0:.2f}x"),
        }
    ]


def _batched_cell(cpp: dict) -> str:
    if cpp.get("aggregate_tps") is None:
        return f"n/a (no {bench_batched.TOOL})"
    return f"{fmt(cpp['aggregate_tps'], 'tok/s')} ({bench_batched.TOOL}, prompts of {cpp['batched_prompt_tokens']})"


def format_table(rows: list[dict[str, str]]) -> str:
    """Rows as a Markdown table (readable in a terminal, pastes into Markdown)."""
    cols = list(rows[0].keys())
    widths = {c: max(len(c), *(len(r.get(c, "")) for r in rows)) for c in cols}
    lines = ["| " + " | ".join(c.ljust(widths[c]) for c in cols) + " |"]
    lines.append("|" + "|".join("-" * (widths[c] + 2) for c in cols) + "|")
    for r in rows:
        lines.append("| " + " | ".join(r.get(c, "").ljust(widths[c]) for c in cols) + " |")
    return "\n".join(lines)
