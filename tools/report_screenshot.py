"""Screenshot the front page of a Snakemake report in headless Chromium.

    python tools/report_screenshot.py results/report.html front.png

Needs Playwright and its Chromium (`pip install playwright && playwright install chromium`),
which are not in requirements.txt: the machines this project is built on cannot download
browsers, so no test depends on it. The page is a single-file app that renders its front page
(the workflow description: headline table first) after load, hence the wait.
"""

import sys
from pathlib import Path


def screenshot(report: Path, out: Path, width: int = 1400, height: int = 1000) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch()
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(report.resolve().as_uri())
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(1000)  # the report's React app renders after load
        page.screenshot(path=str(out), full_page=False)
        browser.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    screenshot(Path(sys.argv[1]), Path(sys.argv[2]))
