"""The built-in tools (exact arithmetic, the date and time), the registry's names, and the store's tool switches."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from fractions import Fraction

import pytest

from app.store import Store
from app.store.tool_settings import ToolSettings
from app.tools.arithmetic import MAX_BITS, ArithmeticProblem, calculate, evaluate
from app.tools.builtin import CALCULATOR, CLOCK, arithmetic, current_datetime
from app.tools.registry import ToolRegistry
from app.tools.spec import ToolSpec
from app.tools.toolbox import ToolBox


@pytest.mark.parametrize(
    ("expression", "shown"),
    [
        ("0.1 + 0.2", "0.3"),
        ("1 / 3", "1/3 (≈ 0.33333333333333333333)"),
        ("2 ** 100", str(2**100)),
        ("(1.5 + 2) * 3 / 7", "1.5"),
        ("-2 ** -2", "-0.25"),
        ("2 ^ 10", "1024"),
        ("7 // 2 + 7 % 3", "4"),
        ("1e3 + 0.001", "1000.001"),
        ("10 ** -3", "0.001"),
        ("123456789123456789 * 987654321987654321", str(123456789123456789 * 987654321987654321)),
    ],
)
def test_arithmetic_is_exact(expression, shown):
    assert calculate(expression) == shown


def test_arithmetic_reads_literals_as_written_not_as_floats():
    assert evaluate("0.1 + 0.2") == Fraction(3, 10) and evaluate("0.1 * 3") == evaluate("0.3")


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("1 / 0", "Division by zero"),
        ("5 % (2 - 2)", "Division by zero"),
        ("0 ** -1", "Division by zero"),
        ("2 ** 100000", "more than"),
        ("9 ** 9 ** 9", "more than"),
        ("10 ** 10 ** 10", "more than"),
        ("2 ** 0.5", "not a whole number"),
        ("__import__('os').system('true')", "not arithmetic"),
        ("x + 1", "not arithmetic"),
        ("'a' * 3", "not a number"),
        ("1 +", "Not a valid expression"),
        ("", "empty"),
        ("(" * 3000 + "1" + ")" * 3000, "longer than"),
        ("(" * 900 + "1" + ")" * 900, "nested"),
    ],
)
def test_arithmetic_refuses_with_a_reason(expression, says):
    with pytest.raises(ArithmeticProblem, match=says):
        calculate(expression)


def test_huge_intermediate_results_are_refused_too():
    big = "*".join(["99999999999999999999"] * 80)  # each factor is small, the product is not
    with pytest.raises(ArithmeticProblem, match=f"more than {MAX_BITS} bits"):
        calculate(big)


def test_the_tools_wrap_their_functions():
    assert arithmetic({"expression": "1/4"}).text == "1/4 = 0.25"
    refused = arithmetic({"expression": "1/0"})
    assert refused.is_error and "Division by zero" in refused.text
    assert arithmetic({}).is_error
    moment = datetime(2026, 3, 5, 14, 30, 7, tzinfo=timezone(timedelta(hours=1), "CET"))
    text = current_datetime({}, now=lambda: moment).text
    assert text.startswith(moment.astimezone().isoformat(timespec="seconds"))
    assert "2026" in text and moment.astimezone().tzname() in text  # the local zone's name
    assert CALCULATOR.definition()["function"]["parameters"]["required"] == ["expression"]
    assert CLOCK.definition()["function"]["name"] == "current_datetime"


def test_the_registry_runs_builtins_and_renames_clashing_tools():
    registry = ToolRegistry()
    assert [t.name for t in registry.tools] == ["current_datetime", "calculate"]
    # a server's tool that clashes with a built-in is offered under its server's name
    registry._listed["math server"] = [ToolSpec("calculate", "theirs", source="math server")]
    registry._rename()
    theirs = registry.tool("math_server_calculate")
    assert theirs is not None and theirs.tool_name == "calculate" and theirs.key == "math server/calculate"

    async def go():
        return (
            await registry.call("calculate", '{"expression": "2*21"}'),
            await registry.call("calculate", "{not json"),
            await registry.call("nothing", "{}"),
        )

    ok, bad_json, missing = asyncio.run(go())
    assert ok.text == "2*21 = 42" and bad_json.is_error and "JSON" in bad_json.text and missing.is_error
    box = ToolBox.of(registry, {"built-in/calculate"}, {"built-in/current_datetime"})
    assert [d["function"]["name"] for d in box.definitions()] == ["calculate"]
    assert box.asks("calculate") and not box.asks("current_datetime")
    off = asyncio.run(box.run("current_datetime", "{}"))
    assert off.is_error and "not switched on" in off.text
    whole = asyncio.run(box.run("calculate", {"expression": "10 ** 1000"}))
    assert whole.text.endswith("0" * 1000)


def test_long_results_are_cut_with_a_note(monkeypatch):
    import app.tools.toolbox as toolbox

    monkeypatch.setattr(toolbox, "MAX_RESULT_CHARS", 100)
    box = ToolBox.of(ToolRegistry(), {"built-in/calculate"})
    cut = asyncio.run(box.run("calculate", {"expression": "10 ** 1000"}))
    assert cut.text.startswith("10 ** 1000 = 1000") and cut.text.endswith("[... 914 more characters cut]")


def test_the_store_keeps_servers_always_allow_and_per_chat_switches(tmp_path):
    store = Store(tmp_path / "history.db")
    try:
        tools = ToolSettings(store._db)
        chat = store.create_chat("tools")
        other = store.create_chat("other")
        assert tools.servers() == [] and tools.always_allowed() == set() and tools.enabled(chat.id) == set()
        server = {"name": "files", "command": "mcp-files", "args": ["--root", "/tmp"], "env": {}, "url": ""}
        tools.set_servers([server])
        tools.set_always_allow("built-in/calculate", True)
        tools.set_chat_tool(chat.id, "built-in/calculate", True)
        tools.set_chat_tool(chat.id, "files/read", True)
        tools.set_chat_tool(chat.id, "files/read", False)
        assert tools.servers() == [server] and json.dumps(tools.servers())
        assert tools.always_allowed() == {"built-in/calculate"}
        assert tools.chat_tools(chat.id) == {"built-in/calculate": True, "files/read": False}
        assert tools.enabled(chat.id) == {"built-in/calculate"} and tools.enabled(other.id) == set()
        tools.set_always_allow("built-in/calculate", False)
        assert tools.always_allowed() == set()
        store.delete_chat(chat.id)
        assert tools.chat_tools(chat.id) == {}
    finally:
        store.close()
