"""The repository stands alone: a clone has everything its files point to.

* No tracked file cites the outside specification or sibling folders the project was
  developed beside (the mathematics is in docs/theory.md, the benchmark peers in
  benchmarks/peers/).
* Every relative link in the project's markdown resolves to a file of the repository, and a
  link with an anchor into a markdown file to one of its headings.
* ``import tpde.grid`` has no side effect on the process: it loads no numba and leaves the
  BLAS thread counts as they were (the thread policy is applied when a solver is built,
  ``tpde.grid.threads``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Spelled in pieces so that this file does not match its own search.
FORBIDDEN = ("MATH" + ".md", "DESIGN" + ".md", "../" + "shared", "shared" + "/peers")

MARKDOWN_GLOBS = (
    "README.md",
    "CHANGELOG.md",
    "docs/**/*.md",
    "examples/**/*.md",
    "benchmarks/**/*.md",
)
SKIPPED_DIRS = {".git", ".venv", "_peers", "build", "out", "node_modules"}

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.decode().split("\0") if name]


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary (NUL bytes or not UTF-8) or missing file."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_no_file_cites_the_outside_specification_or_sibling_folders():
    hits = []
    for path in tracked_files():
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for needle in FORBIDDEN:
                if needle in line:
                    hits.append(f"{path.relative_to(ROOT)}:{number}: {needle}: {line.strip()}")
    assert not hits, "cite docs/theory.md (by section title) instead:\n" + "\n".join(hits)


def markdown_files() -> list[Path]:
    found: set[Path] = set()
    for pattern in MARKDOWN_GLOBS:
        for path in ROOT.glob(pattern):
            if path.is_file() and not SKIPPED_DIRS & set(path.relative_to(ROOT).parts):
                found.add(path)
    return sorted(found)


def prose_lines(text: str):
    """(line number, line) outside code blocks (fenced, or indented by four spaces after a
    blank line), with inline code spans blanked."""
    fenced = indented = False
    previous_blank = True
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        indented = line.startswith(("    ", "\t")) and (previous_blank or indented)
        previous_blank = not line.strip()
        if not fenced and not indented:
            yield number, CODE_SPAN.sub(" ", line)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its text without markup, lower case, with every
    character other than letters, digits, spaces, '-' and '_' dropped and spaces as '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = github_anchor(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            anchors.add(base if count == 0 else f"{base}-{count}")
    return anchors


def test_markdown_files_are_found():
    names = {path.relative_to(ROOT).as_posix() for path in markdown_files()}
    assert {"README.md", "CHANGELOG.md", "docs/theory.md", "docs/architecture.md"} <= names


def test_relative_markdown_links_resolve():
    broken = []
    anchors: dict[Path, set[str]] = {}
    for source in markdown_files():
        for number, line in prose_lines(source.read_text(encoding="utf-8")):
            for match in LINK.finditer(line):
                target = match.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                    continue  # http:, https:, mailto:, ...
                path_part, _, anchor = target.partition("#")
                where = f"{source.relative_to(ROOT)}:{number}: {target}"
                resolved = (source.parent / path_part).resolve() if path_part else source
                if not resolved.exists():
                    broken.append(f"{where} (no such file)")
                    continue
                if not resolved.is_relative_to(ROOT):
                    broken.append(f"{where} (outside the repository)")
                    continue
                if anchor and resolved.suffix == ".md":
                    if resolved not in anchors:
                        anchors[resolved] = anchors_of(resolved)
                    if anchor.lower() not in anchors[resolved]:
                        broken.append(f"{where} (no heading with anchor #{anchor})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_github_anchor_rules():
    assert github_anchor("Paper experiments E1-E6") == "paper-experiments-e1-e6"
    assert github_anchor("Output files (CF-1.10 NetCDF)") == "output-files-cf-110-netcdf"
    assert github_anchor("`tpde run` and `--resume`") == "tpde-run-and---resume"


IMPORT_PROBE = textwrap.dedent(
    """
    import json, os, sys
    import numpy, scipy.linalg  # BLAS loaded before tpde, so its thread counts can be compared
    from threadpoolctl import threadpool_info

    def threads():
        return {(i["internal_api"], i["filepath"]): i["num_threads"] for i in threadpool_info()}

    variables = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                 "NUMBA_NUM_THREADS", "OMP_WAIT_POLICY")
    env_before = {v: os.environ.get(v) for v in variables}
    before = threads()
    import tpde.grid
    after = threads()
    print(json.dumps({
        "numba": sorted(m for m in sys.modules if m == "numba" or m.startswith("numba.")),
        "changed": [f"{k[0]} {k[1]}: {before[k]} -> {after[k]}"
                    for k in before if k in after and before[k] != after[k]],
        "libraries": len(before),
        "env_changed": {v: os.environ.get(v) for v in variables
                        if os.environ.get(v) != env_before[v]},
    }))
    """
)


def test_importing_tpde_grid_loads_no_numba_and_keeps_blas_threads():
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\nimport tpde.grid: {result}")
    assert result["numba"] == [], f"import tpde.grid loaded {result['numba'][:5]}"
    assert result["libraries"] >= 1, "no BLAS / OpenMP library seen: the probe checks nothing"
    assert result["changed"] == [], f"import tpde.grid changed thread counts: {result['changed']}"
    assert result["env_changed"] == {}, f"import tpde.grid set {result['env_changed']}"


def test_a_run_loads_no_fft_library_or_dask_until_it_plans_a_transform():
    """``import tpde.run`` (every ``tpde run``, and the first import of a refused input) loads
    neither pyfftw nor dask: pyfftw brings dask.array, planned only by an FFT engine."""
    probe = (
        "import sys, json; import tpde.run; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'pyfftw', 'dask'})))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\nimport tpde.run loaded: {loaded}")
    assert loaded == [], f"import tpde.run loaded {loaded}"
    from tpde.variants.engines.fft import PlannedFFT

    assert PlannedFFT((8, 8)).backend == "pyfftw", "pyfftw is a dependency: its plans are used"


CITATION = re.compile(r"theory\.md[,:] (?:sections? )?['\"]([^'\"\n<]+)['\"]")


def heading_titles(path: Path) -> set[str]:
    return {
        match.group(1).strip()
        for line in path.read_text(encoding="utf-8").splitlines()
        if (match := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line))
    }


def test_cited_theory_sections_exist():
    """Code and messages cite docs/theory.md as ``docs/theory.md, '<section title>'``: every
    such title is a heading of docs/theory.md."""
    titles = heading_titles(ROOT / "docs" / "theory.md")
    missing = []
    for path in tracked_files():
        text = text_of(path)
        if text is None or path.name == "theory.md":
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for match in CITATION.finditer(line):
                if match.group(1) not in titles:
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {match.group(1)!r}")
    assert not missing, "citations of missing docs/theory.md sections:\n" + "\n".join(missing)
