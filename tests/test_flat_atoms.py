"""Atoms on the flat grid in the co-moving frame (docs/theory.md, 'Atoms in the co-moving
frame'): the atoms' share of the softmax field at points, mixed with the cells', and its
derivatives at the atoms. References: the Gaussian mixture's closed form, a narrow Gaussian by
dense quadrature on a fine grid, central differences, and the Gaussian moment ODEs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.integrate import solve_ivp

from tpde.config import build
from tpde.grid import Grid, gaussian, gaussian_mixture, moments
from tpde.schemes.atoms import AtomOptions, Atoms, atom_rates
from tpde.schemes.box_atoms import absorb, convert, merge
from tpde.schemes.frame import AffineFrame
from tpde.schemes.solver import Problem, Scheme, Solver
from tpde.validation import solve
from tpde.validation.particles import TokenSystem, gauss_hermite_tokens, simulate, token_moments
from tpde.variants import ATTENTION, Head
from tpde.variants.flat_atoms import atom_field, cell_cumulants, mixture_means

A = np.array([[1.2, 0.3], [-0.2, 0.9]])
V = np.array([[0.8, -0.4], [0.3, 1.1]])
ATOM_COV = np.array([[4e-4, 1e-4], [1e-4, 9e-4]])


def gaussian_mixture_mean(c, weights, means, covs):
    """Tilted mean of sum_j w_j N(m_j, S_j) at tilts c (P, d): the closed form."""
    logs = np.stack(
        [
            np.log(w) + c @ m + 0.5 * np.einsum("pi,ij,pj->p", c, s, c)
            for w, m, s in zip(weights, means, covs, strict=True)
        ]
    )
    p = np.exp(logs - logs.max(axis=0))
    p /= p.sum(axis=0)
    tilted = np.stack([m + c @ s.T for m, s in zip(means, covs, strict=True)])
    return np.einsum("jp,jpi->pi", p, tilted)


def show(title, header, rows):
    print(f"\n{title}")
    print(" ".join(f"{h:>14}" for h in header))
    for row in rows:
        print(" ".join(f"{v:14.4e}" if isinstance(v, float) else f"{v!s:>14}" for v in row))


def test_cells_plus_an_atom_give_the_mixtures_field_at_the_faces():
    """A resolved Gaussian on the cells plus a narrow atom (below a cell): the frame's face
    velocity against the mixture's closed form, and the atom's share against dense
    quadrature of the narrow Gaussian on a fine grid."""
    grid = Grid([-10.0, -10.0], [10.0, 10.0], [40, 40])
    density = gaussian(grid, np.zeros(2), 0.6 * np.eye(2), mass=0.7)
    centre = np.array([1.0, -0.5])
    atoms = Atoms.of([0.3], [centre], [ATOM_COV], [0])
    frame = AffineFrame(np.zeros(2), np.eye(2))
    offsets = [np.array([0.5, 0.0]), np.array([0.0, 0.5])]
    rows = []
    worst = 0.0
    for with_atom in (False, True):
        field = ATTENTION["softmax"](Head(A, V), engine="direct")
        field.atoms = atoms if with_atom else None
        got = field.frame_components(density, grid, 0.0, offsets, [0, 1], frame)
        for axis, offset in enumerate(offsets):
            coords = grid.lattice(offset)
            mesh = np.meshgrid(*coords, indexing="ij")
            x = np.stack([m.reshape(-1) for m in mesh], axis=1)
            weights, means, covs = [0.7], [np.zeros(2)], [0.6 * np.eye(2)]
            if with_atom:
                weights, means, covs = [0.7, 0.3], [np.zeros(2), centre], [covs[0], ATOM_COV]
            exact = gaussian_mixture_mean(x @ A.T, weights, means, covs)
            u = (exact @ V.T)[:, axis].reshape(mesh[0].shape)
            moving = got[axis] != 0.0
            # the bulk: within 5 of the mean (the frame's window edges, 6.5 - 7.5 out, carry
            # the cells' own clip error of 5e-6 with or without the atom)
            inner = moving & (np.hypot(*np.meshgrid(*coords, indexing="ij")) < 5.0)
            err = np.abs(got[axis] - u)
            rows.append(
                (
                    "cells+atom" if with_atom else "cells",
                    axis,
                    int(moving.sum()),
                    float(err[moving].max()),
                    float(err[inner].max()),
                )
            )
            if with_atom:
                worst = max(worst, float(err[inner].max()))
    show(
        "face velocity against the mixture's closed form",
        ["measure", "axis", "faces", "max err", "err |x| < 5"],
        rows,
    )
    assert worst < 1e-11

    # the atom's share by dense quadrature of N(centre, ATOM_COV) on a fine local grid
    h = 0.002
    ticks = np.arange(-0.2, 0.2 + h / 2, h)
    y = np.stack(np.meshgrid(ticks + centre[0], ticks + centre[1], indexing="ij"), -1)
    y = y.reshape(-1, 2)
    inv = np.linalg.inv(ATOM_COV)
    dy = y - centre
    pdf = np.exp(-0.5 * np.einsum("pi,ij,pj->p", dy, inv, dy))
    pdf *= 0.3 / pdf.sum()
    c = np.array([[0.5, -1.0], [2.0, 1.0], [-1.5, 0.3]])
    logits = c @ y.T + np.log(pdf)
    top = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - top)
    quad_log = np.log(e.sum(axis=1)) + top[:, 0]
    quad_mean = (e @ y) / e.sum(axis=1, keepdims=True)
    log_z, mean = mixture_means(None, None, atoms, c)
    err_log = float(np.abs(log_z - quad_log).max())
    err_mean = float(np.abs(mean - quad_mean).max())
    show("atom share against fine quadrature", ["log Z err", "mean err"], [(err_log, err_mean)])
    assert err_log < 1e-10 and err_mean < 1e-10


def test_derivatives_at_the_atoms_match_central_differences():
    """Du and D^2u at two atoms among two bumps on the cells, in a sheared frame: the
    mixture cumulants against central differences of the pointwise field."""
    grid = Grid([-5.0, -5.0], [5.0, 5.0], [24, 24])
    density = gaussian_mixture(
        grid,
        [0.6, 0.4],
        [np.array([-1.0, 0.5]), np.array([1.2, -0.4])],
        [0.5 * np.eye(2), np.array([[0.4, 0.1], [0.1, 0.3]])],
        mass=0.8,
    )
    atoms = Atoms.of([0.12, 0.08], [[0.3, 0.9], [-0.7, -1.1]], [ATOM_COV, 2 * ATOM_COV], [0, 1])
    frame = AffineFrame(np.array([0.2, -0.1]), np.array([[1.1, 0.2], [-0.1, 0.9]]))
    heads = [Head(A, V), Head(0.5 * A.T, np.eye(2))]
    L, inverse = frame.matrix, frame.inverse
    shift = inverse @ frame.mean
    matrices = [L.T @ h.A @ L for h in heads]
    gains = [inverse @ h.C @ L for h in heads]
    constants = [inverse @ h.C @ frame.mean for h in heads]

    def field_at(points):
        u = np.zeros_like(points)
        for B, G, b in zip(matrices, gains, constants, strict=True):
            c = (points + shift) @ B.T
            log_z, mean, _, _ = cell_cumulants(density, grid, c)
            _, mixed = mixture_means(log_z, mean, atoms, c)
            u += mixed @ G.T + b
        return u

    u, du, d2u = atom_field(density, grid, heads, atoms, shift, matrices, gains, constants)
    step = 1e-4
    fd = np.empty_like(du)
    fd2 = np.empty_like(d2u)
    for j in range(2):
        e = np.zeros(2)
        e[j] = step
        fd[:, :, j] = (field_at(atoms.centre + e) - field_at(atoms.centre - e)) / (2 * step)
        args = (density, grid, heads, atoms, shift, matrices, gains, constants)
        up = atom_field(*args, points=atoms.centre + e)[1]
        down = atom_field(*args, points=atoms.centre - e)[1]
        fd2[:, :, :, j] = (up - down) / (2 * step)
    err_u = float(np.abs(u - field_at(atoms.centre)).max())
    err_du = float(np.abs(du - fd).max() / np.abs(du).max())
    err_d2u = float(np.abs(d2u - fd2).max() / np.abs(d2u).max())
    show(
        "derivatives at the atoms against central differences (h = 1e-4)",
        ["u err", "Du rel err", "D2u rel err"],
        [(err_u, err_du, err_d2u)],
    )
    assert err_u < 1e-13 and err_du < 1e-7 and err_d2u < 1e-6


def test_a_lone_atom_follows_the_gaussian_odes():
    """One atom and no cells: the softmax field of a Gaussian is affine, so the atom's
    (a, S) follows the Gaussian moment ODEs exactly (integrated here in a fixed sheared
    frame, compared in physical coordinates)."""
    head = Head(0.5 * A, V)  # (A itself blows this covariance up at t = 0.92)
    mean0, cov0 = np.array([0.4, -0.2]), np.array([[0.5, 0.1], [0.1, 0.3]])
    frame = AffineFrame(np.array([0.3, 0.1]), np.array([[0.9, 0.1], [-0.2, 1.1]]))
    L, inverse = frame.matrix, frame.inverse
    shift = inverse @ frame.mean
    B, G, b = L.T @ head.A @ L, inverse @ head.C @ L, inverse @ head.C @ frame.mean
    grid = Grid([-1.0, -1.0], [1.0, 1.0], [4, 4])  # (only its dimension is read)

    def rhs(_t, y):
        xi, S = y[:2], y[2:].reshape(2, 2)
        atoms = Atoms(
            np.ones(1), xi[None], S[None], np.zeros(1, int), np.full(1, np.nan), np.full((1, 2), -1)
        )
        u, du, d2u = atom_field(None, grid, [head], atoms, shift, [B], [G], [b])
        assert np.abs(d2u).max() < 1e-12  # (the field is affine)
        rates = atom_rates(u, du, d2u, S[None])
        return np.concatenate([rates.centre[0], rates.cov[0].reshape(-1)])

    y0 = np.concatenate([inverse @ (mean0 - frame.mean), (inverse @ cov0 @ inverse.T).ravel()])
    times = [0.25, 0.5, 1.0]
    ours = solve_ivp(rhs, (0, 1.0), y0, method="DOP853", rtol=1e-13, atol=1e-15, t_eval=times)
    assert ours.success, ours.message
    exact = solve("softmax", mean0, cov0, head, 1.0, times=times)
    rows = []
    worst = 0.0
    for i, t in enumerate(times):
        xi, S = ours.y[:2, i], ours.y[2:, i].reshape(2, 2)
        a, cov = frame.mean + L @ xi, L @ S @ L.T
        em, ec = exact.at(t)
        err = max(float(np.abs(a - em).max()), float(np.abs(cov - ec).max()))
        worst = max(worst, err)
        rows.append((t, err))
    show("a lone atom against the Gaussian ODEs", ["t", "max err"], rows)
    assert worst < 1e-10


#: options under which no cell ever joins an atom and no atom merges or spreads (the tests of
#: the atoms' motion: the measure stays the one the references follow)
NO_TRANSFERS = AtomOptions(width=1e-9, absorb=1e-9, merge=1e-9, release=1e9)


def frame_problem(
    grid, density, field, t_end, times, frame, atoms, tolerance=1e-10, options=NO_TRANSFERS
):
    return Problem(
        grid,
        density,
        field,
        t_end,
        scheme=Scheme(frame="affine", frame_tolerance=tolerance),
        snapshots=list(times),
        frame=frame,
        atoms=options,
        initial_atoms=atoms,
    )


@pytest.mark.parametrize(
    "cells, t_end, tolerance, bound",
    [
        (20, 0.2, 1e-8, 5e-9),
        pytest.param(32, 0.5, 1e-10, 1e-10, marks=pytest.mark.slow),
    ],
)
def test_an_atom_inside_a_gaussian_rides_with_the_frame(cells, t_end, tolerance, bound):
    """Cells N(0, I) in the frame (mass 0.9) plus an atom N(0, I) (mass 0.1): the measure is
    Gaussian, so the field is affine, the frame follows the Gaussian ODEs, the cells stay
    put and the atom stays at (0, I) in frame coordinates; mass is conserved."""
    head = Head(0.5 * A, V)
    mean0, cov0 = np.array([0.4, -0.2]), np.array([[0.5, 0.1], [0.1, 0.3]])
    grid = Grid([-10.0, -10.0], [10.0, 10.0], [cells, cells])
    density = gaussian(grid, np.zeros(2), np.eye(2), mass=0.9)
    atoms = Atoms.of([0.1], [np.zeros(2)], [np.eye(2)], [0])
    times = [0.5 * t_end, t_end]
    problem = frame_problem(
        grid,
        density,
        ATTENTION["softmax"](head),
        t_end,
        times,
        AffineFrame.following(mean0, cov0),
        atoms,
        tolerance,
    )
    result = Solver(problem).run()
    exact = solve("softmax", mean0, cov0, head, t_end, times=times)
    rows = []
    for snap in result.snapshots:
        if snap.time == 0.0:
            continue
        frame, atom = snap.frame, snap.atoms
        a = frame.mean + frame.matrix @ atom.centre[0]
        S = frame.matrix @ atom.cov[0] @ frame.matrix.T
        em, ec = exact.at(snap.time)
        err = max(float(np.abs(a - em).max()), float(np.abs(S - ec).max()))
        held = max(float(np.abs(atom.centre).max()), float(np.abs(atom.cov[0] - np.eye(2)).max()))
        mass = grid.integrate(snap.density) + atom.total_mass
        rows.append((snap.time, err, held, abs(mass - 1.0)))
    show(
        f"an atom inside a Gaussian, in the frame ({cells}^2, tolerance {tolerance:g})",
        ["t", "atom vs ODE", "xi, S - I", "mass err"],
        rows,
    )
    assert result.status == "completed" and len(rows) == 2
    assert max(r[1] for r in rows) < bound and max(r[2] for r in rows) < bound
    assert max(r[3] for r in rows) < 1e-13


def two_atoms_against_tokens(cells: int, t_end: float = 0.2):
    """Cells N(mean0, cov0) (mass 0.8) plus two narrow atoms (mass 0.1 each, S = 1e-8 I) in
    the frame, against 20^2 Gauss-Hermite tokens of the cells plus two weighted tokens
    (RK4, dt = 2e-3): the largest errors of the atoms' centres and of the cells' mean and
    covariance at t_end, the mass error, and the run."""
    head = Head(0.5 * A, V)
    mean0, cov0 = np.array([0.4, -0.2]), np.array([[0.5, 0.1], [0.1, 0.3]])
    places = np.array([[0.9, 0.2], [-0.3, -0.7]])
    grid = Grid([-10.0, -10.0], [10.0, 10.0], [cells, cells])
    frame = AffineFrame.following(mean0, cov0)
    inverse = frame.inverse
    narrow = inverse @ (1e-8 * np.eye(2)) @ inverse.T
    atoms = Atoms.of([0.1, 0.1], (places - frame.mean) @ inverse.T, [narrow, narrow], [0, 1])
    density = gaussian(grid, np.zeros(2), np.eye(2), mass=0.8)
    problem = frame_problem(
        grid, density, ATTENTION["softmax"](head), t_end, [t_end], frame, atoms, 1e-8
    )
    result = Solver(problem).run()
    snap = result.snapshots[-1]
    centres = snap.frame.physical(snap.atoms.centre)
    nodes, weights = gauss_hermite_tokens(mean0, cov0, 20)
    tokens = np.vstack([nodes, places])
    system = TokenSystem("softmax", head)
    end = simulate(
        system, tokens, t_end, 2e-3, weights=np.concatenate([0.8 * weights, [0.1, 0.1]])
    ).tokens[-1]
    token_mean, token_cov = token_moments(end[:-2], weights)
    _, xi_mean, xi_cov = moments(snap.density, grid)
    mean, cov = snap.frame.moments(xi_mean, xi_cov)
    mass = grid.integrate(snap.density) + snap.atoms.total_mass
    return (
        float(np.abs(centres - end[-2:]).max()),
        float(np.abs(mean - token_mean).max()),
        float(np.abs(cov - token_cov).max()),
        abs(mass - 1.0),
        float(np.abs(end[-2:] - places).max()),
        result,
    )


def test_two_atoms_follow_two_weighted_tokens():
    """Two narrow atoms among cells against the token system with two weighted tokens."""
    atoms, mean, cov, mass, moved, result = two_atoms_against_tokens(20)
    show(
        "two atoms + cells against tokens at t = 0.2 (20^2)",
        ["atom centres", "cells mean", "cells cov", "mass err", "moved"],
        [(atoms, mean, cov, mass, moved)],
    )
    assert result.status == "completed"
    assert atoms < 2e-5 and mean < 3e-5 and cov < 3e-4  # (measured 7.8e-6, 1.5e-5, 1.4e-4)
    assert mass < 1e-13 and moved > 0.1


@pytest.mark.slow
def test_two_atoms_converge_to_the_tokens():
    """The same against the cell count: the errors fall at least at second order."""
    rows = []
    for cells in (20, 32, 48):
        atoms, mean, cov, mass, _, result = two_atoms_against_tokens(cells)
        assert result.status == "completed" and mass < 1e-13
        rows.append((cells, atoms, mean, cov))
    show("two atoms + cells against tokens at t = 0.2", ["cells", "atoms", "mean", "cov"], rows)
    for (n1, a1, m1, _), (n2, a2, m2, _) in zip(rows, rows[1:], strict=False):
        ratio = np.log(n2 / n1)
        assert np.log(a1 / a2) / ratio > 2.0 and np.log(m1 / m2) / ratio > 2.0


def box_moments(rho, grid, atoms):
    """Mass, mean, covariance of piecewise-constant cells plus atoms, summed directly."""
    h = np.asarray(grid.spacing)
    volume = float(np.prod(h))
    x = np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)
    m = rho.reshape(-1) * volume
    total = m.sum() + atoms.mass.sum()
    mean = (m @ x + atoms.mass @ atoms.centre) / total
    dx, da = x - mean, atoms.centre - mean
    second = (
        np.einsum("s,si,sj->ij", m, dx, dx)
        + m.sum() * np.diag(h * h / 12)
        + np.einsum("k,kij->ij", atoms.mass, atoms.cov)
        + np.einsum("k,ki,kj->ij", atoms.mass, da, da)
    )
    return total, mean, second / total


def test_gaussian_data_never_create_an_atom():
    """A single Gaussian narrower than two cells is one cluster, the whole law: it stays on
    the cells (the frame follows it)."""
    for cells, sd in ((16, 1.0), (24, 1.0), (16, 0.7)):
        grid = Grid([-8.0, -8.0], [8.0, 8.0], [cells, cells])
        rho = gaussian(grid, np.zeros(2), sd**2 * np.eye(2))
        out, atoms, events, _ = convert(rho, grid, Atoms.empty(2), AtomOptions(), 0.0, 0)
        assert atoms.count == 0 and not events and out is rho


def test_narrow_clusters_become_atoms_with_their_exact_moments():
    """Four narrow bumps (0.4 cells) on a wide background: four atoms, each with its
    cells' mass, mean and covariance; the total moments are conserved; absorption of mass
    flowing in and a merge conserve them too."""
    grid = Grid([-4.0, -4.0], [4.0, 4.0], [32, 32])
    h = grid.spacing[0]
    corners = [np.array([sx, sy]) for sx in (-1.5, 1.5) for sy in (-1.5, 1.5)]
    narrow = (0.4 * h) ** 2 * np.eye(2)
    rho = gaussian_mixture(grid, [0.25] * 4, corners, [narrow] * 4, mass=0.8)
    rho = rho + gaussian(grid, np.zeros(2), 4.0 * np.eye(2), mass=0.2)
    options = AtomOptions()
    before = box_moments(rho, grid, Atoms.empty(2))
    out, atoms, events, next_id = convert(rho, grid, Atoms.empty(2), options, 1.0, 0)
    after = box_moments(out, grid, atoms)
    rows = [(k, float(atoms.mass[k]), *atoms.centre[k]) for k in range(atoms.count)]
    show("atoms born from four bumps", ["id", "mass", "x", "y"], rows)
    assert atoms.count == 4 and [e.kind for e in events] == ["atom_birth"] * 4
    assert next_id == 4
    for centre in corners:
        k = int(np.argmin(np.abs(atoms.centre - centre).sum(axis=1)))
        assert np.abs(atoms.centre[k] - centre).max() < 0.05 * h
        assert abs(atoms.mass[k] - 0.2) < 0.005
    errs = [abs(after[0] - before[0]), np.abs(after[1] - before[1]).max()]
    errs.append(np.abs(after[2] - before[2]).max())
    show("moments conserved by conversion", ["mass", "mean", "cov"], [tuple(errs)])
    assert max(errs) < 1e-14

    # mass flowing into an atom's cells joins it
    inflow = out + gaussian(grid, corners[0], narrow, mass=0.01)
    before = box_moments(inflow, grid, atoms)
    absorbed, grown = absorb(inflow, grid, atoms, options)
    after = box_moments(absorbed, grid, grown)
    k = int(np.argmin(np.abs(atoms.centre - corners[0]).sum(axis=1)))
    assert grown.mass[k] > atoms.mass[k] + 0.0099
    assert max(abs(after[0] - before[0]), np.abs(after[2] - before[2]).max()) < 1e-14

    # two atoms within their widths merge into one with the moments of both
    pair = Atoms.of([0.3, 0.2], [[0.0, 0.0], [0.3 * h, 0.1 * h]], [narrow, 2 * narrow], [7, 9])
    merged, found, _ = merge(pair, grid, options, 2.0, 10)
    total, mean, cov = box_moments(np.zeros(grid.shape), grid, pair)
    assert merged.count == 1 and found[0].parents == (7, 9) and merged.ids[0] == 10
    assert abs(merged.mass[0] - total) < 1e-15 and np.abs(merged.centre[0] - mean).max() < 1e-15
    assert np.abs(merged.cov[0] - cov).max() < 1e-15


def test_a_frame_run_turns_four_narrow_bumps_into_atoms():
    """Four narrow bumps (0.4 cells) in the frame become four atoms at the first step and
    move on as atoms: against Gauss-Hermite tokens (10^2, RK4) of each bump's cells' law as
    a Gaussian, with mass conserved and the births reported."""
    head = Head(np.eye(2), np.eye(2))
    grid = Grid([-2.5, -2.5], [2.5, 2.5], [32, 32])
    h = grid.spacing[0]
    corners = [np.array([sx, sy]) for sx in (-1.0, 1.0) for sy in (-1.0, 1.0)]
    narrow = (0.4 * h) ** 2 * np.eye(2)
    weights = [0.3, 0.2, 0.25, 0.25]
    density = gaussian_mixture(grid, weights, corners, [narrow] * 4)
    frame = AffineFrame(np.zeros(2), 0.5 * np.eye(2))
    t_end = 0.3
    problem = frame_problem(
        grid,
        density,
        ATTENTION["softmax"](head),
        t_end,
        [t_end],
        frame,
        None,
        1e-8,
        AtomOptions(),
    )
    result = Solver(problem).run()
    snap = result.snapshots[-1]
    births = [e for e in result.events if e.kind == "atom_birth"]
    assert result.status == "completed" and len(births) == 4 and snap.atoms.count == 4
    places = snap.frame.physical(snap.atoms.centre)
    # each bump's cells hold its exact moments (their piecewise-constant law, wider than
    # the bump by about h^2 / 12): the atoms carry those, so the tokens start from them
    tokens, token_weights = [], []
    mesh = grid.mesh(sparse=False)
    for c in corners:
        quadrant = (np.sign(mesh[0]) == np.sign(c[0])) & (np.sign(mesh[1]) == np.sign(c[1]))
        m, a, S = box_moments(np.where(quadrant, density, 0.0), grid, Atoms.empty(2))
        x, wx = gauss_hermite_tokens(frame.physical(a), frame.matrix @ S @ frame.matrix.T, 10)
        tokens.append(x)
        token_weights.append(m * wx)
    end = simulate(
        TokenSystem("softmax", head),
        np.vstack(tokens),
        t_end,
        2e-3,
        weights=np.concatenate(token_weights),
    ).tokens[-1]
    rows = []
    worst = 0.0
    for k in range(4):
        part = end[100 * k : 100 * (k + 1)]
        mean = token_weights[k] @ part / token_weights[k].sum()
        j = int(np.argmin(np.abs(places - mean).sum(axis=1)))
        err = float(np.abs(places[j] - mean).max())
        worst = max(worst, err)
        rows.append((k, float(snap.atoms.mass[j]), err))
    mass = grid.integrate(snap.density) + snap.atoms.total_mass
    show("four atoms against their bumps' tokens at t = 0.3", ["bump", "mass", "centre err"], rows)
    print(f"mass error {abs(mass - 1.0):.2e}; {births[0].message}")
    assert not [e for e in result.events if e.kind == "atom_closure"]
    assert abs(mass - 1.0) < 1e-13
    assert worst < 1e-5  # (measured 3.3e-6: the closure's O(S^2), S ~ 1e-3, and the residual)


def test_a_flat_frame_config_with_atoms_builds_them():
    """[atoms] on a flat frame run: the problem carries the options (the face's refusals and
    the file: tests/test_flat_atoms_face.py)."""
    raw = {
        "grid": {"lower": [-6.0, -6.0], "upper": [6.0, 6.0], "cells": [16, 16]},
        "attention": {"variant": "softmax", "A": [[1.0, 0.0], [0.0, 1.0]]},
        "scheme": {"frame": "affine"},
        "run": {"t_end": 0.1},
        "atoms": {"width": 1.5},
    }
    raw["attention"]["V"] = raw["attention"]["A"]
    problem = build(raw).problem
    assert problem.atoms == AtomOptions(width=1.5) and problem.frame is not None


def test_an_atom_whose_tails_rule_the_sums_is_reported():
    """sqrt(c^T S c) at the measure's extreme tilts (hand-computed here) above 1: the frame
    run says in one ``atom_closure`` event that the Gaussian closure no longer holds."""
    head = Head(3.0 * np.eye(2), np.eye(2))
    grid = Grid([-4.0, -4.0], [4.0, 4.0], [16, 16])
    density = gaussian(grid, np.zeros(2), np.eye(2), mass=0.9)
    atoms = Atoms.of([0.1], [[1.0, 0.0]], [0.3 * np.eye(2)], [0])
    frame = AffineFrame(np.zeros(2), np.eye(2))
    field = ATTENTION["softmax"](head)
    found = field.frame_atom_closure(density, grid, 0.0, atoms, frame)
    corner = np.array([4.0, 4.0])  # (the support box: every cell holds mass)
    expected = np.sqrt(0.3) * np.linalg.norm(3.0 * corner)
    print(f"\nclosure {found[0]:.6f}, by hand {expected:.6f}")
    assert abs(found[0] - expected) < 1e-12
    problem = frame_problem(grid, density, field, 0.01, [0.01], frame, atoms, 1e-8)
    result = Solver(problem).run()
    closure = [e for e in result.events if e.kind == "atom_closure"]
    assert len(closure) == 1 and "\n" not in closure[0].message
    print(closure[0].message)


def w2_points(xa, wa, xb, wb, whiten) -> float:
    """W2 between two weighted point sets in whitened coordinates (exact, POT)."""
    import ot

    keep_a, keep_b = wa > 1e-14, wb > 1e-14
    a, b = wa[keep_a] / wa[keep_a].sum(), wb[keep_b] / wb[keep_b].sum()
    cost = ot.dist(whiten(xa[keep_a]), whiten(xb[keep_b]))
    return float(np.sqrt(ot.emd2(a, b, cost, numItermax=10_000_000)))


@pytest.mark.slow
def test_corner_clusters_against_tokens():
    """Uniform data on [-1, 1]^2 under A = V = I: tokens (two seeds of 2500) form four
    clusters at the corners while the covariance grows like e^{2t}; the frame with atoms
    (32^2 on +-2.5) against them in whitened W2 (cells and atoms as weighted points) up to
    just after the atoms are born, and the closure event that says where it stops holding."""
    head = Head(np.eye(2), np.eye(2))
    times = [1.0, 2.0, 2.25]
    runs = []
    for seed in (1, 2):
        start = np.random.default_rng(seed).uniform(-1.0, 1.0, size=(2500, 2))
        solution = simulate(TokenSystem("softmax", head), start, 4.0, 0.02, times=[*times, 4.0])
        runs.append(solution)
    rows = []
    for i, t in enumerate([0.0, *times, 4.0]):
        x = runs[0].tokens[i]
        values = np.linalg.eigvalsh(np.cov(x.T))
        corners = np.sign(x)
        spread = max(
            float(np.sqrt(np.linalg.eigvalsh(np.cov(x[np.all(corners == s, axis=1)].T))[-1]))
            for s in itertools.product((-1, 1), repeat=2)
        )
        rows.append((t, *values, spread))
    show(
        "tokens: covariance eigenvalues and the widest corner cluster's sd",
        ["t", "l1", "l2", "corner sd"],
        rows,
    )
    assert rows[-1][1] > 100 * rows[0][2]  # (the covariance grows by orders of magnitude)
    assert rows[-1][3] < 0.05 * np.sqrt(rows[-1][1])  # (the corners are tight clusters)

    cells = 32
    grid = Grid([-2.5, -2.5], [2.5, 2.5], [cells, cells])
    frame = AffineFrame(np.zeros(2), np.sqrt(1.0 / 3.0) * np.eye(2))
    r = np.sqrt(3.0)
    share = [
        np.clip(np.minimum(e[1:], r) - np.maximum(e[:-1], -r), 0.0, None) / np.diff(e)
        for e in (grid.edges(0), grid.edges(1))
    ]
    density = np.outer(share[0], share[1]) / (2 * r) ** 2
    problem = Problem(
        grid,
        density,
        ATTENTION["softmax"](head),
        times[-1],
        scheme=Scheme(frame="affine", frame_tolerance=1e-8),
        snapshots=times,
        frame=frame,
        atoms=AtomOptions(),
        box_action="warn",
    )
    result = Solver(problem).run()
    closure = [e for e in result.events if e.kind == "atom_closure"]
    births = [e for e in result.events if e.kind == "atom_birth"]
    rows = []
    outputs = [0.0, *times, 4.0]  # (the token runs' output times)
    for snap in result.snapshots:
        if snap.time == 0.0:
            continue
        i = outputs.index(snap.time)
        whiten = whitening(runs[0].tokens[i])
        centres = np.stack([m.reshape(-1) for m in grid.mesh(sparse=False)], axis=1)
        points = snap.frame.physical(centres)
        weights = snap.density.reshape(-1) * float(np.prod(grid.spacing))
        if snap.atoms is not None and snap.atoms.count:
            points = np.vstack([points, snap.frame.physical(snap.atoms.centre)])
            weights = np.concatenate([weights, snap.atoms.mass])
        tokens = [run.tokens[i] for run in runs]
        even = np.full(2500, 1.0 / 2500)
        error = max(w2_points(points, weights, x, even, whiten) for x in tokens)
        noise = w2_points(tokens[0], even, tokens[1], even, whiten)
        count = 0 if snap.atoms is None else snap.atoms.count
        rows.append((snap.time, count, error, noise))
    show("frame + atoms against tokens (whitened W2)", ["t", "atoms", "W2", "token noise"], rows)
    print(
        f"births at {[round(e.time, 4) for e in births]}; {closure[0].message if closure else ''}"
    )
    assert len(births) == 4 and len(closure) == 1
    assert closure[0].time <= births[0].time + 1e-12  # (the closure fails at birth here)
    # the spread phase within the tokens' noise (measured 0.107 / 0.119, 0.175 / 0.211); at
    # t = 2.25, past the closure event, 0.467 against 0.257
    assert rows[0][2] < 3 * rows[0][3] and rows[1][2] < 3 * rows[1][3]


def whitening(tokens: np.ndarray):
    """The tokens' whitening map (their mean and covariance)."""
    mean = tokens.mean(axis=0)
    values, vectors = np.linalg.eigh(np.cov(tokens.T))
    root = (vectors / np.sqrt(values)) @ vectors.T
    return lambda x: (x - mean) @ root.T


def test_gaussian_frame_runs_are_the_same_with_atoms_on():
    """Gaussian data in the frame with atoms on (default options, cells of 1 sd): no atom is
    born and the run is the atoms-off run bit for bit (its Gaussian ODE errors unchanged)."""
    head = Head(0.5 * A, V)
    mean0, cov0 = np.array([0.4, -0.2]), np.array([[0.5, 0.1], [0.1, 0.3]])
    grid = Grid([-10.0, -10.0], [10.0, 10.0], [20, 20])
    out = []
    for options in (None, AtomOptions()):
        problem = Problem(
            grid,
            gaussian(grid, np.zeros(2), np.eye(2)),
            ATTENTION["softmax"](head),
            0.2,
            scheme=Scheme(frame="affine", frame_tolerance=1e-8),
            snapshots=[0.2],
            frame=AffineFrame.following(mean0, cov0),
            atoms=options,
        )
        out.append(Solver(problem).run())
    off, on = out[0].snapshots[-1], out[1].snapshots[-1]
    assert on.atoms is not None and on.atoms.count == 0
    assert np.array_equal(off.density, on.density) and off.step == on.step
    assert np.array_equal(off.frame.matrix, on.frame.matrix)
    assert np.array_equal(off.frame.mean, on.frame.mean)


def test_frame_atoms_with_noise_are_refused_in_one_line():
    """In frame coordinates the heat kernel's covariance is ``2 eps tau L^-1 L^-T``, which the
    atoms' noise substep (``+ 2 eps tau I``, the circle's) does not have: refused."""
    grid = Grid([-2.5, -2.5], [2.5, 2.5], [8, 8])
    density = gaussian(grid, np.zeros(2), np.eye(2))
    problem = Problem(
        grid,
        density,
        ATTENTION["softmax"](Head(np.eye(2), np.eye(2))),
        0.1,
        scheme=Scheme(frame="affine"),
        frame=AffineFrame(np.zeros(2), np.eye(2)),
        atoms=AtomOptions(),
        noise=0.1,
    )
    with pytest.raises(ValueError, match="atoms: not with run.noise in the co-moving frame"):
        Solver(problem)


@pytest.mark.slow
def test_four_clusters_in_the_frame_against_tokens(tmp_path):
    """examples/frame_atoms.toml (uniform [-1, 1]^2, heads 3 I / I and 0.1 I / -10 I, 32^2
    on +-2.5 frame units, atoms at 0.75 cells) run by ``tpde run``, against two seeds of
    10^4 tokens with the square's symmetry (examples/frame_atoms.py): four atoms, one per
    corner, whose width times the largest tilt is small once they are born; the W2 of cells
    plus atoms over the law's sd falls once the atoms carry the clusters; mass of cells plus
    atoms 1 to 1e-13. The target, W2 within the tokens' own noise (the W2 between the seeds)
    at every snapshot, is not met at 32^2: an xfail that says so."""
    import importlib.util
    from pathlib import Path

    from tpde.cli import main

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("frame_atoms", root / "examples/frame_atoms.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    output = tmp_path / "frame_atoms.nc"
    assert main(["run", str(root / "examples/frame_atoms.toml"), "-o", str(output), "--quiet"]) == 0
    times = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    runs = [example.tokens(seed, times) for seed in (1, 2)]
    rows = example.table(example.from_file(output, times), runs)
    header = ["t", "atoms", "law sd", "corner sd", "width*tilt", "asymmetry"]
    show("frame + atoms against 10^4 tokens", [*header, "W2/sd 1", "W2/sd 2", "noise/sd"], rows)
    from tpde.io import read

    ds = read(output)
    mass = ds["mass"].values
    print(f"mass of cells plus atoms: largest change {np.abs(mass - 1).max():.1e}")
    assert np.abs(mass - 1).max() < 1e-13
    born = [row for row in rows if row[1] > 0]
    assert born and all(row[1] == 4 for row in born) and rows[-1][1] == 4
    assert born[0][4] < 0.3  # (the Gaussian closure's condition at the first record with atoms)
    assert rows[-1][6] < rows[2][6] and rows[-1][7] < rows[2][7]  # (better once atoms carry)
    # the target, within the tokens' sampling noise at every snapshot: not met at 32^2
    # (measured W2/sd 0.043, 0.052, 0.065, 0.038, 0.021 against noise 0.035, 0.028, 0.017,
    # 0.015, 0.011 at t = 1 .. 5, cells as 8 x 8 points and atoms as 8 x 8 Gaussian points;
    # with atoms at their centres 0.052, 0.025 at t = 4, 5: the cells' error before the
    # births sets it, and a finer cell quadrature moves t = 1 .. 3 by 1e-3 only; a 48^2
    # frame grid: 0.034, 0.037, 0.040, 0.038, 0.019, within the noise at t = 1 only)
    if not all(max(row[6], row[7]) <= row[8] for row in rows):
        pytest.xfail("W2 of cells plus atoms within the tokens' noise: not met at 32^2")


def test_symmetric_tokens_move_as_the_whole_system():
    """The tokens of examples/frame_atoms.py: the images of 20 draws under the square's 8
    symmetries moved by the representatives' velocity only equal the full system's to
    round-off (both heads commute with signed permutations), and stay exact images."""
    from tpde.validation.particles import SymmetricTokens, square_group, symmetric_tokens

    heads = [Head(3.0 * np.eye(2), np.eye(2)), Head(0.1 * np.eye(2), -10.0 * np.eye(2))]
    group = square_group(2)
    assert group.shape == (8, 2, 2) and np.array_equal(group[0], np.eye(2))
    reps = np.sort(np.random.default_rng(3).uniform(0.0, 1.0, (20, 2)), axis=1)[:, ::-1]
    x0 = symmetric_tokens(reps, group)
    full = simulate(TokenSystem("multihead", heads), x0, 0.5, 0.05).tokens[-1]
    fast = simulate(SymmetricTokens(TokenSystem("multihead", heads), group), x0, 0.5, 0.05)
    end = fast.tokens[-1]
    gap = float(np.abs(end - full).max())
    print(f"\nsymmetric vs full token system at t = 0.5: {gap:.1e}")
    assert gap < 1e-13
    assert np.array_equal(end, symmetric_tokens(end[:20], group))


def test_cells_as_points_and_their_w2():
    """validation.metrics.cell_points keeps the cells' mass and mean exactly;
    wasserstein_points of a point set and its translate by v is |v| (the closed form)."""
    from tpde.validation.metrics import cell_points, wasserstein_points

    grid = Grid([-2.0, -1.0], [2.0, 1.0], [8, 4])
    rho = gaussian(grid, np.array([0.3, -0.1]), np.diag([0.5, 0.2]))
    mass, mean, cov = moments(rho, grid)
    for sub in (1, 3):
        x, w = cell_points(rho, grid, sub)
        assert x.shape == (32 * sub**2, 2) and abs(w.sum() - mass) < 1e-15
        assert np.abs(w @ x / w.sum() - mean).max() < 1e-14
    rng = np.random.default_rng(0)
    pts, wts = rng.normal(size=(40, 2)), rng.uniform(0.5, 1.0, 40)
    shift = np.array([0.3, -0.4])
    value = wasserstein_points(pts, wts, pts + shift, wts)
    print(f"\nW2 of a translate: {value:.15f} (|v| = 0.5)")
    assert abs(value - 0.5) < 1e-12


def _four_gaussians(frame: bool, bound: float, cells: int) -> dict:
    """The smooth four-cluster case: N((+-0.5, +-0.5), 0.09 I), equal weights, under the
    heads of examples/frame_atoms.toml, to t = 1 (a fixed box, or the frame with atoms)."""
    raw = {
        "grid": {"lower": [-bound] * 2, "upper": [bound] * 2, "cells": [cells] * 2},
        "initial": {
            "kind": "mixture",
            "weights": [1.0] * 4,
            "means": [[sx, sy] for sx in (0.5, -0.5) for sy in (0.5, -0.5)],
            "covariances": [[[0.09, 0.0], [0.0, 0.09]]] * 4,
        },
        "attention": {
            "variant": "multihead",
            "heads": [
                {"A": [[3.0, 0.0], [0.0, 3.0]], "V": [[1.0, 0.0], [0.0, 1.0]]},
                {"A": [[0.1, 0.0], [0.0, 0.1]], "V": [[-10.0, 0.0], [0.0, -10.0]]},
            ],
        },
        "run": {"t_end": 1.0, "snapshots": 2, "box_action": "warn"},
    }
    if frame:
        raw["scheme"] = {"frame": "affine", "frame_tolerance": 1e-8}
        raw["atoms"] = {"width": 0.75}
    return raw


@pytest.mark.slow
def test_four_gaussians_fixed_box_against_frame_at_t1():
    """Four Gaussian clusters (sd 0.3 at (+-0.5, +-0.5)) under the two heads against two
    seeds of 10^4 symmetric tokens at t = 1 (before any cluster is narrower than a cell):
    a fixed +-3 box at 64^2 is within the tokens' seed-to-seed W2; the co-moving frame
    (+-3.5 frame units, 36^2 and 64^2) is not, and its error grows with the cells, so the
    frame, not the atoms, keeps this case from its target (docs/theory.md, 'Atoms in the
    co-moving frame'). The frame's part is an xfail with the numbers."""
    import importlib.util
    from pathlib import Path

    from tpde.validation.particles import SymmetricTokens, square_group, symmetric_tokens

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("frame_atoms", root / "examples/frame_atoms.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    group = square_group(2)
    runs = []
    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        x = 0.5 * np.sign(rng.uniform(-1, 1, (1250, 2))) + 0.3 * rng.standard_normal((1250, 2))
        system = SymmetricTokens(TokenSystem("multihead", example.HEADS), group)
        x0 = symmetric_tokens(example.fold(x), group)
        runs.append(simulate(system, x0, 1.0, 0.1, times=[1.0]).tokens)
    rows = []
    for name, frame, bound, cells in (
        ("box +-3 64^2", False, 3.0, 64),
        ("frame +-3.5 36^2", True, 3.5, 36),
        ("frame +-3.5 64^2", True, 3.5, 64),
    ):
        result = Solver(build(_four_gaussians(frame, bound, cells)).problem).run()
        snap = result.snapshots[-1]
        assert result.status == "completed" and abs(snap.time - 1.0) < 1e-12
        mean, matrix = (snap.frame.mean, snap.frame.matrix) if frame else (np.zeros(2), np.eye(2))
        points = example.run_points(snap.density, result.grid, mean, matrix, None)
        (row,) = example.table([(1.0, 1, points, 0, 0.0)], runs)
        rows.append((name, *row[2:4], *row[6:]))
    show(
        "four Gaussians at t = 1",
        ["run", "law sd", "corner sd", "W2/sd 1", "W2/sd 2", "noise"],
        rows,
    )
    box = rows[0]
    assert max(box[3], box[4]) <= box[5]  # (measured 0.034, 0.043 against 0.046)
    # the frame: measured 0.122 / 0.111 at 36^2 and 0.151 / 0.158 at 64^2 against 0.046
    if not all(max(r[3], r[4]) <= r[5] for r in rows[1:]):
        pytest.xfail(
            "the co-moving frame on four Gaussians is off the tokens at t = 1 (W2/sd 0.12 at "
            "36^2, 0.15 at 64^2 against the noise 0.046) where a fixed box at 64^2 is within it"
        )
