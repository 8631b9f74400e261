"""What a reader's browser makes of a report: headless Chromium opens the page at a laptop's width and says
which figures did not decode, which have no text alternative, whether the page scrolls sideways, how far
the figures are scaled down, and any script error; it can also take the screenshot the docs show.

The report has no script of its own, so the look is taken by a small page beside it that frames the report
(same folder, file access between local files allowed) and writes what it saw into its own DOM, which
Chromium prints (``--dump-dom``).  Used by the report's browser test and by ``scripts/screenshots.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from html import unescape

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
LAPTOP = (1366, 768)  # the most common laptop viewport

PROBE = """<!doctype html><html><head><meta charset="utf-8"></head><body style="margin:0">
<iframe id="f" src="%(page)s" style="width:%(w)dpx;height:%(h)dpx;border:0"></iframe><pre id="seen"></pre>
<script>
const errors = [];
window.addEventListener("error", e => errors.push(String(e.message)));
document.getElementById("f").addEventListener("load", async () => {
  const w = document.getElementById("f").contentWindow, d = w.document;
  w.addEventListener("error", e => errors.push(String(e.message)));
  const imgs = [...d.images];
  await Promise.all(imgs.map(i => i.decode().catch(() => null)));
  const seen = {
    images: imgs.length,
    broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt || i.src.slice(0, 60)),
    without_alt: imgs.filter(i => !(i.alt || "").trim()).map(i => i.src.slice(0, 60)),
    scale: imgs.filter(i => i.naturalWidth > 0).map(i => i.getBoundingClientRect().width / i.naturalWidth),
    page_width: d.documentElement.scrollWidth, viewport: w.innerWidth,
    font_px: parseFloat(w.getComputedStyle(d.body).fontSize),
    scripts: d.querySelectorAll("script").length, errors};
  document.getElementById("seen").textContent = JSON.stringify(seen);
});
</script></body></html>"""


@dataclass(frozen=True)
class Seen:
    images: int
    broken: list[str]
    without_alt: list[str]
    scale: list[float]  # rendered width / natural width of each decoded figure
    page_width: int
    viewport: int
    font_px: float
    scripts: int
    errors: list[str]

    @property
    def scrolls_sideways(self) -> bool:
        return self.page_width > self.viewport

    @property
    def smallest_scale(self) -> float:
        return min(self.scale, default=1.0)


def browser() -> str | None:
    """The first Chromium on PATH, or None."""
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def _run(args: list[str], home: str, timeout: int = 300) -> str:
    exe = browser()
    if exe is None:
        raise FileNotFoundError("no chromium on PATH")
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
           f"--user-data-dir={os.path.join(home, 'profile')}", *args]
    done = subprocess.run(cmd, check=True, capture_output=True, timeout=timeout, text=True,
                          env={**os.environ, "HOME": home})
    return done.stdout


def look(page: str, size: tuple[int, int] = LAPTOP) -> Seen:
    """Open `page` (an HTML file) framed at `size` and return what the browser saw."""
    page = os.path.abspath(page)
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as home:
        probe = os.path.join(os.path.dirname(page), f".look-{os.getpid()}.html")
        with open(probe, "w", encoding="utf-8") as fh:
            fh.write(PROBE % {"page": os.path.basename(page), "w": size[0], "h": size[1]})
        try:
            dom = _run(["--allow-file-access-from-files", "--virtual-time-budget=30000", "--dump-dom",
                        f"file://{probe}"], home)
        finally:
            os.remove(probe)
    match = re.search(r'<pre id="seen">(.*?)</pre>', dom, re.S)
    if not match or not match.group(1).strip():
        raise RuntimeError("the browser reported nothing: the page did not finish loading")
    return Seen(**json.loads(unescape(match.group(1))))


def screenshot(page: str, png: str, width: int, height: int) -> str:
    """A PNG of `page` at width × height."""
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as home:
        _run([f"--window-size={width},{height}", f"--screenshot={os.path.abspath(png)}",
              f"file://{os.path.abspath(page)}"], home)
    return png
