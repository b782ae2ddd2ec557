"""tools/take_screenshots.py refuses to run without an X server (the README's pictures come from the real
window under Xvfb, not Qt's offscreen platform), saying how to run it, and writes nothing then.

Bad inputs tried: the offscreen platform, no DISPLAY.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_tool():
    # tools/ is not a package: load the script by its path.
    spec = importlib.util.spec_from_file_location("take_screenshots", REPO / "tools" / "take_screenshots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


take_screenshots = _load_tool()


@pytest.mark.parametrize(("platform", "display"), [("offscreen", ":0"), (None, None)])
def test_refuses_without_an_x_server(tmp_path, monkeypatch, capsys, platform, display):
    for name, value in (("QT_QPA_PLATFORM", platform), ("DISPLAY", display)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    out = tmp_path / "shots"
    with pytest.raises(SystemExit) as e:
        take_screenshots.main(["--out", str(out)])
    assert e.value.code == 2
    assert 'xvfb-run -s "-screen 0 1400x900x24" python tools/take_screenshots.py' in capsys.readouterr().err
    assert not out.exists()
