"""mkdocs hook (mkdocs.yml `hooks:`): docs/index.md includes README.md's sections.

A line `--8<-- "README.md:NAME"` of a page becomes the README's text between
`<!-- --8<-- [start:NAME] -->` and `<!-- --8<-- [end:NAME] -->`, its links into the docs
rewritten from the repository root's `docs/PAGE.md` to the site's `PAGE.md`: one link that
works on GitHub and in the site, which `mkdocs build --strict` checks, anchors included
(tests/test_docs.py). A missing section stops the build."""

from __future__ import annotations

import re
from pathlib import Path

INCLUDE = re.compile(r'^--8<-- "README\.md:([\w-]+)"$', re.M)


def readme_section(readme: str, name: str) -> str:
    """The README's text between the markers of section `name`."""
    start, end = f"<!-- --8<-- [start:{name}] -->", f"<!-- --8<-- [end:{name}] -->"
    if start not in readme or end not in readme:
        raise ValueError(f"README.md has no section {name!r} ({start} ... {end})")
    return readme.split(start, 1)[1].split(end, 1)[0]


def site_links(text: str) -> str:
    """`](docs/configuration.md#x)` -> `](configuration.md#x)`: the path from docs/."""
    return text.replace("](docs/", "](")


def on_page_markdown(markdown: str, page, config, files) -> str:
    if not INCLUDE.search(markdown):
        return markdown
    readme = (Path(config.config_file_path).parent / "README.md").read_text()
    return INCLUDE.sub(lambda m: site_links(readme_section(readme, m.group(1))), markdown)
