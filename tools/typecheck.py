"""Run mypy over the package as it is installed, printing source-tree paths.

pyproject.toml maps the subpackages onto top-level folders (``tpde.grid`` is ``grid/``,
``tpde.schemes`` is ``schemes/``, ...; ``[tool.setuptools.package-dir]``). An editable
install resolves that mapping with an import hook, which mypy does not run, so this script
lays the package out once more as ``build/typecheck/tpde/`` (symlinks only, rebuilt on each
run from package-dir), points mypy at it (``mypy_path`` in ``[tool.mypy]``) and rewrites
the paths in mypy's report back to the files you edit. Arguments go on to mypy.

    .venv/bin/python tools/typecheck.py            # what `make test` / `make lint` run
"""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"


def build_tree() -> None:
    """Symlink tree of the installed layout: top package folder real, subpackages linked."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(TREE, ignore_errors=True)
    for name, src in sorted(package_dir.items(), key=lambda item: item[0].count(".")):
        dest = TREE.joinpath(*name.split("."))
        if "." not in name:
            dest.mkdir(parents=True)
            for f in sorted((ROOT / src).iterdir()):
                if f.suffix in (".py", ".pyi"):
                    (dest / f.name).symlink_to(os.path.relpath(f, dest))
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.symlink_to(os.path.relpath(ROOT / src, dest.parent), target_is_directory=True)


def source_path(line: str) -> str:
    """``build/typecheck/tpde/grid/grid.py:3: error ...`` -> ``grid/grid.py:3: error ...``."""
    path, sep, rest = line.partition(":")
    if sep and path.startswith(os.path.relpath(TREE, ROOT)) and os.path.exists(path):
        return os.path.relpath(os.path.realpath(path), ROOT) + sep + rest
    return line


def main(argv: list[str]) -> int:
    from mypy import api

    os.chdir(ROOT)
    build_tree()
    stdout, stderr, status = api.run(argv)
    sys.stdout.write("".join(source_path(line) for line in stdout.splitlines(keepends=True)))
    sys.stderr.write(stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
