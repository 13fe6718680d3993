"""The atoms' per-step fast paths (docs/theory.md, 'Cells plus atoms', 'Where the overhead was
cut') against their plain references: the absorption of many atoms at once against each
atom's exact moments with its cells (merge_moments of the atom and its piecewise-constant
cells), the in-place spectrum against ``fft + atom_spectrum``, the 1-D rates against the
formula ``a' = u + s u'' / 2``, ``s' = 2 u' s``."""

from __future__ import annotations

import numpy as np

from tpde.grid.circle import circle_grid
from tpde.schemes.atom_cells import PeriodicCells, absorb
from tpde.schemes.atoms import AtomOptions, Atoms, atom_rates, merge_moments
from tpde.variants.circle_atoms import add_atom_spectrum, atom_spectrum, dft_factor

N = 128


def _cells() -> PeriodicCells:
    return PeriodicCells(0.0, 2 * np.pi / N, N)


def _reference_absorb(rho, cells, atoms, options):
    """One atom after another: its cells within ``absorb`` cells join it (exact moments)."""
    out = rho.copy()
    mass, centre, var = [], [], []
    for k in range(atoms.count):
        a = float(atoms.centre[k, 0])
        x = cells.centres
        d = cells.offset(x, a)
        take = np.flatnonzero((np.abs(d) <= options.absorb * cells.h) & (out > 0.0))
        parts_m = np.concatenate([[atoms.mass[k]], out[take] * cells.h])
        parts_a = np.concatenate([[0.0], d[take]])[:, None]
        parts_s = np.concatenate([[atoms.cov[k, 0, 0]], np.full(take.size, cells.h**2 / 12)])
        m, mean, cov = merge_moments(parts_m, parts_a, parts_s[:, None, None])
        mass.append(m)
        centre.append(float(cells.wrap(a + mean[0])))
        var.append(cov[0, 0])
        out[take] = 0.0
    return out, np.array(mass), np.array(centre), np.array(var)


def test_absorbing_many_atoms_at_once_against_each_atoms_moments():
    rng = np.random.default_rng(7)
    cells, options = _cells(), AtomOptions()
    rows = []
    for apart in (True, False):  # disjoint windows (all at once) and a shared cell (the loop)
        centres = [0.7, 2.9, 5.1] if apart else [0.7, 0.7 + 3.0 * cells.h, 4.0]
        atoms = Atoms.of([0.2, 0.3, 0.1], centres, [[[1e-5]], [[2e-5]], [[4e-6]]], [0, 1, 2])
        rho = rng.uniform(0.0, 1e-3, N)
        rho[rng.uniform(size=N) < 0.3] = 0.0
        out, got = absorb(rho, cells, atoms, options)
        ref_rho, m, a, s = _reference_absorb(rho, cells, atoms, options)
        errors = (
            np.abs(out - ref_rho).max(),
            np.abs(got.mass - m).max(),
            np.abs(cells.offset(got.centre[:, 0], 0.0) - cells.offset(a, 0.0)).max(),
            np.abs(got.cov[:, 0, 0] - s).max() / s.max(),
        )
        rows.append((apart, *errors))
        total = rho.sum() * cells.h + atoms.total_mass
        assert abs(out.sum() * cells.h + got.total_mass - total) < 1e-15
        assert max(errors) < 1e-13
    print("\n apart  cells    mass     centre   variance (rel)")
    for apart, *e in rows:
        print(f" {apart!s:5}  " + "  ".join(f"{v:.1e}" for v in e))


def test_spectrum_in_place_is_fft_plus_atom_spectrum_bit_for_bit():
    grid = circle_grid(N)
    rng = np.random.default_rng(3)
    rho = rng.uniform(0.1, 0.2, N)
    atoms = Atoms.of([0.2, 0.05], [1.0, 4.0], [[[1e-4]], [[3e-5]]], [0, 1])
    for band in (1, 17, N // 2):
        ref = np.fft.fft(rho) + atom_spectrum(grid, atoms, band)
        got = np.fft.fft(rho)
        add_atom_spectrum(got, grid, atoms, band, dft_factor(grid, band))
        assert np.array_equal(got, ref), band


def test_one_dimensional_rates_are_the_gaussian_formula():
    rng = np.random.default_rng(5)
    k = 4
    u, du, d2u = rng.normal(size=(k, 1)), rng.normal(size=(k, 1, 1)), rng.normal(size=(k, 1, 1, 1))
    s = rng.uniform(1e-6, 1e-3, (k, 1, 1))
    rates = atom_rates(u, du, d2u, s)
    centre = u[:, 0] + 0.5 * s[:, 0, 0] * d2u[:, 0, 0, 0]
    cov = 2.0 * du[:, 0, 0] * s[:, 0, 0]
    assert np.abs(rates.centre[:, 0] - centre).max() <= 1e-15 * np.abs(centre).max()
    assert np.abs(rates.cov[:, 0, 0] - cov).max() <= 1e-15 * np.abs(cov).max()
