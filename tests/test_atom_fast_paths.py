"""The atoms' per-step fast paths (docs/theory.md, 'Cells plus atoms', 'Where the overhead was
cut') against their plain references: the absorption of many atoms at once against each
atom's exact moments with its cells (merge_moments of the atom and its piecewise-constant
cells), the in-place spectrum against ``fft + atom_spectrum``, the 1-D rates against the
formula ``a' = u + s u'' / 2``, ``s' = 2 u' s``."""

from __future__ import annotations

import math

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


def _unit(rng, count: int) -> np.ndarray:
    x = rng.normal(size=(count, 3))
    return x / np.linalg.norm(x, axis=1)[:, None]


def test_vmf_sums_compiled_terms_are_the_numpy_form_bit_for_bit():
    """The sphere atoms' share (:func:`vmf_sums`, its ``(P, K)`` terms compiled) against its
    numpy form (:func:`vmf_sums_reference`) at 4000 targets under an anisotropic ``A`` and
    7, 8, 9 and 25 atoms of kappa 40 .. 1e12 (the row sums' three regimes): the same bits
    where every ``r >= FLAT_TAIL`` and numpy's ``exp``/``log1p`` are libm's (within
    TERM_ULPS of the row's scale where numpy has its own AVX-512 loops); with a wide atom
    (kappa = 2: ``r < FLAT_TAIL`` somewhere) the numpy form serves, again equal."""
    from tpde.schemes import sphere_atoms as sa

    same_functions = numpy_transcendentals_are_libm()

    rng = np.random.default_rng(3)
    tilts = _unit(rng, 4000) @ np.diag([16.0, 12.0, 9.0]).T
    shift = np.linalg.norm(tilts, axis=1)
    for wide, count in [(False, 7), (False, 9), (False, 8), (False, 25), (True, 7)]:
        centre = _unit(rng, count)
        kappa = np.exp(rng.uniform(np.log(40.0), np.log(1e12), count))
        if wide:
            kappa[3] = 2.0
        mass = rng.uniform(0.01, 0.2, count)
        z, g = sa.vmf_sums(tilts, centre, kappa, mass, shift)
        z_ref, g_ref = sa.vmf_sums_reference(tilts, centre, kappa, mass, shift)
        print(f"wide atom {wide}: |dz| {np.abs(z - z_ref).max():.1e}, |dg| "
              f"{np.abs(g - g_ref).max():.1e}")  # fmt: skip
        if wide or same_functions:
            assert np.array_equal(z, z_ref) and np.array_equal(g, g_ref)
        else:  # numpy's own SIMD exp / log1p: each term within an ulp or so of libm's
            assert np.all(np.abs(z - z_ref) <= TERM_ULPS * EPS * z_ref)
            scale = np.abs(z_ref)[:, None] * (1.0 + np.abs(tilts) / kappa.min())
            assert np.all(np.abs(g - g_ref) <= TERM_ULPS * EPS * scale)


#: the rounding of a sum of positive terms each within a few ulp of its libm value
TERM_ULPS = 8
EPS = np.finfo(float).eps


def numpy_transcendentals_are_libm() -> bool:
    """Whether numpy's ``exp`` and ``log1p`` give libm's bits on this machine (not where
    numpy has its own AVX-512 loops): on 10^4 arguments spanning the atoms' range."""
    x = np.linspace(-60.0, 5.0, 10_000)
    return bool(
        np.array_equal(np.exp(x), [math.exp(v) for v in x])
        and np.array_equal(np.log1p(np.abs(x) / 61.0), [math.log1p(abs(v) / 61.0) for v in x])
    )


def test_probe_frames_compiled_are_the_numpy_frames_bit_for_bit():
    """:func:`probe_points`' frames (compiled) against :func:`_frame` per centre (numpy), on
    2000 unit vectors and 100 off the sphere by 1e-9 (a stage's centres), both helpers."""
    from tpde.schemes import sphere_atoms as sa

    rng = np.random.default_rng(4)
    centre = _unit(rng, 2100)
    centre[:100] *= 1.0 + 1e-9
    centre[100:200, 0] = np.sign(centre[100:200, 0]) * 0.95  # the second helper
    _, frames = sa.probe_points(centre)
    for i in range(centre.shape[0]):
        e1, e2 = sa._frame(centre[i])
        assert np.array_equal(frames[i, 0], e1) and np.array_equal(frames[i, 1], e2)


def _plain_series_velocity(head, points, modes, order):
    """The any-head sums at the atoms as first written (stacked arrays, an SVD per call):
    the reference of the cached form in :func:`series_velocity_at`."""
    from scipy.special import ive

    from tpde.variants.circle_atoms import SERIES_MOMENTS, SERIES_NODES

    theta = np.asarray(points, float)
    tilts = np.stack([np.cos(theta), np.sin(theta)], axis=1) @ head.A.T
    radius, angle = np.hypot(tilts[:, 0], tilts[:, 1]), np.arctan2(tilts[:, 1], tilts[:, 0])
    m = np.arange(-order, order + 1)
    scaled = ive(np.arange(order + 1)[None, :], radius[:, None])
    table = scaled[:, np.abs(m)] * np.exp(1j * np.outer(angle, m))
    K, shift = order, SERIES_MOMENTS - 1
    full = np.zeros(2 * K + 1 + shift, complex)
    have = min(modes.size, K + 1)
    full[K + shift : K + shift + have] = modes[:have]
    full[K + shift - have + 1 : K + shift][::-1] = np.conj(modes[1:have])
    columns = np.stack([full[shift - j : shift - j + 2 * K + 1] for j in range(shift + 1)], 1)
    moments = table @ columns
    x = np.stack([np.cos(theta), np.sin(theta)], axis=1)
    t = np.stack([-np.sin(theta), np.cos(theta)], axis=1)
    phi = 2 * np.pi * np.arange(SERIES_NODES) / SERIES_NODES
    y = np.stack([np.cos(phi), np.sin(phi)], axis=0)
    g, g1 = (x @ head.A.T) @ y, (t @ head.A.T) @ y
    n, n1 = (t @ head.C) @ y, -(x @ head.C) @ y
    curve = g1 * g1 - g
    values = np.stack([n, n1 + n * g1, -n + 2.0 * n1 * g1 + n * curve, np.ones_like(g), g1,
                       curve])  # fmt: skip
    f = np.fft.fft(values, axis=-1)[..., :SERIES_MOMENTS] / SERIES_NODES
    sums = f[..., 0].real * moments[None, :, 0].real
    sums = sums + 2.0 * np.add.reduce((f[..., 1:] * moments[None, :, 1:]).real, axis=-1)
    n0, n1, n2, z, z1, z2 = sums
    bound = float(np.linalg.norm(head.C, 2))
    u = n0 / z
    du = n1 / z - n0 * z1 / z**2
    d2u = n2 / z - (2.0 * n1 * z1 + n0 * z2) / z**2 + 2.0 * n0 * z1**2 / z**3
    return np.minimum(np.maximum(u, -bound), bound), du, d2u


def _series_reference(monkeypatch, *args):
    """:func:`_series_pass` run by the interpreter (its helpers too): the numpy form of the
    compiled pass, the same real operations in the same order."""
    from tpde.variants import circle_atoms as ca

    monkeypatch.setattr(ca, "_linear_modes", ca._linear_modes.py_func)
    monkeypatch.setattr(ca, "_product_modes", ca._product_modes.py_func)
    try:
        ca._series_pass.py_func(*args)
    finally:
        monkeypatch.undo()


def test_any_head_sums_at_the_atoms_against_the_fft_form(monkeypatch):
    """:func:`series_velocity_at` (one compiled pass: the integrands' modes in closed form,
    the series sums and the quotients) against the form first written (the integrands at 8
    nodes through an FFT, numpy's complex products), for two general heads at five atoms
    and at 400 random angles: the same values to round-off (the closed form and the 8-node
    FFT are both exact for these degree-3 integrands; they differ in the rounding of the
    modes and of the series' products only), and the compiled pass against the same pass
    run by the interpreter (:func:`_series_reference`): the same bits."""
    from scipy.special import ive

    from tpde.grid.circle import von_mises_mixture
    from tpde.variants import circle_atoms as ca
    from tpde.variants.parameters import Head

    grid = circle_grid(N)
    rho = von_mises_mixture(grid, [(0.5, 1.0, 20.0), (0.5, 4.0, 3.0)])
    atoms = Atoms.of([0.1, 0.2, 0.05, 0.1, 0.15], [[0.3], [1.9], [2.5], [4.4], [6.0]],
                     [[[1e-4]], [[4e-4]], [[1e-6]], [[2e-3]], [[1e-12]]], range(5))  # fmt: skip
    rng = np.random.default_rng(5)
    for A, C in [
        (np.diag([9.0, 6.0]), np.eye(2)),
        (np.array([[3.0, 1.0], [-0.5, 2.0]]), np.array([[1.0, 0.3], [0.2, -0.5]])),
    ]:
        head = Head(A, C)
        order = ca.series_bound_order(head)
        factors = ca.mode_factor(grid, N // 2)
        modes = ca.series_modes(rho, grid, atoms, order + 1, factors)
        for points in (atoms.centre[:, 0], rng.uniform(0.0, 2 * np.pi, 400)):
            got = ca.series_velocity_at(rho, grid, atoms, head, points, factors, order=order,
                                        modes=modes)  # fmt: skip
            want = _plain_series_velocity(head, points, modes, order)
            for name, a, b in zip(("u", "u'", "u''"), got, want, strict=True):
                gap = float(np.abs(a - b).max() / np.abs(b).max())
                print(f"order {order}, {points.size} points, {name}: |d| / max {gap:.1e}")
                assert gap < 1e-13
            # the compiled pass against the interpreter's, normalised and not
            radius, angle = ca._series_tilts(points, A)
            scaled = ive(np.arange(order + 1)[None, :], radius[:, None])
            bound = float(np.linalg.norm(C, 2))
            for normalised in (True, False):
                out, ref = np.empty((3, points.size)), np.empty((3, points.size))
                args = (points, radius, angle, scaled, modes, A, C, bound, normalised)
                ca._series_pass(*args, out)
                _series_reference(monkeypatch, *args, ref)
                assert np.array_equal(out, ref)
        # the tilts: the compiled hypot and atan2 of A x against numpy's
        radius, angle = ca._series_tilts(points, A)
        x = np.stack([np.cos(points), np.sin(points)], axis=1)
        tilts = x @ A.T
        assert np.abs(radius - np.hypot(tilts[:, 0], tilts[:, 1])).max() < 1e-14 * 9.0
        assert np.abs(angle - np.arctan2(tilts[:, 1], tilts[:, 0])).max() < 1e-14


def test_atom_modes_upto_is_atom_modes_bit_for_bit():
    """The atoms' modes ``0 .. count - 1`` from the kept exponent factors against
    :func:`atom_modes` at ``np.arange(count)``."""
    from tpde.variants.circle_atoms import atom_modes, atom_modes_upto

    atoms = Atoms.of([0.3, 0.2, 0.5], [[0.1], [2.5], [5.9]], [[[4e-4]], [[1e-9]], [[0.02]]],
                     [0, 1, 2])  # fmt: skip
    for count in (1, 30, 64, 200):
        assert np.array_equal(atom_modes_upto(atoms, count), atom_modes(atoms, np.arange(count)))


def test_atom_modes_compiled_are_numpys_sums_bit_for_bit():
    """:func:`atom_modes_upto`'s compiled pass (numpy's complex exp and pairwise row sums,
    up to PAIRWISE_BLOCK atoms) against numpy's form, for 1 .. 70 atoms (past the block:
    numpy serves) of random masses, centres and widths 1e-14 .. 0.1: the same bits."""
    from tpde.variants.circle_atoms import _exponent_factors, atom_modes_upto

    rng = np.random.default_rng(11)
    for count in range(1, 71):
        atoms = Atoms.of(rng.uniform(0.01, 1.0, count), rng.uniform(0.0, 2 * np.pi, (count, 1)),
                         10.0 ** rng.uniform(-14, -1, (count, 1, 1)), range(count))  # fmt: skip
        for modes in (1, 30, 200):
            ik, half_k2 = _exponent_factors(modes)
            a, s = atoms.centre[:, 0], atoms.cov[:, 0, 0]
            want = np.add.reduce(atoms.mass * np.exp(ik * a - half_k2 * s), axis=-1)
            assert np.array_equal(atom_modes_upto(atoms, modes), want)


def test_transfer_prechecks_skip_only_what_the_exact_tests_skip(monkeypatch):
    """The compiled pre-checks of :func:`absorb` (mass near an atom) and :func:`merge` (a
    pair within reach) against the transfers with the pre-checks off (every case to the
    exact numpy tests): 3000 random cases each, a third of them with the atoms' cells empty
    and the cells or pairs placed at the tests' edges (a cell centre ``absorb h`` from an
    atom, two atoms ``merge h`` or ``sd_i + sd_j`` apart, to the last bit): the same
    results bit for bit, and both outcomes (skipped, taken) occur."""
    from tpde.schemes import atom_cells as ac

    rng = np.random.default_rng(13)
    cells, options = _cells(), AtomOptions()
    h = cells.h
    cases = []
    for i in range(3000):
        count = int(rng.integers(1, 5))
        centre = rng.uniform(0.0, 2 * np.pi, count)
        var = (h * 10.0 ** rng.uniform(-3, 0.5, count)) ** 2
        edge = int(rng.integers(N))
        if i % 3 == 0:  # an atom on the edges of the tests
            centre[0] = cells.centres[edge] + options.absorb * h
            if count > 1:
                reach = max(options.merge * h, np.sqrt(var[0]) + np.sqrt(var[1]))
                centre[1] = centre[0] + reach * (1.0 + float(rng.choice([-1, 0, 1])) * 2e-16)
        centre = cells.wrap(centre)
        atoms = Atoms(centre * 0 + 0.1, centre[:, None], var[:, None, None], np.arange(count),
                      np.full(count, np.nan), np.full((count, 2), -1))  # fmt: skip
        rho = rng.uniform(0.0, 1.0, N) * (rng.uniform(size=N) < 0.2)
        if i % 3 != 2:  # the atoms' own cells emptied (a step after an absorption)
            for a in centre:
                rho[np.abs(cells.offset(cells.centres, a)) <= (options.absorb + 1.5) * h] = 0.0
            if i % 6 == 0:  # mass in the cell at the absorption's edge only
                rho[edge] = 0.5
        cases.append((rho, atoms))
    got = [
        (ac.absorb(rho, cells, atoms, options), ac.merge(atoms, cells, options, 1.0, 9))
        for rho, atoms in cases
    ]
    skipped = sum(
        not ac._mass_near(rho, cells.lower, h, atoms.centre[:, 0], 4, options.absorb * h)
        for rho, atoms in cases
    )
    monkeypatch.setattr(ac, "_mass_near", lambda *args: True)
    monkeypatch.setattr(ac, "_pair_near", lambda *args: True)
    merged = 0
    for (rho, atoms), ((out, absorbed), (joined, events, _)) in zip(cases, got, strict=True):
        ref_out, ref_absorbed = ac.absorb(rho, cells, atoms, options)
        ref_joined, ref_events, _ = ac.merge(atoms, cells, options, 1.0, 9)
        assert np.array_equal(out, ref_out)
        for a, b in ((absorbed, ref_absorbed), (joined, ref_joined)):
            assert np.array_equal(a.mass, b.mass) and np.array_equal(a.centre, b.centre)
            assert np.array_equal(a.cov, b.cov) and np.array_equal(a.ids, b.ids)
        assert events == ref_events
        merged += bool(events)
    print(f"absorption skipped in {skipped} of {len(cases)} cases; merges in {merged}")
    assert 0 < skipped < len(cases) and 0 < merged < len(cases)
