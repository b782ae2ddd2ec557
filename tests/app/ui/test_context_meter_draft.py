"""The context meter counts the message as it is typed, colours itself near the context's end ("level"), and
under the stop policy flags a message that will not fit before it is sent (real engine, tiny model).

Bad inputs tried: 2,000 words pasted into the input of a chat that stops at the limit.
"""

from __future__ import annotations

from app.ui.context_meter import TOO_LONG, ContextMeter


def test_the_level_follows_the_share_of_the_context(qtbot):
    meter = ContextMeter()
    qtbot.addWidget(meter)
    for used, level in ((100, "ok"), (870, "near"), (1000, "full"), (4000, "full")):
        meter.show_used(used, 1000)
        assert meter.level == level
    assert meter.format() == "context: 4,000 / 1,000 tokens" and not meter.will_not_fit
    meter.stops_at_limit = True
    meter.show_used(4000, 1000)
    assert meter.will_not_fit and TOO_LONG in meter.format()


def test_a_pasted_draft_is_counted_and_flagged_before_it_is_sent(window, engine_service, run, ui):
    tab = window.current_tab()
    tab.set_overflow("stop")
    meter = tab.context_meter
    run(ui.wait_for(lambda: meter.counted is not None and meter.maximum() > 1, what="the first count"))

    async def type_and_wait(text: str) -> None:
        before = meter.counted
        tab.input.setPlainText(text)
        await ui.wait_for(lambda: meter.counted != before, what="the draft to be counted")

    run(type_and_wait("Hello there, how are you?"))
    typed = [{"role": "user", "content": "Hello there, how are you?"}]
    assert meter.counted == engine_service.count_tokens(typed) and meter.level == "ok" and not meter.will_not_fit
    run(type_and_wait(" ".join(["word"] * 2000)))
    assert meter.counted > engine_service.context_length
    assert meter.level == "full" and meter.will_not_fit and TOO_LONG in meter.format()
    tab.set_overflow("truncate-middle")  # the chat would drop old turns: not flagged, still full
    tab.input.setPlainText("short again")
    run(ui.wait_for(lambda: meter.level == "ok", what="the shorter draft's count"))
    assert not meter.will_not_fit
