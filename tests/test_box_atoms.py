"""Atoms on a fixed flat box (docs/guide/atoms.md, 'Atoms on a fixed flat box'): the frame's
Gaussian atoms in the identity frame. References: Gauss-Hermite tokens of each bump's law
moved by the token system (RK4), the unit mass of cells plus atoms plus outflow, the
atoms-off run (Gaussian data), and the uninterrupted run (resume)."""

from __future__ import annotations

import copy

import netCDF4
import numpy as np
import pytest
from exact import kill_after
from test_flat_atoms import box_moments, show

from tpde.cli import main
from tpde.config import build, dumps
from tpde.grid import Grid, gaussian, gaussian_mixture
from tpde.schemes.atoms import AtomOptions, Atoms
from tpde.schemes.solver import Problem, Solver
from tpde.validation.particles import TokenSystem, gauss_hermite_tokens, simulate
from tpde.variants import ATTENTION, Head

CORNERS = [np.array([sx, sy]) for sx in (-1.0, 1.0) for sy in (-1.0, 1.0)]
WEIGHTS = [0.3, 0.2, 0.25, 0.25]


def bumps(cells: int) -> tuple[Grid, np.ndarray]:
    """Four bumps of sd 0.4 cells at the corners (+-1, +-1) of a box +-2.5."""
    grid = Grid([-2.5, -2.5], [2.5, 2.5], [cells, cells])
    narrow = (0.4 * grid.spacing[0]) ** 2 * np.eye(2)
    return grid, gaussian_mixture(grid, WEIGHTS, CORNERS, [narrow] * 4)


def quadrant(grid: Grid, c: np.ndarray) -> np.ndarray:
    mesh = grid.mesh(sparse=False)
    return (np.sign(mesh[0]) == np.sign(c[0])) & (np.sign(mesh[1]) == np.sign(c[1]))


def test_four_bumps_in_a_fixed_box_become_atoms_and_follow_tokens():
    """Four bumps narrower than a cell on a fixed 16^2 box under softmax ``A = V = I`` (the
    law expands): four atoms before the first step, which move as Gauss-Hermite tokens
    (10^2 a bump, of each bump's cells' law) do to t = 0.3; cells plus atoms plus outflow
    keep the unit mass to 1e-13."""
    head = Head(np.eye(2), np.eye(2))
    grid, density = bumps(16)
    t_end = 0.3
    problem = Problem(
        grid,
        density,
        ATTENTION["softmax"](head),
        t_end,
        snapshots=[0.0, t_end],
        atoms=AtomOptions(),
        box_action="warn",
    )
    result = Solver(problem).run()
    births = [e for e in result.events if e.kind == "atom_birth"]
    start, snap = result.snapshots[0], result.snapshots[-1]
    assert result.status == "completed" and len(births) == 4
    assert all(e.time == 0.0 for e in births) and start.atoms.count == 4  # (before a step)
    tokens, token_weights = [], []
    for c in CORNERS:
        m, a, S = box_moments(np.where(quadrant(grid, c), density, 0.0), grid, Atoms.empty(2))
        x, wx = gauss_hermite_tokens(a, S, 10)
        tokens.append(x)
        token_weights.append(m * wx)
    end = simulate(
        TokenSystem("softmax", head), np.vstack(tokens), t_end, 2e-3,
        weights=np.concatenate(token_weights),
    ).tokens[-1]  # fmt: skip
    rows, worst_atom, worst_part = [], 0.0, 0.0
    for k, c in enumerate(CORNERS):
        part = end[100 * k : 100 * (k + 1)]
        mean = token_weights[k] @ part / token_weights[k].sum()
        j = int(np.argmin(np.abs(snap.atoms.centre - c).sum(axis=1)))
        atom = float(np.abs(snap.atoms.centre[j] - mean).max())
        # the quadrant's cells plus its atom: the whole bump, as the tokens carry it
        one = Atoms.of(snap.atoms.mass[[j]], snap.atoms.centre[[j]], snap.atoms.cov[[j]], [0])
        _, whole, _ = box_moments(np.where(quadrant(grid, c), snap.density, 0.0), grid, one)
        both = float(np.abs(whole - mean).max())
        worst_atom, worst_part = max(worst_atom, atom), max(worst_part, both)
        rows.append((k, float(snap.atoms.mass[j]), float(np.abs(mean - c).max()), atom, both))
    mass = grid.integrate(snap.density) + snap.atoms.total_mass + snap.outflow
    show(
        "fixed box: four atoms against their bumps' tokens at t = 0.3 (16^2)",
        ["bump", "atom mass", "moved", "atom centre", "cells + atom"],
        rows,
    )
    print(f"mass of cells + atoms + outflow: error {abs(mass - 1.0):.1e}; {births[0].message}")
    assert abs(mass - 1.0) < 1e-13
    assert min(row[2] for row in rows) > 0.25  # (each bump moves by about a cell)
    # measured 3.3e-4 (the atom: the residual below the floor stays on the cells and is
    # absorbed later) and 8.1e-5 (the atom with its quadrant's cells)
    assert worst_atom < 1e-3 and worst_part < 2e-4


def test_gaussian_data_in_a_fixed_box_never_create_an_atom():
    """A single Gaussian of 0.7 and of 2 cells sd on a fixed box with atoms on: no atom,
    and the run equals the atoms-off run bit for bit."""
    head = Head(np.array([[1.2, 0.3], [-0.2, 0.9]]), np.array([[0.8, -0.4], [0.3, 1.1]]))
    for sd in (0.7, 2.0):
        grid = Grid([-4.0, -4.0], [4.0, 4.0], [16, 16])
        rho = gaussian(grid, np.array([0.2, -0.1]), (sd * grid.spacing[0]) ** 2 * np.eye(2))
        out = []
        for options in (None, AtomOptions()):
            problem = Problem(
                grid, rho, ATTENTION["softmax"](head), 0.1, snapshots=[0.1], atoms=options,
                box_action="warn",
            )  # fmt: skip
            out.append(Solver(problem).run())
        off, on = out[0].snapshots[-1], out[1].snapshots[-1]
        print(f"\nsd {sd} cells: atoms {on.atoms.count}, steps {on.step}")
        assert on.atoms is not None and on.atoms.count == 0
        assert np.array_equal(off.density, on.density) and off.step == on.step


#: the fixed box's bumps as a config (the four bumps of :func:`bumps` at 16^2)
CONFIG = {
    "grid": {"lower": [-2.5, -2.5], "upper": [2.5, 2.5], "cells": [16, 16]},
    "initial": {
        "kind": "mixture",
        "weights": WEIGHTS,
        "means": [c.tolist() for c in CORNERS],
        "covariances": [[[0.0025, 0.0], [0.0, 0.0025]]] * 4,
    },
    "attention": {"variant": "softmax", "A": np.eye(2).tolist(), "V": np.eye(2).tolist()},
    "atoms": {},
    "run": {"t_end": 0.2, "snapshots": 5, "box_action": "warn"},
}


def variables(path) -> dict[str, np.ndarray]:
    with netCDF4.Dataset(path) as nc:
        nc.set_auto_mask(False)
        return {name: np.asarray(var[...]) for name, var in nc.variables.items()}


@pytest.mark.slow  # (11 s at load 8: two runs and a killed one through the command line)
def test_a_fixed_box_with_atoms_in_the_file_resumes_bit_for_bit(tmp_path, capsys):
    """``[atoms]`` without ``scheme.frame``: four atoms from the first record on, in the file
    (``atom_centre (time, atom, dim)``, ``atom_covariance``); killed after 2 records and
    resumed, every variable equals the uninterrupted run's; the recorded mass (cells plus
    atoms) plus the outflow is 1 to 1e-13; ``tpde info`` lists the atoms."""
    config = tmp_path / "box.toml"
    config.write_text(dumps(CONFIG))
    assert build(copy.deepcopy(CONFIG)).problem.frame is None
    full, cut = tmp_path / "full.nc", tmp_path / "cut.nc"
    # (one thread in both processes: the pytest process and the killed one)
    threads = ["--threads", "1"]
    assert main(["run", str(config), "-o", str(full), "--quiet", *threads]) == 0
    kill_after(["run", str(config), "-o", str(cut), *threads], 2)
    assert main(["run", str(config), "-o", str(cut), "--resume", "--quiet", *threads]) == 0
    a, b = variables(full), variables(cut)
    differ = sorted(set(a) ^ set(b)) + [
        name
        for name in sorted(set(a) & set(b))
        if not np.array_equal(a[name], b[name], equal_nan=a[name].dtype.kind == "f")
    ]
    print(f"\n{len(a)} variables compared after the resume; differ: {differ}")
    assert not differ
    ids = a["atom_id"]
    counts = (ids >= 0).sum(axis=1)
    total = a["mass"] + a["outflow"]
    print(f"atoms per record: {counts.tolist()}; mass + outflow - 1: {(total - 1).tolist()}")
    assert np.all(counts == 4) and np.abs(total - 1.0).max() < 1e-13
    assert "atom_frame_centre" not in a and a["atom_centre"].shape[1:] == (64, 2)
    used = ids[-1] >= 0
    assert np.allclose(np.sort(a["atom_mass"][-1, used]), [0.2, 0.25, 0.25, 0.3], atol=2e-3)
    assert np.all(np.abs(np.abs(a["atom_centre"][-1, used]) - 1.2) < 0.1)  # (moved out)
    capsys.readouterr()
    assert main(["info", str(cut)]) == 0
    out = capsys.readouterr().out
    print(out[:800])
    assert "atoms at t = 0.2: 4" in out and "atom 3: born at t = 0" in out


@pytest.mark.parametrize("boundary", ["noflux", "outflow"])
def test_a_fixed_box_conserves_cells_plus_atoms(boundary):
    """Cells plus atoms (plus the outflow) keep the unit mass to 1e-13 while the residual
    tails reach the box's edge (noflux: none leaves; outflow: what leaves is counted)."""
    box, density = bumps(12)
    grid = Grid(box.lower, box.upper, box.cells, boundary)
    field = ATTENTION["softmax"](Head(np.eye(2), np.eye(2)))
    problem = Problem(
        grid, density, field, 0.5, snapshots=[0.25, 0.5], atoms=AtomOptions(),
        box_action="warn",
    )  # fmt: skip
    result = Solver(problem).run()
    rows = []
    for snap in result.snapshots:
        rows.append((snap.time, snap.atoms.count, snap.outflow, snap.mass + snap.outflow - 1.0))
    show(f"{boundary}: mass of cells + atoms (+ outflow)", ["t", "atoms", "outflow", "err"], rows)
    assert all(abs(row[3]) < 1e-13 for row in rows)
    assert (boundary == "noflux") == all(row[2] == 0.0 for row in rows)
