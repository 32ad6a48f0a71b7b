"""The documentation: README.md is a short front door, docs/ holds the rest, and the mkdocs
site builds with no broken page, link or anchor (issue 26)."""

import json
import os
import re
import subprocess
import sys

import pytest
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
    from distinctcap.core.configfile import read_configs
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


# Issue 48 item 4: the README is a front door, not a log. Each fact below is a number the README
# states and a docs page (or the file that made it) states too; each pattern matches once.
SHIPPED_CLIP = ROOT / "assets/clip/shapes-rn-tiny.json"
DURATION = r"(\d+ min \d+ s)"
FACTS = {  # name: {file: pattern whose group 1 is the number}
    "the shipped CLIP's val R@1 image->text": {
        "README.md": r"val R@1 image->text (\d\.\d+)",
        "docs/configuration.md": r"\| 240 \(default[^\n]*the shipped weights [^|\n]*: (\d\.\d+) \|",
    },
    "make run's wall clock at dff6ae7, the run that printed the README table": {
        "README.md": r"\| `make run` \|[^\n]*\| " + DURATION + r" \|",
        "docs/performance.md": r"\| 6 \| dff6ae7 [^|]*\| \d+ s \(" + DURATION + r"\)",
    },
    "the effects that hold on every seed": {
        "README.md": r"(\w+) of the ten effects",
        "docs/seeds.md": r"\n(\w+) of the ten hold on every seed",
    },
    "UNKT's sampled CIDEr, teacher reading": {
        "README.md": r"sampled\s+CIDEr (\d\.\d+) vs",
        "docs/unkt-sampled-captions.md": r"sampled CIDEr-D (\d\.\d+) ± [\d.]+ vs",
    },
    "UNKT's oracle CIDEr@20, teacher reading": {
        "README.md": r"oracle CIDEr@20 (\d\.\d+ ± \d\.\d+) vs",
        "docs/unkt-sampled-captions.md": r"oracle CIDEr-D@20 of (\d\.\d+ ± \d\.\d+) against",
    },
    "the reference's oracle CIDEr@20": {
        "README.md": r"the reference (\d\.\d+ ± \d\.\d+)\)",
        "docs/unkt-sampled-captions.md": r"against the reference's (\d\.\d+ ± \d\.\d+) \(gold",
    },
    # Issue 59: "Supported torch versions" names each version as the file that pins it
    "the pinned torch, CI's": {
        "README.md": r"torch ([\d.]+) and torchvision [\d.]+ \(requirements\.txt's pins",
        "requirements.txt": r"(?m)^torch==([\d.]+)$",
    },
    "the pinned torchvision, CI's": {
        "README.md": r"torch [\d.]+ and torchvision ([\d.]+) \(requirements\.txt's pins",
        "requirements.txt": r"(?m)^torchvision==([\d.]+)$",
    },
    "the lent GPU machine's torch, the rehearsal's": {
        "README.md": r"torch ([\d.]+) and torchvision [\d.]+ \(the lent GPU machine's",
        "bench/gpu/torch.txt": r"(?m)^torch==([\d.]+)$",
    },
    "the lent GPU machine's torchvision, the rehearsal's": {
        "README.md": r"torch [\d.]+ and torchvision ([\d.]+) \(the lent GPU machine's",
        "bench/gpu/torch.txt": r"(?m)^torchvision==([\d.]+)$",
    },
}


def stated(name: str) -> dict[str, str]:
    """Each file's statement of fact `name`: the one match of its pattern, lower case."""
    found = {}
    for file, pattern in FACTS[name].items():
        hits = re.findall(pattern, (ROOT / file).read_text())
        assert len(hits) == 1, f"{name}: {file} states it {len(hits)} times ({pattern})"
        found[file] = hits[0].lower()
    return found


@pytest.mark.parametrize("name", FACTS)
def test_a_number_the_readme_shares_with_the_docs_is_the_same(name):
    """The README gave the CLIP's val R@1 as 0.945, docs/configuration.md as 0.92."""
    found = stated(name)
    assert len(set(found.values())) == 1, found


def test_the_readme_states_the_shipped_clips_recall_as_its_manifest():
    recall = json.loads(SHIPPED_CLIP.read_text())["val_retrieval"]
    readme = (ROOT / "README.md").read_text()
    said = re.search(r"image->text (\d\.\d+) / text->image (\d\.\d+), chance (\d\.\d+)", readme)
    keys = ("image_to_text_R@1", "text_to_image_R@1", "chance_R@1")
    assert said and said.groups() == tuple(f"{recall[k]:.3f}" for k in keys), said


def test_each_command_has_one_time():
    """`make run` had three times (24:55, 14:03 at 398a1c1, 41:12 at 4223587); a table row and
    the results section give one time each, from the one sitting the README names."""
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `(?:make|snakemake) [^`]*` \|.*\|$", readme, re.M)
    assert rows and all(len(re.findall(DURATION, row)) == 1 for row in rows), rows
    results = readme[readme.index("## Results on the shapes default"):]
    assert not re.search(DURATION, results), "the results section repeats a time"


def test_the_readmes_cross_references_are_links():
    """(Configuration, "The shapes world") and the like were plain text."""
    readme = (ROOT / "README.md").read_text()
    titles = "|".join(re.escape(t) for t in ("docs", "GPUs and SLURM", "Configuration",
                                              "Performance", "Runs over several seeds"))
    plain = re.findall(rf'\((?:{titles})(?:, "[^"]+")?\)', readme)
    assert not plain, plain
    ten = readme[readme.index("nine of the ten effects"):][:300]  # they were never listed
    assert "](docs/seeds.md#measured)" in ten, ten


def test_the_readme_uses_no_changelog_wording():
    """'UNKT now beats' reads as a changelog; the README says what is."""
    readme = (ROOT / "README.md").read_text()
    assert not re.findall(r"\b(?:now beats|no longer|used to|since commit)\b", readme, re.I)
