"""Von Mises-Fisher atoms on the cubed sphere (docs/theory.md, 'Atoms on the sphere')."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tpde.grid import cubed_sphere as cs
from tpde.schemes import sphere_atoms as sa
from tpde.schemes.atoms import AtomOptions
from tpde.schemes.cubed_sphere import solve
from tpde.validation.s2_tokens import SphereTokens
from tpde.variants.cubed_sphere import CubedSphereAttention, energy_with_atoms


def _unit(v):
    v = np.asarray(v, float)
    return v / np.linalg.norm(v)


def _polar_rule(t_nodes=500, phi_nodes=200):
    """A dense product rule on the sphere about z (Gauss-Legendre in z, trapezoid in phi)."""
    t, wt = np.polynomial.legendre.leggauss(t_nodes)
    phi = 2 * np.pi * (np.arange(phi_nodes) + 0.5) / phi_nodes
    s = np.sqrt(1 - t**2)[:, None]
    y = np.stack([s * np.cos(phi), s * np.sin(phi), t[:, None] * np.ones_like(phi)], -1)
    w = wt[:, None] * np.full(phi_nodes, 2 * np.pi / phi_nodes)
    return y.reshape(-1, 3), w.reshape(-1)


def test_vmf_sums_match_dense_quadrature():
    """The closed forms C(kappa) / C(|kappa a + c|) and the tilted mean against a dense rule
    of the vMF density; the vMF cubature against the closed form; the deficit inverted."""
    y, w = _polar_rule()
    a = _unit([0.3, -0.5, 0.8])
    rows = []
    for kappa in (5.0, 40.0):
        dens = kappa / (4 * np.pi * np.sinh(kappa)) * np.exp(kappa * (y @ a))
        for c in ([1.0, 2.0, -3.0], [0.0, 0.0, 16.0], [5.0, -4.0, 2.0]):
            c = np.asarray(c)
            e = w * dens * np.exp(y @ c)
            z, g = e.sum(), (e[:, None] * y).sum(0) / e.sum()
            log, _, _ = sa.vmf_log_mgf(c[None], a[None], np.array([kappa]))
            mean = sa.vmf_tilted_mean(c[None], a[None], np.array([kappa]))[0, 0]
            rows.append((kappa, abs(np.exp(log[0, 0]) / z - 1), np.abs(mean - g).max()))
            for k in (kappa, 400.0):
                x, wc = sa.vmf_cubature(a, k)
                exact = np.exp(sa.vmf_log_mgf(c[None], a[None], np.array([k]))[0][0, 0])
                assert abs(wc @ np.exp(x @ c) / exact - 1) < 1e-9
    print("\nkappa  |Z/Z_quad - 1|  |mean - mean_quad|")
    for r in rows:
        print(f"{r[0]:5g}  {r[1]:.1e}  {r[2]:.1e}")
        assert r[1] < 1e-11 and r[2] < 1e-11
    # the energy of one atom (cells empty) against the dense rule's double sum over the vMF
    grid = cs.cubed_sphere(6)
    kappa, beta = 40.0, 4.0
    atom = sa.VMFAtoms(np.array([1.0]), a[None], np.array([1 / kappa]), np.array([0]),
                       np.array([np.nan]), np.array([[-1, -1]]))  # fmt: skip
    dens = w * kappa / (4 * np.pi * np.sinh(kappa)) * np.exp(kappa * (y @ a))
    inner = np.exp(sa.vmf_log_mgf(beta * y, a[None], np.array([kappa]))[0][:, 0])
    exact = float(dens @ inner) / (2 * beta)  # one sum by the rule, one by the closed form
    e = energy_with_atoms(np.zeros(grid.shape), grid, beta, atom)
    print(f"energy of one atom: {e:.12g} against {exact:.12g}")
    assert abs(e / exact - 1) < 1e-11
    kappa = np.array([0.5, 3.0, 30.0, 1e10])
    assert np.allclose(sa.kappa_of_deficit(sa.deficit(kappa)), kappa, rtol=1e-10)
    # a collapsed atom (kappa = 1e200): finite, the point mass's e^{<c, a>}
    log, _, _ = sa.vmf_log_mgf(16 * a[None], a[None], np.array([1e200]))
    assert abs(log[0, 0] - 16.0) < 1e-12


def test_field_of_an_atom_matches_its_quadrature():
    """The field of cells (empty) plus one atom at scattered points against the dense rule
    of the same vMF."""
    grid = cs.cubed_sphere(6)
    field = CubedSphereAttention(beta=4.0)
    a, kappa = _unit([1.0, 0.4, -0.2]), 30.0
    field.atoms = sa.VMFAtoms(np.array([1.0]), a[None], np.array([1 / kappa]), np.array([0]),
                              np.array([np.nan]), np.array([[-1, -1]]))  # fmt: skip
    points = np.stack([_unit(p) for p in np.random.default_rng(1).normal(size=(20, 3))])
    v = field.tangent(np.zeros(grid.shape), grid, 0.0, points)
    y, w = _polar_rule()
    dens = w * np.exp(kappa * (y @ a - 1))
    e = dens[None, :] * np.exp(4.0 * (points @ y.T - 1))
    gamma = e @ y / e.sum(1)[:, None]
    ref = gamma - np.sum(gamma * points, 1)[:, None] * points
    print(f"\nfield of one atom against quadrature: {np.abs(v - ref).max():.1e}")
    assert np.abs(v - ref).max() < 1e-10


def _parts_moment(rho, cells, atoms):
    first = (rho * cells.areas * (1 - cells.deficits)) @ cells.directions
    first += ((1 - sa.deficit(atoms.kappa)) * atoms.mass) @ atoms.directions
    return float(rho @ cells.areas) + atoms.total_mass, first


def test_transfers_conserve_mass_and_first_moment():
    """Conversion, absorption and merging keep the mass and int x dmu to round-off."""
    grid = cs.cubed_sphere(8)
    m1, m2 = _unit([1, 0.2, 0.1]), _unit([0.3, 1, -0.2])
    rho = cs.mixture(grid, [(0.45, list(m1), 60.0), (0.45, list(m2), 60.0), (0.1, [0, 0, 1], 1.0)])
    cells = sa.SphereCells(grid)
    opts = AtomOptions()
    flat = rho.reshape(-1).copy()
    atoms = sa.VMFAtoms.empty()
    m0, f0 = _parts_moment(flat, cells, atoms)
    flat, atoms, born, nid = sa.convert(flat, cells, atoms, opts, 0.0, 0)
    assert len(born) == 2 and atoms.count == 2
    m1_, f1 = _parts_moment(flat, cells, atoms)
    flat = flat + 0.3 * rho.reshape(-1) * (flat > 0)  # mass flows in beside the atoms
    m0b, f0b = _parts_moment(flat, cells, atoms)
    flat, atoms = sa.absorb(flat, cells, atoms, opts)
    m2_, f2 = _parts_moment(flat, cells, atoms)
    moved = sa.VMFAtoms(
        atoms.mass,
        np.vstack([atoms.directions[0], _unit(atoms.directions[0] + [0, 0, 0.01])]),
        atoms.spread,
        atoms.ids,
        atoms.born,
        atoms.parents,
    )
    m3a, f3a = _parts_moment(flat, cells, moved)
    merged, events, _ = sa.merge(moved, cells, AtomOptions(merge=1.0), 1.0, nid)
    m3, f3 = _parts_moment(flat, cells, merged)
    assert len(events) == 1 and merged.count == 1
    for (ma, fa), (mb, fb), what in (
        ((m0, f0), (m1_, f1), "conversion"),
        ((m0b, f0b), (m2_, f2), "absorption"),
        ((m3a, f3a), (m3, f3), "merge"),
    ):
        print(f"{what}: mass {abs(mb - ma):.1e}, first moment {np.abs(fb - fa).max():.1e}")
        assert abs(mb - ma) < 1e-14 and np.abs(fb - fa).max() < 1e-14


def test_two_collapsed_atoms_follow_two_tokens():
    """Two atoms (kappa = 1e12) on empty cells against the two weighted tokens' CF4 run."""
    grid = cs.cubed_sphere(6)
    field = CubedSphereAttention(beta=2.0)
    a = np.stack([_unit([1, 0.1, 0]), _unit([0.4, 1, 0.3])])
    mass = np.array([0.6, 0.4])
    start = sa.VMFAtoms(mass, a, np.full(2, 1e-12), np.arange(2), np.full(2, np.nan),
                        -np.ones((2, 2), int))  # fmt: skip
    run = sa.SphereAtomRun(grid, field, AtomOptions(merge=1e-3), start)
    result = solve(grid, np.zeros(grid.shape), field, 0.5, snapshots=2, atoms=run, dt_max=0.025)
    tokens = SphereTokens(a, 2.0 * np.eye(3), weights=mass).integrate([0.0, 0.5], 0.025)[-1]
    gap = np.abs(result.atoms.directions - tokens).max()
    print(f"\natoms against tokens at t = 0.5: {gap:.1e}; spread {result.atoms.spread}")
    assert gap < 1e-8
    assert np.all(result.atoms.spread < 1e-12)  # attracting: the widths shrink


def test_short_run_with_one_birth():
    """A narrow vMF on 8 x 8 x 6 cells becomes one atom with its mass and mean direction;
    the run conserves the mass; the energy of cells plus atoms is the point mass's."""
    grid = cs.cubed_sphere(8)
    m = _unit([0.2, -0.4, 1.0])
    rho = cs.von_mises_fisher(grid, m, 60.0)
    field = CubedSphereAttention(beta=4.0)
    run = sa.SphereAtomRun(grid, field, AtomOptions())
    start = time.perf_counter()
    events: list = []
    r = solve(grid, rho, field, 0.5, snapshots=2, atoms=run, events=events)
    births = [e for e in events if e.kind == "atom_birth"]
    total = grid.integrate(r.final) + r.atoms.total_mass
    print(f"\n{len(births)} birth, mass change {total - grid.integrate(rho):.1e}, "
          f"{time.perf_counter() - start:.2f} s")  # fmt: skip
    assert len(births) == 1 and r.atoms.count == 1
    assert abs(total - grid.integrate(rho)) < 1e-13
    # the birth takes the converted cells' exact first moment: the atom's direction is the
    # cluster's mean direction to the grid's asymmetry of the cut at the floor (1e-2 of the
    # peak); the residual below it then pulls the atom by less than a tenth of a cell
    assert np.arccos(min(1.0, float(r.atoms.directions[0] @ m))) < 0.1 * grid.h


@pytest.mark.slow
def test_pinning_warned_with_atoms_off():
    """Without atoms a collapsed cluster held by its cells is named in one pinned event."""
    grid = cs.cubed_sphere(6)
    rho = cs.mixture(grid, [(0.6, [1, 0, 0], 300.0), (0.4, list(_unit([0, 1, 0.2])), 300.0)])
    field = CubedSphereAttention(beta=8.0)
    events: list = []
    solve(grid, rho, field, 1.1, snapshots=2, pinning=True, events=events, dt_max=0.1)
    pinned = [e for e in events if e.kind == "pinned"]
    print("\n" + "\n".join(e.message for e in pinned))
    assert len(pinned) == 1 and "[atoms]" in pinned[0].message


@pytest.mark.parametrize("bad", [{"width": -1.0}, {"release": 1.0}])
def test_config_refuses_bad_atom_options(bad):
    from tpde.config_core import ConfigError
    from tpde.sphere import build_sphere

    raw = {"grid": {"geometry": "sphere", "cells": 6}, "attention": {"beta": 2.0},
           "run": {"t_end": 1.0}, "atoms": bad}  # fmt: skip
    with pytest.raises(ConfigError):
        build_sphere(raw)


@pytest.mark.slow
def test_clusters_s2_with_atoms_against_lattice_tokens(tmp_path):
    """examples/sphere/clusters_s2_atoms.toml to t = 24 (the 9 clusters have formed and
    collapsed into atoms) against two turns of 4 x 10^4 lattice tokens of the same law, their
    weights matched to its coefficients (degree 76): from t = 18 the same count, masses
    within 1e-3 (measured 2.9e-4, the seeds' spread 3.5e-4) and cells within 1.5 h of the
    clusters, energies within twice the seeds' spread. The t = 200 study is
    examples/sphere/run_atoms_s2.py (docs/validation.md, 'Atoms on the sphere')."""
    from pathlib import Path

    from tpde.config_core import parse_toml
    from tpde.run import run_config
    from tpde.sphere import build_sphere
    from tpde.validation.sphere_atoms import (
        cluster_table,
        compare_clusters,
        plateau_failures,
        token_clusters,
    )

    root = Path(__file__).parents[1]
    text = (root / "examples/sphere/clusters_s2_atoms.toml").read_text()
    text = text.replace("t_end = 200.0", "t_end = 24.0").replace(
        "snapshots = 101", "snapshots = 13"
    )
    config = build_sphere(parse_toml(text, "config"))
    out = run_config(config, tmp_path / "atoms.nc")
    import importlib.util

    spec = importlib.util.spec_from_file_location("s2", root / "examples/sphere/run_atoms_s2.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    grid, h = script.grid_clusters(out)
    times = [18.0, 20.0, 22.0, 24.0]
    grid = [g for g in grid if g[0] in times]
    seeds = [list(token_clusters(config.problem, s, times)) for s in (0, 1)]
    rows = compare_clusters(grid, seeds)
    print("\n" + cluster_table(rows))
    assert len(rows) == len(times) and all(r["plateau"] for r in rows)
    assert plateau_failures(rows, h) == []
    for r in rows:
        de = [abs(e - r["energy"]) for e in r["energies"]]
        assert max(de) < 2 * r["energy_spread"] + 1e-3 * r["energy"]


ATOM_RUN = """
[grid]
geometry = "sphere"
cells = 8
[initial]
kind = "mixture"
weights = [0.5, 0.4, 0.1]
means = [[1.0, 0.2, 0.1], [0.8, 0.7, 0.0], [0.0, 0.0, 1.0]]
kappas = [60.0, 60.0, 1.0]
[attention]
beta = 4.0
[scheme]
velocity_at = "centres"
[run]
t_end = 3.0
snapshots = 4
[atoms]
"""


@pytest.mark.slow
def test_run_with_atoms_resumes_bit_for_bit(tmp_path, capsys, monkeypatch):
    """A sphere run with atoms interrupted after its second snapshot and resumed: the same
    densities, atoms (ids, masses, centres, spreads) and energies as the uninterrupted run,
    bit for bit; births and the merge in its events; `tpde info` lists the atoms."""
    import os
    import signal

    import xarray as xr

    from tpde.cli import main
    from tpde.io import SnapshotWriter

    def cli(*args):
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, err

    config = tmp_path / "run.toml"
    config.write_text(ATOM_RUN)
    full, cut = tmp_path / "full.nc", tmp_path / "cut.nc"
    assert cli("run", config, "-o", full, "--quiet")[0] == 0
    write = SnapshotWriter.write

    def interrupting(self, *args, **kwargs):
        done = write(self, *args, **kwargs)
        if self.snapshots == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return done

    monkeypatch.setattr(SnapshotWriter, "write", interrupting)
    assert cli("run", config, "-o", cut, "--quiet")[0] == 130
    monkeypatch.undo()
    assert cli("run", config, "-o", cut, "--resume", "--quiet")[0] == 0
    with xr.open_dataset(cut) as a, xr.open_dataset(full) as b:
        for name in ("density", "mass", "energy_interaction", "atom_id", "atom_mass",
                     "atom_centre", "atom_spread", "atom_parents"):  # fmt: skip
            np.testing.assert_array_equal(a[name].values, b[name].values)
        events = str(b.attrs["events"])
        assert events.count("atom_birth") == 2 and "atom_merge" in events
    code, out, _ = cli("info", full)
    assert code == 0 and "merged from atoms 0 and 1" in out, out
