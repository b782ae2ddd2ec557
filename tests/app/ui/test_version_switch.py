"""The ← 2/3 → switch: hidden for a message with one version, its label, which arrows work, what it emits."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget

from app.ui.version_switch import VersionSwitch


def test_the_switch_shows_where_it_is_and_steps(qtbot):
    holder = QWidget()
    qtbot.addWidget(holder)
    switch = VersionSwitch(holder)
    assert switch.isHidden()  # one version: nothing to switch
    switch.set_versions(1, 3)
    assert not switch.isHidden() and switch.label.text() == "2/3"
    assert switch.back_button.isEnabled() and switch.forward_button.isEnabled()
    steps = []
    switch.step.connect(steps.append)
    switch.back_button.click()
    switch.forward_button.click()
    assert steps == [-1, 1]
    switch.set_versions(0, 3)
    assert not switch.back_button.isEnabled() and switch.forward_button.isEnabled()
    switch.set_versions(2, 3, enabled=False)  # the chat is answering
    assert switch.label.text() == "3/3" and not switch.back_button.isEnabled()
    assert not switch.forward_button.isEnabled()
    switch.set_versions(0, 1)
    assert switch.isHidden()
