"""The README is a front page and docs/ holds the rest: the README stays short, every relative link
in README.md and docs/ reaches a file of the repository, and no file points at documents outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move reference material under docs/"
    text = "\n".join(lines)
    for page in ("docs/design.md", "docs/cli.md", "docs/api.md", "docs/benchmarks.md"):
        assert f"]({page})" in text, f"the README links {page}"
    assert "](docs/dashboard.png)" in text and (ROOT / "docs" / "dashboard.png").is_file()


def test_every_relative_link_reaches_a_file_in_the_repository():
    for md in markdown_files():
        for target in LINK.findall(md.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path = (md.parent / target).resolve()
            assert path.is_relative_to(ROOT), f"{md.name} links {target}, outside the repository"
            assert path.exists(), f"{md.name} links {target}, which does not exist"


def test_no_file_points_at_documents_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for name in tracked:
        if not name.endswith((".py", ".md", ".js", ".html", ".css", ".toml", ".yml", ".yaml", ".cfg", ".txt")):
            continue
        if name == "tests/test_docs.py":
            continue
        for n, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1):
            if "DESIGN.md" in line or "DESIGN 8" in line or "../shared" in line:
                offenders.append(f"{name}:{n}: {line.strip()}")
    assert offenders == [], "\n".join(offenders)
