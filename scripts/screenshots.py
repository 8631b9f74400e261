"""The PNGs under docs/img/: sections of the committed reference report and a plan page, drawn by
headless Chromium at a laptop's width (the report's browser test looks at the same pages the same way,
:mod:`ckptbench.report.browser`) and cropped to what they show.

    python scripts/screenshots.py          # needs chromium on PATH and the package installed (make install)

Each picture is one section of a page the repository makes (the page's own style kept), so it shows what
a reader of that page sees: the reference report's headline and memory timeline
(``reports/reference-cpu-timed.html``), and the plan of Llama-8B with LoRA on an H100 (``ckptbench plan``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

from PIL import Image

from ckptbench.report.browser import LAPTOP, look, screenshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "img")
WIDTH = LAPTOP[0]


def section_page(html: str, section: str | None) -> str:
    """The page with only one of its sections (all of it when `section` is None), its head kept."""
    if section is None:
        return html
    head = html[: html.index("<body")]
    match = re.search(rf'<section id="{section}">.*?</section>', html, re.S)
    if not match:
        raise SystemExit(f"no section {section!r} in the page")
    return f'{head}<body><main>{match.group(0)}</main></body></html>'


def shoot(html: str, png: str, height: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        page = os.path.join(tmp, "page.html")
        with open(page, "w", encoding="utf-8") as fh:
            fh.write(html)
        seen = look(page)
        if seen.broken or seen.without_alt or seen.scrolls_sideways:
            raise SystemExit(f"{png}: the page does not read at {LAPTOP[0]} px: {seen}")
        screenshot(page, png, WIDTH, height)
    crop(png)
    print(png)


def crop(png: str, margin: int = 24) -> None:
    """Cut the blank space below the last drawn row."""
    image = Image.open(png).convert("RGB")
    inverted = Image.eval(image.convert("L"), lambda v: 255 if v < 250 else 0)  # drawn pixels white
    box = inverted.getbbox()
    if box:
        image.crop((0, 0, image.width, min(image.height, box[3] + margin))).save(png)


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(ROOT, "reports", "reference-cpu-timed.html"), encoding="utf-8") as fh:
        report = fh.read()
    shoot(section_page(report, "headline"), os.path.join(OUT, "report-headline.png"), 1400)
    shoot(section_page(report, "timeline"), os.path.join(OUT, "report-timeline.png"), 1600)
    with tempfile.TemporaryDirectory() as tmp:
        plan = os.path.join(tmp, "plan.html")
        subprocess.run([sys.executable, "-m", "ckptbench", "plan", "--model", "llama-8b", "--device", "h100",
                        "--seq", "8192", "--lora", "16", "--html", plan], check=True, capture_output=True, cwd=ROOT)
        with open(plan, encoding="utf-8") as fh:
            page = fh.read()
    shoot(section_page(page, None), os.path.join(OUT, "plan-page.png"), 1400)


if __name__ == "__main__":
    main()
