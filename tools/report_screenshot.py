"""Screenshot the front page of a Snakemake report in headless Chromium.

    python tools/report_screenshot.py results/report.html front.png [--width 1400 --height 1000]

Needs Debian's `chromium` package (`apt-get install chromium`, or `.ci/chromium/install.sh`),
driven through its command line by `distinctcap.report.browser`: no Playwright, no downloaded
browser. The page is a single-file app that draws its front page (the workflow description:
headline table first) after load; the browser gives it a virtual-time budget first. CI runs the
same code on a real report (tests/test_pipeline.py) and fails without the browser.
"""

import argparse
import sys
from pathlib import Path

from distinctcap.core.errors import DistinctcapError
from distinctcap.report.browser import screenshot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="report.html from snakemake --report")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1000)
    args = parser.parse_args(argv)
    try:
        print(screenshot(args.report, args.out, args.width, args.height))
    except DistinctcapError as err:
        print(f"report_screenshot: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
