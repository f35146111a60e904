"""Docs and code speak of what the system is and does, not of how it was developed: no issue
numbers, development rounds, reverted attempts or the machine it was written on.

Scans every text file of the repository (sources, tests, benchmarks, scripts, docs,
configs) outside dot-directories and build output. Run:
``.venv/bin/python -m pytest tests/test_no_history.py -q``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HISTORY = re.compile(
    r"\b[Ii]ssue\s*#\s*\d+"  # issue #6, Issue #12
    r"|\b[Ii]ssues?\s+\d+\b"  # issue 22
    r"|\b(?:[Pp]revious|[Ff]irst|[Ss]econd|[Tt]hird|[Ff]ourth|[Ff]ifth|[Ss]ixth|[Dd]evelopment) rounds?\b"
    r"|\b[Rr]ound \d+\b"  # round 3
    r"|\bthis (?:\d+-core|dev(?:elopment)?) machine\b"
    r"|\btried and reverted\b"
    r"|\b[Ff]ollow-up\b"
    r"|\b[Ww]e tried\b"
)
"""Words that tell development history (each alternative is one way it was told)."""

TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".conf", ".cfg", ".ini", ".sh", ".txt", ".js", ".css",
                 ".html", ".json", ".env", ".example"}
TEXT_NAMES = {"Dockerfile", "Makefile"}
SKIP_DIRS = {"__pycache__", "node_modules", "build", "dist", "out"}

EXCLUDED = {
    Path(__file__).resolve(): "this test names the words it looks for",
}
EXCLUDED_TREES: dict[Path, str] = {}


def text_files(root: Path = ROOT):
    """Every text file under ``root`` outside dot-directories, build output and exclusions."""
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS
                             and not d.endswith(".egg-info") and here / d not in EXCLUDED_TREES)
        for name in sorted(filenames):
            path = here / name
            if path in EXCLUDED or path in EXCLUDED_TREES or name == "uv.lock":
                continue
            if path.suffix in TEXT_SUFFIXES or name in TEXT_NAMES or here.name == "scripts":
                yield path


def findings(root: Path = ROOT) -> list[str]:
    out = []
    for path in text_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for m in HISTORY.finditer(line):
                out.append(f"{path.relative_to(root)}:{n}: {m.group(0)!r} in {line.strip()[:120]!r}")
    return out


def test_no_development_history_in_docs_or_code() -> None:
    found = findings()
    assert not found, "development history (say what it is and does now; git keeps the history):\n" + "\n".join(found)


def test_the_scan_sees_each_kind_of_history(tmp_path: Path) -> None:
    """The scan itself: each way of telling history is found, present-tense text is not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "Added for issue #6.\nSee issue 22.\nPrevious round: 3 s.\nIn the third round we tried X.\n"
        "Round 2 measured it on this 2-core machine.\nA queue, tried and reverted.\nA follow-up fixes it.\n")
    (tmp_path / "x.py").write_text('"""Measured on this dev machine."""\n')
    (tmp_path / "ok.py").write_text('"""Retries on the next round of reconciliation; issues a command."""\n')
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "b.md").write_text("issue #1\n")
    found = findings(tmp_path)
    words = [f.split(": ", 1)[1].split(" in ")[0] for f in found]
    assert words == ["'this dev machine'", "'issue #6'", "'issue 22'", "'Previous round'", "'third round'",
                     "'we tried'", "'Round 2'", "'this 2-core machine'", "'tried and reverted'", "'follow-up'"]
    assert [f.split(":")[0] for f in found] == ["x.py"] + ["docs/a.md"] * 9
