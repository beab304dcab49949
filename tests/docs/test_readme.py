"""The README as a newcomer follows it, from `make demo` on."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_says_where_the_roadie_command_is_before_using_it() -> None:
    """Before: after `make demo`, `roadie init` as "Using it" shows it gave `roadie:
    command not found`; the README never said the command is in the virtual environment
    the Makefile makes. It says so now, before the first command, naming the path the
    Makefile installs it at."""
    readme = (ROOT / "README.md").read_text()
    using = readme.split("## Using it", 1)[1]
    before_first_command = using.split("```sh", 1)[0]
    venv = re.search(r"^VENV := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert venv is not None
    assert f"{venv.group(1)}/bin/roadie" in before_first_command
    assert f". {venv.group(1)}/bin/activate" in before_first_command
