"""The docs run as written and quote what the code prints.

* Every fenced ``python`` or ``bash`` block of README.md and docs/ whose first line is a
  ``# doc-test`` marker is executed, in a temporary folder holding a copy of ``examples/``
  (run in the order of its page, so a later block may read what an earlier one wrote). The
  marker takes options, separated by spaces:

  - ``cells=N``: every ``cells`` of the copied TOML files, and every ``cells=[...]`` of a
    Python block, becomes N per axis (small grids);
  - ``t_end=T``: every ``t_end`` of the copied TOML files and ``t_end=...`` of a Python block
    becomes T (short runs); ``snapshots=K``: every snapshot count of the TOML files becomes K;
  - ``needs PATH``: the block reads PATH, written by an earlier block of the page;
  - ``slow``: run under ``-m slow`` only; ``skip (why)``: never run here (the reason names the
    test that runs it).

  Bash blocks hold ``mkdir -p DIR`` and ``.venv/bin/tpde ...`` lines, run in this process
  (``tpde.cli.main``) and expected to exit 0; other lines go to ``bash -e``.
* The numbers of docs/validation.md's checked tables (a key in the first column, the quoted
  value in the third) are recomputed on small runs and compared within the digits quoted;
  the same numbers quoted on other pages must be the table's.
* The reference pages (docs/reference/) are what tools/reference.py generates from the code,
  and tpde.schema documents exactly the keys the configuration code reads.
"""

from __future__ import annotations

import importlib.util
import math
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"^#\s*doc-test\b:?\s*(.*)$")
FENCE = re.compile(r"^```(python|bash)\s*$")


@dataclass
class Block:
    page: Path
    line: int
    language: str
    code: str
    options: dict

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"


def parse_options(text: str) -> dict:
    options: dict = {}
    words = text.split()
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("skip", "slow"):
            options[word] = " ".join(words[i + 1 :]) if word == "skip" else True
            if word == "skip":
                break
        elif word == "needs":
            options.setdefault("needs", []).append(words[i + 1])
            i += 1
        elif "=" in word:
            key, value = word.split("=", 1)
            options[key] = value
        else:
            raise ValueError(f"unknown doc-test option {word!r}")
        i += 1
    return options


def doc_blocks() -> list[Block]:
    """The marked example blocks of every page, in page order."""
    blocks = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            fence = FENCE.match(lines[i])
            if fence:
                end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
                body = lines[i + 1 : end]
                marker = MARKER.match(body[0]) if body else None
                if marker:
                    options = parse_options(marker.group(1))
                    blocks.append(Block(page, i + 1, fence.group(1), "\n".join(body), options))
                i = end
            i += 1
    return blocks


def shrink_toml(text: str, options: dict) -> str:
    """A TOML config with its ``cells`` and ``t_end`` set from the marker's options."""
    if "cells" in options:

        def cells(match: re.Match) -> str:
            value = match.group(2).split("#")[0].strip()
            n = options["cells"]
            count = value.count(",") + 1 if value.startswith("[") else 0
            return match.group(1) + (f"[{', '.join([n] * count)}]" if count else n)

        text = re.sub(r"(?m)^(cells\s*=\s*)(.*)$", cells, text)
    if "t_end" in options:
        text = re.sub(r"(?m)^(t_end\s*=\s*)(\S+)", rf"\g<1>{options['t_end']}", text)
    if "snapshots" in options:  # a count; a list of times stays
        text = re.sub(r"(?m)^(snapshots\s*=\s*)(\d+)", rf"\g<1>{options['snapshots']}", text)
    return text


def shrink_python(code: str, options: dict) -> str:
    if "cells" in options:
        n = options["cells"]
        code = re.sub(
            r"cells=\[([^\]]*)\]",
            lambda m: f"cells=[{', '.join([n] * (m.group(1).count(',') + 1))}]",
            code,
        )
    if "t_end" in options:
        code = re.sub(r"t_end=[0-9.eE+-]+", f"t_end={options['t_end']}", code)
    return code


def prepare(folder: Path, options: dict) -> None:
    """``folder/examples``: the repository's examples, shrunk as the options say."""
    target = folder / "examples"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(ROOT / "examples", target, ignore=shutil.ignore_patterns("*.png", "*.gif"))
    for path in target.rglob("*.toml"):
        path.write_text(shrink_toml(path.read_text(), options))


def run_bash(code: str, folder: Path) -> None:
    from tpde.cli import main

    for line in code.splitlines():
        command = line.split("  #")[0].strip()
        if not command or command.startswith("#"):
            continue
        words = shlex.split(command)
        if words[:2] == ["mkdir", "-p"]:
            for name in words[2:]:
                (folder / name).mkdir(parents=True, exist_ok=True)
        elif words[0] == ".venv/bin/tpde":
            code_ = main(words[1:])
            assert code_ == 0, f"{command}: exit {code_}"
        else:
            subprocess.run(["bash", "-e", "-c", command], cwd=folder, check=True, timeout=600)


def run_block(block: Block, folder: Path, monkeypatch) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prepare(folder, block.options)
    for needed in block.options.get("needs", []):
        assert (folder / needed).exists(), f"{block.name} needs {needed} from an earlier block"
    monkeypatch.chdir(folder)
    try:
        if block.language == "bash":
            run_bash(block.code, folder)
        else:
            code = shrink_python(block.code, block.options)
            exec(compile(code, block.name, "exec"), {"__name__": "__doc_test__"})
    finally:
        plt.close("all")


def pages_with_blocks(slow: bool) -> list[Path]:
    return sorted({b.page for b in doc_blocks() if bool(b.options.get("slow")) == slow})


def run_page(page: Path, slow: bool, tmp_path: Path, monkeypatch, capsys) -> None:
    blocks = [b for b in doc_blocks() if b.page == page and "skip" not in b.options]
    ran = []
    for block in blocks:
        if bool(block.options.get("slow")) != slow:
            continue
        run_block(block, tmp_path, monkeypatch)
        ran.append(block.name)
    with capsys.disabled():
        print(f"\nran {len(ran)} blocks of {page.relative_to(ROOT)}: {', '.join(ran)}")
    assert ran


@pytest.mark.parametrize(
    "page", pages_with_blocks(slow=False), ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_doc_examples_run(page, tmp_path, monkeypatch, capsys):
    run_page(page, False, tmp_path, monkeypatch, capsys)


@pytest.mark.slow
@pytest.mark.parametrize(
    "page", pages_with_blocks(slow=True), ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_slow_doc_examples_run(page, tmp_path, monkeypatch, capsys):
    run_page(page, True, tmp_path, monkeypatch, capsys)


def test_marked_blocks_are_found_and_parsed():
    blocks = doc_blocks()
    names = {b.page.name for b in blocks}
    assert {"README.md", "first-run.md", "frame.md", "python-api.md"} <= names
    assert parse_options("cells=16 t_end=0.5 needs out/a.nc") == {
        "cells": "16",
        "t_end": "0.5",
        "needs": ["out/a.nc"],
    }
    assert shrink_toml("cells = [96, 96]\nt_end = 6.0\n", {"cells": "8", "t_end": "1"}) == (
        "cells = [8, 8]\nt_end = 1\n"
    )
    assert shrink_python("Grid(cells=[128, 128]), t_end=2.0", {"cells": "8", "t_end": "1"}) == (
        "Grid(cells=[8, 8]), t_end=1"
    )


# ---- the numbers docs/validation.md quotes --------------------------------------------------
VALIDATION = ROOT / "docs" / "validation.md"
ROW = re.compile(r"^\| `([a-z0-9-]+)` \| [^|]+ \| ([^|]+) \|")
C1_MEAN, C1_COV = np.array([0.5, -0.3]), np.array([[1.0, 0.4], [0.4, 0.6]])
C1_A, C1_V = np.array([[-0.6, 0.8], [-0.2, -0.3]]), np.array([[1.0, 0.5], [-0.3, 0.8]])


def quoted_numbers() -> dict[str, str]:
    """key -> quoted value, from the tables of the section 'Numbers checked on every make
    test' of docs/validation.md."""
    text = VALIDATION.read_text(encoding="utf-8")
    section = text.split("\n## Numbers checked on every `make test`\n")[1].split("\n## ")[0]
    out = {}
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            out[match.group(1)] = match.group(2).strip()
    return out


def agrees(value: float, quoted: str) -> bool:
    """``value`` written with the digits of ``quoted`` is ``quoted`` (``<= X``: a bound)."""
    if quoted.startswith("<="):
        return value <= float(quoted[2:])
    if re.fullmatch(r"-?\d+", quoted):
        return value == int(quoted)
    if "e" in quoted:
        mantissa = quoted.split("e")[0]
        digits = len(mantissa.split(".")[1]) if "." in mantissa else 0
        return f"{value:.{digits}e}".replace("e-0", "e-").replace("e+0", "e+") == quoted
    decimals = len(quoted.split(".")[1])
    return f"{value:.{decimals}f}" == quoted


def vc1_blowup_time() -> float:
    from tpde.validation.gaussian import softmax_blowup_time

    return softmax_blowup_time(C1_COV, 0.5 * np.eye(2), 1.0)


def e2_eigenvalue_ratio() -> float:
    import tomllib

    from tpde.validation.gaussian import solve
    from tpde.variants import Head

    raw = tomllib.loads((ROOT / "examples" / "e2_collapse_to_line.toml").read_text())
    q, k = np.array(raw["attention"]["Q"]), np.array(raw["attention"]["K"])
    head = Head(raw["attention"]["scale"] * k.T @ q, np.array(raw["attention"]["V"]))
    t_end = raw["run"]["t_end"]
    cov = solve("softmax", raw["initial"]["mean"], raw["initial"]["covariance"], head, t_end)
    values = np.linalg.eigvalsh(cov.at(t_end)[1])
    return float(values[0] / values[-1])


def gh_tokens_softmax() -> float:
    from tpde.validation.gaussian import solve
    from tpde.validation.particles import (
        TokenSystem,
        gauss_hermite_tokens,
        simulate,
        token_moments,
    )
    from tpde.variants import Head

    exact = solve("softmax", C1_MEAN, C1_COV, Head(C1_A, C1_V), 1.0).at(1.0)[1]
    tokens, weights = gauss_hermite_tokens(C1_MEAN, C1_COV, 20)
    path = simulate(TokenSystem("softmax", Head(C1_A, C1_V)), tokens, 1.0, 0.01, weights=weights)
    _, cov = token_moments(path.at(1.0), weights)
    return float(np.abs(cov - exact).max() / np.abs(exact).max())


def mass_periodic_softmax() -> float:
    from tpde.grid import Grid, gaussian, mass
    from tpde.schemes.solver import Problem, Solver
    from tpde.variants import ATTENTION, Head

    grid = Grid([-6, -6], [6, 6], [24, 24], "periodic")
    rho = gaussian(grid, C1_MEAN, C1_COV)
    field = ATTENTION["softmax"](Head(C1_A, C1_V))
    result = Solver(Problem(grid, rho, field, 0.2)).run()
    return abs(mass(result.final, grid) - mass(rho, grid))


def softmax_1d_covariance() -> float:
    from tpde.grid import Grid, gaussian, moments
    from tpde.schemes.solver import Problem, Solver
    from tpde.validation.gaussian import solve
    from tpde.validation.studies import fitted_box
    from tpde.variants import ATTENTION, Head

    mean0, cov0, head = np.array([0.4]), np.array([[0.8]]), Head([[-0.6]], [[1.0]])
    solution = solve("softmax", mean0, cov0, head, 1.0)
    lower, upper = fitted_box(solution, 1.0, 7.0)
    grid = Grid(lower, upper, [64])
    result = Solver(Problem(grid, gaussian(grid, mean0, cov0), ATTENTION["softmax"](head), 1.0))
    _, _, cov = moments(result.run().final, grid)
    exact = solution.at(1.0)[1][0, 0]
    return abs(cov[0, 0] - exact) / exact


CHECKS: dict[str, Callable[[], float]] = {
    "vc1-blowup-time": vc1_blowup_time,
    "e2-eigenvalue-ratio": e2_eigenvalue_ratio,
    "gh-tokens-softmax": gh_tokens_softmax,
    "mass-periodic-softmax": mass_periodic_softmax,
    "softmax-1d-covariance": softmax_1d_covariance,
}
SLOW_CHECKS = ("validate-quick-checks", "frame-mixture-frame", "frame-mixture-fixed")
#: other pages that quote a checked number: (page, pattern whose group is the number, key)
ECHOES = [
    ("docs/guide/first-run.md", r"eigenvalue ratio is ([0-9.]+)", "e2-eigenvalue-ratio"),
    ("docs/guide/frame.md", r"frame ([0-9.]+), fixed box", "frame-mixture-frame"),
    ("docs/guide/frame.md", r"fixed box ([0-9.]+)\n", "frame-mixture-fixed"),
    ("docs/guide/compare.md", r"# ([0-9]+) checks", "validate-quick-checks"),
    ("docs/validation.md", r"ran its ([0-9]+) checks", "validate-quick-checks"),
]


def test_every_quoted_key_has_a_check():
    assert set(quoted_numbers()) == set(CHECKS) | set(SLOW_CHECKS)


@pytest.mark.parametrize("key", list(CHECKS))
def test_validation_numbers_match_the_code(key, capsys):
    quoted = quoted_numbers()[key]
    value = CHECKS[key]()
    with capsys.disabled():
        print(f"\n{key}: quoted {quoted}, computed {value:.6g}")
    assert math.isfinite(value) and agrees(value, quoted), (key, quoted, value)


def test_other_pages_quote_the_checked_numbers():
    numbers = quoted_numbers()
    for page, pattern, key in ECHOES:
        match = re.search(pattern, (ROOT / page).read_text(encoding="utf-8"))
        assert match, f"{page}: no {pattern!r}"
        assert match.group(1) == numbers[key], (page, match.group(1), numbers[key])


def test_agreement_rule():
    assert agrees(0.2614, "0.26") and not agrees(0.2651, "0.26")
    assert agrees(7.94e-5, "7.9e-5") and not agrees(8.0e-5, "7.9e-5")
    assert agrees(2.29e-11, "2e-11") and not agrees(2.6e-11, "2e-11")
    assert agrees(4e-16, "<= 1e-14") and not agrees(2e-14, "<= 1e-14")
    assert agrees(18, "18") and not agrees(17, "18")


@pytest.mark.slow
def test_validate_quick_counts_its_checks(tmp_path):
    """`tpde validate --suite quick`: the number of checks docs/validation.md quotes."""
    from tpde.cli import main

    assert main(["validate", "--suite", "quick", "-o", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    checks = len(re.findall(r"\| (?:PASS|FAIL) \|", report))
    print(f"\nquick suite: {checks} checks")
    assert checks == int(quoted_numbers()["validate-quick-checks"])


@pytest.mark.slow
def test_frame_mixture_prints_the_quoted_numbers(tmp_path):
    """examples/frame_mixture.py at its defaults prints the two quoted W2 / spread values."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "frame_mixture.py"),
            "--out",
            str(tmp_path / "f.png"),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
        check=True,
        cwd=tmp_path,
    ).stdout
    print(out)
    match = re.search(r"frame ([0-9.]+), fixed ([0-9.]+)", out)
    assert match, out
    numbers = quoted_numbers()
    assert agrees(float(match.group(1)), numbers["frame-mixture-frame"]), out
    assert agrees(float(match.group(2)), numbers["frame-mixture-fixed"]), out


# ---- the generated reference --------------------------------------------------------------
def _reference_module():
    spec = importlib.util.spec_from_file_location("reference", ROOT / "tools" / "reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_pages_are_not_stale():
    """docs/reference/*.md are what tools/reference.py makes of the code now."""
    stale = [
        path.relative_to(ROOT).as_posix()
        for path, text in _reference_module().pages().items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"stale: {stale}; run python tools/reference.py"


def test_schema_documents_exactly_the_keys_the_code_reads():
    from tpde import circle, config, sphere
    from tpde.schema import CIRCLE, FLAT, SPHERE

    assert {s: set(k) for s, k in FLAT.items()} == {s: set(k) for s, k in config.SECTIONS.items()}
    assert {s: set(k) for s, k in CIRCLE.items()} == {s: set(k) for s, k in circle.KEYS.items()}
    assert {s: set(k) for s, k in SPHERE.items()} == {s: set(k) for s, k in sphere.KEYS.items()}
    from tpde.schemes.solver import Scheme

    defaults = {f.name: f.default for f in __import__("dataclasses").fields(Scheme)}
    for key, (default, _) in FLAT["scheme"].items():
        shown = {None: "none", True: "true", False: "false"}.get(defaults[key], defaults[key])
        written = f'"{shown}"' if isinstance(defaults[key], str) else str(shown)
        assert default == written, (key, default, written)


def test_no_doc_example_is_left_unmarked_by_accident():
    """Every python/bash block of the guide pages is marked (run, slow or skip) or is
    a usage synopsis (a line starting ``tpde``, not ``.venv/bin/tpde``)."""
    unmarked = []
    for page in sorted((ROOT / "docs" / "guide").glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if FENCE.match(line) and i + 1 < len(lines) and not MARKER.match(lines[i + 1]):
                if not lines[i + 1].startswith("tpde "):
                    unmarked.append(f"{page.relative_to(ROOT)}:{i + 1}")
    assert not unmarked, f"unmarked example blocks: {unmarked}"


#: the size limits of the entry pages: the README fits in a head, a guide page in one sitting
README_LINES, GUIDE_PAGE_LINES = 120, 300


def test_readme_and_guide_pages_stay_short():
    sizes = {ROOT / "README.md": README_LINES, ROOT / "docs" / "user-guide.md": GUIDE_PAGE_LINES}
    for page in [
        *(ROOT / "docs" / "guide").glob("*.md"),
        *(ROOT / "docs" / "reference").glob("*.md"),
    ]:
        sizes[page] = GUIDE_PAGE_LINES
    long = {
        p.relative_to(ROOT).as_posix(): n
        for p, limit in sizes.items()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > limit
    }
    assert not long, f"pages over their line limit: {long}"


GUIDE_CITATION = re.compile(r"user-guide\.md[,:] ['\"]([^'\"\n<]+)['\"]")


def test_cited_user_guide_sections_exist():
    """Code and messages cite ``docs/user-guide.md, '<section title>'``: each title begins a
    heading of docs/user-guide.md (the index keeps the former sections' titles)."""
    headings = [
        m.group(1)
        for line in (ROOT / "docs" / "user-guide.md").read_text(encoding="utf-8").splitlines()
        if (m := re.match(r"^#{1,6}\s+(.*?)\s*$", line))
    ]
    tracked = subprocess.run(
        ["git", "ls-files", "*.py", "*.md", "*.toml"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    missing = []
    for name in tracked:
        for match in GUIDE_CITATION.finditer((ROOT / name).read_text(encoding="utf-8")):
            if not any(h.startswith(match.group(1)) for h in headings):
                missing.append(f"{name}: {match.group(1)!r}")
    assert tracked and not missing, f"citations of missing user-guide sections: {missing}"
