"""MkDocs hooks of the documentation site (mkdocs.yml): the pages keep the links that work
where they are read on a forge (``../figures/x.png``, ``../CHANGELOG.md``), and the site
serves the repository's figures and maps those links to its own pages. Its home page is
the README, with the README's links made the site's."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parent.parent
# Links out of docs/ and what they are on the site.
_LINKS = {"../README.md": "index.md", "../CHANGELOG.md": "changelog.md",
          "../figures/": "figures/"}
_PATTERN = re.compile(r"\]\((" + "|".join(re.escape(k) for k in _LINKS) + r")")


def on_files(files, config):
    """The committed figures and their data (``figures/*.png|csv``), served as the site's
    ``figures/``."""
    for path in sorted([*(REPO / "figures").glob("*.png"), *(REPO / "figures").glob("*.csv")]):
        files.append(File(f"figures/{path.name}", str(REPO), config["site_dir"],
                          config["use_directory_urls"]))
    return files


# The README's links (an anchor after them kept), as the home page's.
_README_LINKS = re.compile(r"\]\((?:docs/([^)]*)|CHANGELOG\.md((?:#[^)]*)?))\)")


def _readme_link(m: re.Match) -> str:
    return f"]({m.group(1)})" if m.group(1) is not None else f"](changelog.md{m.group(2)})"


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "index.md":
        return _README_LINKS.sub(_readme_link, (REPO / "README.md").read_text(encoding="utf-8"))
    return _PATTERN.sub(lambda m: "](" + _LINKS[m.group(1)], markdown)
