"""Each benchmark owns one section of docs/benchmarks.md and rewrites only that section."""

from __future__ import annotations

from pathlib import Path

TITLE = "# Benchmarks\n\nFigures from real runs on this kind of machine; each section names the command that made it.\n"


def markers(script: str) -> tuple[str, str]:
    return f"<!-- benchmarks/{script}: begin -->", f"<!-- benchmarks/{script}: end -->"


def write_section(path: Path, script: str, body: str) -> None:
    """Put `body` between `script`'s markers in `path`, replacing what was there."""
    begin, end = markers(script)
    section = f"{begin}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else TITLE
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
