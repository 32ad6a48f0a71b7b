"""The report as a researcher sees it: `snakemake --report`'s report.html opened in headless
Chromium (Debian's `chromium` package; `.ci/chromium/install.sh`), through its command line,
no Playwright. The report is a single-file app that draws its front page after load, so every
call gives the page a virtual-time budget (timers and script run ahead without real waiting)
before Chromium dumps the DOM or takes the screenshot. `parse_page` reads the dumped DOM back:
its visible text and its tables, in the order a reader meets them; `layout` measures where
elements sit in the window (a DOM can hold the headline table where no reader can see it).

Light (subprocess, tempfile, html.parser): no torch, no pandas.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from distinctcap.core.errors import DistinctcapError

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# A fresh profile, no network, nothing in the background: the same page every call.
FLAGS = (
    "--headless",
    "--no-sandbox",  # as root (CI containers) Chromium refuses to start sandboxed
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
# Virtual milliseconds the app gets after load. Snakemake 9's report draws its front page while
# loading (a 1 ms budget already showed it), so this is margin for timers; virtual time runs
# ahead of the clock: 10 s of it took no longer than 1 ms (about 2.5 s a call on 2 busy cores).
VIRTUAL_TIME_MS = 10_000


def window(width: int, height: int) -> list[str]:
    """Flags for a `width` x `height` viewport. --window-size alone leaves headless Chromium's
    page 143 px shorter than the screenshot (room for a browser bar it does not draw, measured
    with Chromium 156): the app's window-high parts then stop short in the picture, and layout
    is measured in a window other than the one shown. A screen of that size and kiosk mode (no
    browser bar) make the viewport exactly the screenshot."""
    return [f"--window-size={width},{height}", f"--screen-info={{{width}x{height}}}", "--kiosk"]


def find_chromium() -> str:
    """The Chromium binary: $DISTINCTCAP_CHROMIUM, else the first of CANDIDATES on PATH."""
    named = os.environ.get("DISTINCTCAP_CHROMIUM")
    if named:
        found = shutil.which(named)
        if found is None:
            raise DistinctcapError(f"DISTINCTCAP_CHROMIUM={named} is not an executable")
        return found
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    raise DistinctcapError(
        "no Chromium found (looked for " + ", ".join(CANDIDATES) + " on PATH): install "
        "Debian's `chromium` package (`apt-get install chromium`, or .ci/chromium/install.sh), "
        "or name a binary with DISTINCTCAP_CHROMIUM"
    )


def run_chromium(
    report_html: Path, *args: str, virtual_time_ms: int = VIRTUAL_TIME_MS, timeout: int = 120
) -> subprocess.CompletedProcess:
    """Chromium on `report_html` with FLAGS, a new temporary profile and `args`."""
    report_html = Path(report_html)
    if not report_html.is_file():
        raise DistinctcapError(f"no report at {report_html} (build it with `make report`)")
    with tempfile.TemporaryDirectory(prefix="distinctcap-chromium-") as profile:
        cmd = [
            find_chromium(),
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={virtual_time_ms}",
            *args,
            report_html.resolve().as_uri(),
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise DistinctcapError(f"Chromium took over {timeout} s on {report_html}") from err
    if done.returncode != 0:
        raise DistinctcapError(
            f"Chromium failed (exit {done.returncode}) on {report_html}: {done.stderr[-2000:]}"
        )
    return done


def render_dom(report_html: Path, virtual_time_ms: int = VIRTUAL_TIME_MS) -> str:
    """The report's DOM after its app has drawn the front page (serialized HTML)."""
    return run_chromium(report_html, "--dump-dom", virtual_time_ms=virtual_time_ms).stdout


# Appended to a copy of the report: once the app has drawn, the window's size and each
# selector's first element's box (relative to the window) go into an attribute of <html>.
PROBE = """<script>
window.addEventListener("load", () => setTimeout(() => {
  const boxes = {};
  for (const [name, selector] of Object.entries(%s)) {
    const found = document.querySelector(selector);
    const box = found && found.getBoundingClientRect();
    boxes[name] = box && {top: box.top, bottom: box.bottom, left: box.left, right: box.right};
  }
  boxes.window = {width: window.innerWidth, height: window.innerHeight};
  document.documentElement.setAttribute("data-distinctcap-layout", JSON.stringify(boxes));
}, 500));
</script>"""


def layout(
    report_html: Path,
    selectors: dict[str, str],
    width: int = 1400,
    height: int = 1000,
    virtual_time_ms: int = VIRTUAL_TIME_MS,
) -> dict[str, dict | None]:
    """Where the first element matching each of `selectors` ({name: CSS selector}) sits in a
    `width` x `height` window, unscrolled: {name: {top, bottom, left, right} in CSS pixels, or
    None when nothing matches}, and "window": the viewport's {width, height}."""
    report_html = Path(report_html)
    if not report_html.is_file():
        raise DistinctcapError(f"no report at {report_html} (build it with `make report`)")
    page = report_html.read_text()
    end = page.rfind("</body>")
    if end < 0:
        raise DistinctcapError(f"{report_html} has no </body>: not a report")
    probe = PROBE % json.dumps(selectors)
    with tempfile.TemporaryDirectory(prefix="distinctcap-layout-") as tmp:
        probed = Path(tmp) / report_html.name
        probed.write_text(page[:end] + probe + page[end:])
        dom = run_chromium(
            probed, *window(width, height), "--dump-dom", virtual_time_ms=virtual_time_ms
        ).stdout
    found = re.search(r'data-distinctcap-layout="([^"]*)"', dom)
    if found is None:
        raise DistinctcapError(f"the layout probe did not run in {report_html}")
    return json.loads(html.unescape(found.group(1)))


def screenshot(
    report_html: Path,
    out_png: Path,
    width: int = 1400,
    height: int = 1000,
    virtual_time_ms: int = VIRTUAL_TIME_MS,
) -> Path:
    """A PNG of the report's first `width` x `height` pixels, as a window that size shows it."""
    out_png = Path(out_png).resolve()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    out_png.unlink(missing_ok=True)  # a PNG left from before must not pass for this one
    done = run_chromium(
        report_html,
        f"--screenshot={out_png}",
        *window(width, height),
        virtual_time_ms=virtual_time_ms,
    )
    if not out_png.is_file():
        raise DistinctcapError(f"Chromium wrote no screenshot to {out_png}: {done.stderr[-2000:]}")
    return out_png


@dataclass
class Table:
    at: int  # offset in Page.text where the table starts
    rows: list[list[str]] = field(default_factory=list)  # cell texts, header rows included


@dataclass
class Page:
    text: str  # the visible text, whitespace collapsed to single spaces
    tables: list[Table]  # in document order


# Never shown: the report's inlined code and data, and elements styled out of sight (its
# "Loading Snakemake Report..." screen, display: none once the app is up).
HIDDEN = {"script", "style", "noscript", "template", "head"}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}  # fmt: skip


def _hides(tag: str, attrs: list[tuple[str, str | None]]) -> bool:
    style = "".join((dict(attrs).get("style") or "").split()).lower()
    return tag in HIDDEN or "display:none" in style or any(k == "hidden" for k, _ in attrs)


class _PageParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.length = 0
        self.stack: list[tuple[str, bool]] = []  # open elements: (tag, hidden from here down)
        self.tables: list[Table] = []
        self.open: list[Table] = []  # nested tables: innermost last
        self.cell: list[str] | None = None

    @property
    def hidden(self) -> bool:
        return bool(self.stack) and self.stack[-1][1]

    def handle_starttag(self, tag, attrs):
        hidden = self.hidden or _hides(tag, attrs)
        if tag not in VOID:
            self.stack.append((tag, hidden))
        if hidden:
            return
        if tag == "table":
            self.open.append(Table(at=self.length))
            self.tables.append(self.open[-1])
        elif tag == "tr" and self.open:
            self.open[-1].rows.append([])
        elif tag in ("td", "th") and self.open:
            self.cell = []

    def handle_endtag(self, tag):
        if tag not in {t for t, _ in self.stack}:
            return  # a stray end tag
        while self.stack:
            top, hidden = self.stack.pop()
            if top == tag:
                break
        if hidden:
            return
        if tag in ("td", "th") and self.cell is not None and self.open:
            if not self.open[-1].rows:
                self.open[-1].rows.append([])
            self.open[-1].rows[-1].append(" ".join("".join(self.cell).split()))
            self.cell = None
        elif tag == "table" and self.open:
            self.open.pop()

    def handle_data(self, data):
        if self.hidden:
            return
        if self.cell is not None:
            self.cell.append(data)
        words = " ".join(data.split())
        if words:
            self.text.append(words)
            self.length += len(words) + 1


def parse_page(dom: str) -> Page:
    """The visible text and the tables of a DOM (e.g. `render_dom`'s), scripts left out."""
    parser = _PageParser()
    parser.feed(dom)
    parser.close()
    return Page(text=" ".join(parser.text), tables=parser.tables)
