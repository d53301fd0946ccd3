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
    """The committed figures (``figures/*.png``), served as the site's ``figures/``."""
    for png in sorted((REPO / "figures").glob("*.png")):
        files.append(File(f"figures/{png.name}", str(REPO), config["site_dir"],
                          config["use_directory_urls"]))
    return files


# The README's links, as the home page's.
_README_LINKS = {"](docs/": "](", "](CHANGELOG.md)": "](changelog.md)"}


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "index.md":
        markdown = (REPO / "README.md").read_text(encoding="utf-8")
        for old, new in _README_LINKS.items():
            markdown = markdown.replace(old, new)
        return markdown
    return _PATTERN.sub(lambda m: "](" + _LINKS[m.group(1)], markdown)
