"""Build the `roadie-plugin` wheel: the modules `roadie.plugin` imports, and nothing else.

    python sdk/build.py [--out dist]

Which modules those are is found by importing the SDK in a fresh interpreter and reading
which of Roadie's modules it loaded, so the wheel follows the code: a module the SDK
starts to import is in the next build, and one it stops importing is not. They are
copied, with sdk/pyproject.toml, sdk/README.md and LICENSE, into a staging folder, where
pip builds the wheel. Prints the wheel's path.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src"
# `import roadie` loads its public names when first used: they are asked for here, as a
# module's author does (`roadie.Module`), so that what they need is in the wheel too.
LOADED = (
    "import sys, roadie, roadie.plugin; [getattr(roadie, name) for name in roadie.__all__]; "
    "print('\\n'.join(sorted(m for m in sys.modules if m.split('.')[0] == 'roadie')))"
)


def sdk_files() -> list[Path]:
    """The source files of every Roadie module the SDK loads, relative to src/."""
    names = subprocess.run(
        [sys.executable, "-c", LOADED],
        capture_output=True,
        text=True,
        check=True,
        cwd=SOURCE,
        env={"PYTHONPATH": str(SOURCE)},
    ).stdout.split()
    files = []
    for name in names:
        path = Path(*name.split("."))
        files.append(path / "__init__.py" if (SOURCE / path).is_dir() else path.with_suffix(".py"))
    return [*files, Path("roadie/py.typed")]


def build(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="roadie-plugin-") as staging:
        home = Path(staging)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / "sdk" / name, home / name)
        shutil.copy(ROOT / "LICENSE", home / "LICENSE")
        for file in sdk_files():
            (home / "src" / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(SOURCE / file, home / "src" / file)
        for old in out.glob("roadie_plugin-*.whl"):
            old.unlink()
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(home)], check=True
        )
    [wheel] = out.glob("roadie_plugin-*.whl")
    return wheel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the wheel goes (default: dist/)")
    print(build(parser.parse_args().out))


if __name__ == "__main__":
    main()
