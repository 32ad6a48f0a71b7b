"""The documentation: README.md is a short front door, docs/ holds the rest, and the mkdocs
site builds with no broken page, link or anchor (issue 26)."""

import os
import re
import subprocess
import sys

import yaml
from conftest import ROOT

README_MAX_LINES = 250


def nav_pages(nav) -> set[str]:
    """Every page named in mkdocs.yml's nav, however deeply nested."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*map(nav_pages, nav)) if nav else set()
    if isinstance(nav, dict):
        return set().union(*map(nav_pages, nav.values())) if nav else set()
    return set()


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: a missing page, a broken link or anchor, a page left out of the
    nav or a missing README section (docs/index.md includes README.md's) fails it."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").exists()


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_every_docs_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    missing = pages - nav_pages(config["nav"])
    assert not missing, f"docs pages not in mkdocs.yml's nav: {sorted(missing)}"
    assert nav_pages(config["nav"]) <= pages, "the nav names a page that does not exist"


def test_the_readme_links_into_docs_resolve():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((docs/[^)#\s]*)(?:#[^)\s]*)?\)", readme)
    assert targets, "README.md links to no docs page"
    broken = [t for t in targets if not (ROOT / t).is_file()]
    assert not broken, f"README.md links to missing files: {broken}"
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}
    unlinked = pages - set(targets)
    assert not unlinked, f"README.md's Read on does not link {sorted(unlinked)}"


def readme_commands() -> list[str]:
    """The command lines of README.md's bash blocks, comments stripped."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_the_readme_commands_work_as_written_after_make_quick():
    """Issue 32: every `make X` is a Makefile target; `distinctcap` comes after the line that
    puts .venv/bin on the PATH, parses as the command's own parser parses it, and names only
    paths that `make quick` writes (its experiment folder and the files in it); the image
    named is one of the quick world's test images."""
    from distinctcap.core.config import read_configs
    from distinctcap.runs.cli import parser

    commands = readme_commands()
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    for line in commands:
        if line.startswith("make "):
            assert line.split()[1] in targets, line
    path_line = commands.index('export PATH="$PWD/.venv/bin:$PATH"')
    cli = [i for i, line in enumerate(commands) if line.startswith("distinctcap ")]
    assert cli and min(cli) > path_line
    quick = re.search(r"^QUICK := (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    world = read_configs([ROOT / "config.yaml", ROOT / "presets/quick.yaml"])["data"]["shapes"]
    for i in cli:
        words = commands[i].split()[1:]
        parser().parse_args(words)  # exits (fails the test) on a wrong option or argument
        for word in words:
            if "/" in word:
                assert word.startswith(f"{quick}/results/"), commands[i]
            image = re.search(r"images/(\d+)\.png$", word)
            if image:
                first_test = world["n_train"] + world["n_val"]
                assert first_test <= int(image.group(1)) < first_test + world["n_test"], word
