"""Browser check: a `matrix-proxy report` rendered by headless Chromium.

Dumps the DOM after the report's script ran and requires that the script finished, that
every chart (one per JSON block) drew marks with no error, and that each chart's SVG holds
at least one mark per series (a line or a point); then saves a screenshot at 1280 px wide
and prints the page to PDF (charts must survive print). Nothing is fetched from the
network: the report is one file.

Usage: python3 tests/interop/report_browser.py REPORT.html SCREENSHOT.png [PDF]
"""

import json
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--hide-scrollbars", "--virtual-time-budget=5000"]


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("report_browser: no chromium on PATH (Debian: apt-get install chromium)")


class Dom(HTMLParser):
    """Figures with their data-drawn / data-error attributes and the marks in each SVG."""

    def __init__(self):
        super().__init__()
        self.figures, self.current, self.ready, self.blocks = [], None, False, []
        self.in_block = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.ready = a.get("data-report-ready") == "true"
        if tag == "figure" and "chart" in a.get("class", "").split():
            self.current = {"id": a.get("id"), "drawn": a.get("data-drawn"), "error": a.get("data-error"),
                            "marks": 0, "svg": 0}
            self.figures.append(self.current)
        if self.current is not None:
            if tag == "svg":
                self.current["svg"] += 1
            if "mark" in (a.get("class") or "").split():
                self.current["marks"] += 1
        if tag == "script" and a.get("class") == "chart-data":
            self.in_block = True
            self.blocks.append("")

    def handle_data(self, data):
        if self.in_block:
            self.blocks[-1] += data

    def handle_endtag(self, tag):
        if tag == "script":
            self.in_block = False
        if tag == "figure":
            self.current = None


def run(args, timeout=120):
    return subprocess.run([chromium(), *FLAGS, *args], capture_output=True, text=True, timeout=timeout)


def main(report: Path, shot: Path, pdf: Path | None) -> int:
    url = report.resolve().as_uri()
    with tempfile.TemporaryDirectory() as profile:
        out = run([f"--user-data-dir={profile}", "--dump-dom", url])
    assert out.returncode == 0, out.stderr[-2000:]
    dom = Dom()
    dom.feed(out.stdout)
    assert dom.ready, "the report's script did not finish (body has no data-report-ready)"
    assert dom.figures, "no chart in the rendered page"
    assert len(dom.figures) == len(dom.blocks), (len(dom.figures), len(dom.blocks))
    marks = 0
    for fig, block in zip(dom.figures, dom.blocks):
        spec = json.loads(block)
        assert fig["error"] is None, f"{fig['id']}: {fig['error']}"
        assert fig["svg"] == 1, f"{fig['id']}: no SVG drawn"
        assert int(fig["drawn"] or 0) == fig["marks"] and fig["marks"] >= len(spec["series"]) > 0, \
            f"{fig['id']}: {fig['marks']} marks for {len(spec['series'])} series"
        marks += fig["marks"]
    shot.parent.mkdir(parents=True, exist_ok=True)
    # Tall enough for the first screen and a few charts; 1280 px is the width charts must read at.
    with tempfile.TemporaryDirectory() as profile:
        s = run([f"--user-data-dir={profile}", f"--screenshot={shot.resolve()}", "--window-size=1280,2200", url])
    assert s.returncode == 0 and shot.exists() and shot.stat().st_size > 10_000, s.stderr[-2000:]
    if pdf is not None:
        with tempfile.TemporaryDirectory() as profile:
            p = run([f"--user-data-dir={profile}", f"--print-to-pdf={pdf.resolve()}", "--no-pdf-header-footer", url])
        assert p.returncode == 0 and pdf.exists() and pdf.read_bytes()[:5] == b"%PDF-", p.stderr[-2000:]
    print(f"report_browser: {len(dom.figures)} charts drawn with {marks} marks in headless Chromium; "
          f"screenshot {shot}" + (f", PDF {pdf}" if pdf else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None))
