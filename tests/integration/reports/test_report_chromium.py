"""A report page opened in headless Chromium (Debian's `chromium`): it loads from disk, every
embedded figure decodes in the browser, nothing is logged to the console, and a screenshot is taken.
Skipped where no chromium binary is installed."""
from __future__ import annotations

import re
import shutil
import subprocess

import matplotlib.image as mpimg
import pytest

from partita.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.chromium,
              pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")]

HARNESS = """<html><body><iframe id="f" src="{page}" onload="check()"></iframe><script>
function check() {{
  const imgs = [...document.getElementById("f").contentDocument.images];
  const bad = imgs.filter(i => !i.complete || i.naturalWidth === 0);
  console.log("IMAGES " + imgs.length + " BAD " + bad.length);
}}</script></body></html>"""


def chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--enable-logging=stderr", "--v=0", *args],
                          capture_output=True, text=True, timeout=120)


def test_memory_page_loads_without_console_errors(tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["report", "memory", "llama2-70b-h100", "-o", str(out)]) == 0
    page = (out / "memory.html").resolve().as_uri()
    shot = tmp_path / "shot.png"
    run = chromium("--hide-scrollbars", "--window-size=1200,1400", f"--screenshot={shot}", page)
    assert run.returncode == 0, run.stderr[-2000:]
    console = [line for line in run.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console
    pixels = mpimg.imread(shot)
    assert pixels.shape[:2] == (1400, 1200) and (pixels != pixels[0, 0]).any()

    harness = tmp_path / "harness.html"
    harness.write_text(HARNESS.format(page=page))
    run = chromium("--allow-file-access-from-files", "--virtual-time-budget=5000", "--dump-dom",
                   harness.resolve().as_uri())
    logged = re.findall(r'"IMAGES (\d+) BAD (\d+)"', run.stderr)
    assert logged == [("1", "0")], run.stderr[-2000:]
    assert not [line for line in run.stderr.splitlines()
                if "CONSOLE" in line and "memory.html" in line]
