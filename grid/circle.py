"""The circle S^1 as a periodic grid of angles: exact cell averages, Fourier modes, clusters.

docs/theory.md, 'Attention dynamics on the sphere'. A density on the circle is a function of
the angle ``theta`` (the token is ``x = (cos theta, sin theta)``), stored as cell averages on
``Grid([0], [2 pi / m], [N], "periodic")``. ``m = 1`` is the whole circle; ``m > 1`` is the
*m-fold symmetric* reduction: a density invariant under rotation by ``2 pi / m`` is stored on
one period ``[0, 2 pi / m)`` (its values are those of the full-circle density, so the grid
integral is ``1 / m`` of the total mass). The attention dynamics with a rotation-invariant
kernel keeps that symmetry, so one period is the whole problem; the rates study uses it to
keep round-off out of every mode that is not a multiple of ``m``.

Densities are with respect to ``d theta`` (the uniform probability is ``1 / (2 pi)``). The
cell averages here are exact: closed forms for trigonometric data, per-cell Gauss-Legendre
quadrature (relative accuracy in every cell) for von Mises data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.polynomial.legendre import leggauss
from numpy.typing import ArrayLike
from scipy.special import ive

from .grid import Grid

__all__ = [
    "TWO_PI",
    "CircleGrid",
    "atoms_on_cells",
    "circle_copies",
    "circle_grid",
    "clusters",
    "embed",
    "fourier_modes",
    "full_circle",
    "is_circle",
    "mode_amplitude",
    "noise_modes",
    "order_parameter",
    "smooth_noise",
    "tangent",
    "uniform_modes",
    "von_mises",
    "von_mises_mixture",
]

TWO_PI = 2.0 * math.pi
_GL_NODES = 16
_GL_MAX_EXPONENT_CHANGE = 6.0  # per sub-interval: 16 nodes are then exact to round-off


class CircleGrid(Grid):
    """The periodic angle grid of the circle (one period of an m-fold grid): a
    :class:`Grid` that says what its coordinate is. ``axis_attributes`` and
    ``file_attributes`` are the CF attributes a writer adds to the axis and the file."""

    @property
    def copies(self) -> int:
        return circle_copies(self)

    @property
    def axis_attributes(self) -> dict[str, str]:
        return {
            "units": "radian",
            "long_name": "angle theta on the circle S^1 (cell centre)",
            "comment": "the token is x = (cos theta, sin theta); density per unit angle",
        }

    @property
    def file_attributes(self) -> dict[str, object]:
        return {"geometry": "circle", "circle_copies": np.int64(self.copies)}

    def describe(self) -> str:
        reduction = f", {self.copies}-fold symmetric (one period)" if self.copies > 1 else ""
        return f"the circle S^1, {self.shape[0]} angle cells{reduction}"

    def state_lines(self, density: np.ndarray) -> list[str]:
        angles, masses = clusters(density, self)
        if angles.size == 0:
            return ["  clusters: none (no maximum above twice the uniform density)"]
        listed = ", ".join(f"{a:.4f} ({m:.4g})" for a, m in zip(angles, masses, strict=True))
        return [f"  clusters at the last snapshot: {angles.size}, angle (mass): {listed}"]


def circle_grid(cells: int, copies: int = 1) -> CircleGrid:
    """The periodic angle grid of ``cells`` cells on ``[0, 2 pi / copies)``."""
    if isinstance(cells, bool) or int(cells) != cells or cells < 7:
        raise ValueError(f"grid.cells: the circle needs at least 7 cells, got {cells!r}")
    if isinstance(copies, bool) or int(copies) != copies or copies < 1:
        raise ValueError(f"grid.copies: expected an integer >= 1, got {copies!r}")
    return CircleGrid([0.0], [TWO_PI / int(copies)], [int(cells)], "periodic")


def circle_copies(grid: Grid) -> int:
    """``m`` of a circle grid on ``[a, a + 2 pi / m)``; ValueError if ``grid`` is not one."""
    if not isinstance(grid, Grid) or grid.ndim != 1 or grid.boundary[0] != "periodic":
        raise ValueError("grid: the circle is a 1-D periodic grid of angles on [0, 2 pi / m)")
    period = grid.upper[0] - grid.lower[0]
    copies = round(TWO_PI / period)
    if copies < 1 or abs(copies * period - TWO_PI) > 1e-12 * TWO_PI:
        raise ValueError(
            f"grid: a circle grid spans 2 pi / m for an integer m, got a period of {period!r}"
        )
    return int(copies)


def is_circle(grid: Grid) -> bool:
    try:
        circle_copies(grid)
    except ValueError:
        return False
    return True


def embed(theta: np.ndarray) -> np.ndarray:
    """Points ``(cos theta, sin theta)``, shape ``theta.shape + (2,)``."""
    theta = np.asarray(theta, float)
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


def tangent(theta: np.ndarray) -> np.ndarray:
    """Unit tangents ``(-sin theta, cos theta)``, shape ``theta.shape + (2,)``."""
    theta = np.asarray(theta, float)
    return np.stack([-np.sin(theta), np.cos(theta)], axis=-1)


def _sinc(x: ArrayLike) -> np.ndarray:
    """sin(x) / x (numpy's sinc is sin(pi x) / (pi x))."""
    return np.asarray(np.sinc(np.asarray(x, float) / math.pi))


def _check_mass(mass: float) -> float:
    mass = float(mass)
    if not (math.isfinite(mass) and mass > 0):
        raise ValueError(f"initial.mass: expected a finite number > 0, got {mass!r}")
    return mass


def uniform_modes(
    grid: Grid,
    modes: Sequence[tuple[int, float, float]] = (),
    mass: float = 1.0,
) -> np.ndarray:
    """Exact cell averages of ``(mass / 2 pi) (1 + sum_j a_j cos(k_j (theta - phase_j)))``.

    ``modes``: ``(k, a, phase)`` triples. The average of ``cos(k (theta - p))`` over the cell
    centred at ``c`` is ``cos(k (c - p)) sinc(k h / 2)`` exactly. On an m-fold grid every
    ``k`` must be a multiple of ``m``. Raises if the density is negative somewhere.
    """
    copies = circle_copies(grid)
    mass = _check_mass(mass)
    h = grid.spacing[0]
    centres = grid.centres(0)
    shape = np.ones(centres.shape)
    bound = 1.0
    for item in modes:
        k, amplitude, phase = item
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ValueError(f"initial.modes: k must be an integer >= 1, got {k!r}")
        if int(k) % copies:
            raise ValueError(
                f"initial.modes: k = {k} is not a multiple of the grid's symmetry m = {copies}"
            )
        shape += float(amplitude) * np.cos(k * (centres - phase)) * _sinc(0.5 * k * h)
        bound -= abs(float(amplitude))
    if bound < 0:
        raise ValueError(
            "initial.modes: the amplitudes sum to more than 1, the density would be negative"
        )
    return mass / TWO_PI * shape


def noise_modes(
    amplitude: float, k_max: int, seed: int = 0, copies: int = 1
) -> list[tuple[int, float, float]]:
    """The ``(k, a, phase)`` triples of :func:`smooth_noise`: a random trigonometric
    polynomial of degree ``k_max`` in the multiples of ``copies`` (independent normal
    coefficients of ``cos``, ``sin`` of each mode, from ``seed``), rescaled so that its
    maximum is ``amplitude``; the same law as tokens see it
    (:func:`tpde.validation.circle_metastability.quantile_tokens`)."""
    if not (math.isfinite(amplitude) and 0 <= amplitude < 1):
        raise ValueError(f"initial.amplitude: expected a number in [0, 1), got {amplitude!r}")
    ks = np.arange(copies, int(k_max) + 1, copies)
    rng = np.random.default_rng(seed)
    coefficients = rng.normal(size=(ks.size, 2))
    fine = np.linspace(0.0, TWO_PI, 64 * int(k_max) + 1)  # the maximum, to rescale
    values = coefficients[:, :1] * np.cos(np.outer(ks, fine)) + coefficients[:, 1:] * np.sin(
        np.outer(ks, fine)
    )
    scale = amplitude / max(np.abs(values.sum(axis=0)).max(), 1e-300)
    return [
        (int(k), float(math.hypot(a, b) * scale), float(math.atan2(b, a) / k))
        for k, (a, b) in zip(ks, coefficients, strict=True)
    ]


def smooth_noise(
    grid: Grid, amplitude: float, k_max: int, seed: int = 0, mass: float = 1.0
) -> np.ndarray:
    """The uniform density times ``1 + amplitude * noise``: ``noise`` the random
    trigonometric polynomial of :func:`noise_modes`, as exact cell averages."""
    modes = noise_modes(amplitude, k_max, seed, circle_copies(grid))
    return _uniform_modes_unchecked(grid, modes, mass)


def _uniform_modes_unchecked(grid: Grid, modes, mass: float) -> np.ndarray:
    h = grid.spacing[0]
    centres = grid.centres(0)
    shape = np.ones(centres.shape)
    for k, amplitude, phase in modes:
        shape += amplitude * np.cos(k * (centres - phase)) * _sinc(0.5 * k * h)
    if shape.min() < 0:
        raise ValueError("initial: the perturbed density is negative somewhere")
    return _check_mass(mass) / TWO_PI * shape


def von_mises(grid: Grid, mean: float = 0.0, kappa: float = 1.0, mass: float = 1.0) -> np.ndarray:
    """Exact cell averages of ``mass e^{kappa cos(theta - mean)} / (2 pi I_0(kappa))``.

    Each cell is integrated by 16-point Gauss-Legendre rules on sub-intervals across which the
    exponent changes by at most 6 (round-off accuracy, relative in every cell, however small
    its value); the normalisation uses the scaled Bessel function (no overflow).
    """
    copies = circle_copies(grid)
    if copies != 1:
        raise ValueError("initial: a single von Mises density is not m-fold symmetric (m > 1)")
    return _von_mises(grid, float(mean), float(kappa), _check_mass(mass))


def _von_mises(grid: Grid, mean: float, kappa: float, mass: float) -> np.ndarray:
    if not (math.isfinite(kappa) and kappa >= 0):
        raise ValueError(f"initial.kappa: expected a finite number >= 0, got {kappa!r}")
    if not math.isfinite(mean):
        raise ValueError(f"initial.mean: expected a finite angle, got {mean!r}")
    h = grid.spacing[0]
    edges = grid.edges(0)
    pieces = max(1, math.ceil(kappa * h / _GL_MAX_EXPONENT_CHANGE))
    x, w = leggauss(_GL_NODES)
    sub = h / pieces
    # nodes of every sub-interval of every cell: (cells, pieces * nodes)
    starts = edges[:-1, None] + sub * np.arange(pieces)[None, :]
    nodes = (starts[:, :, None] + 0.5 * sub * (x + 1.0)).reshape(grid.cells[0], -1)
    weights = np.tile(0.5 * sub * w, pieces) / h
    values = np.exp(kappa * (np.cos(nodes - mean) - 1.0)) @ weights
    return mass * values / (TWO_PI * float(ive(0, kappa)))


def von_mises_mixture(
    grid: Grid,
    components: Sequence[tuple[float, float, float]],
) -> np.ndarray:
    """Exact cell averages of ``sum_j w_j VM(mean_j, kappa_j)``; ``components``:
    ``(weight, mean, kappa)`` triples (weights > 0; the total mass is their sum)."""
    if circle_copies(grid) != 1:
        raise ValueError("initial: a von Mises mixture is given on the whole circle (m = 1)")
    if not components:
        raise ValueError("initial.components: expected at least one (weight, mean, kappa)")
    out = np.zeros(grid.shape)
    for weight, mean, kappa in components:
        out += _von_mises(grid, float(mean), float(kappa), _check_mass(weight))
    return out


def fourier_modes(density: np.ndarray, grid: Grid, k_max: int | None = None) -> np.ndarray:
    """``c_k = int_0^{2 pi} rho(theta) e^{-i k theta} d theta`` for ``k = 0, m, 2m, ..`` up to
    ``k_max`` (default: below the grid's Nyquist mode), from the cell averages.

    The DFT of the cell averages is the box-filtered density's: dividing by
    ``sinc(k h / 2)`` undoes the filter, so the result is exact up to aliasing (spectrally
    small for a resolved density). On an m-fold grid the modes are the multiples of m and the
    integral is over the whole circle.
    """
    copies = circle_copies(grid)
    arr = np.asarray(density, float)
    n = grid.cells[0]
    if arr.shape[-1] != n:
        raise ValueError(f"density: expected {n} cells on the last axis, got {arr.shape}")
    count = n // 2 if k_max is None else int(k_max) // copies + 1
    if count > n // 2 + 1:
        raise ValueError(f"k_max = {k_max} is beyond the grid's Nyquist mode {copies * (n // 2)}")
    h = grid.spacing[0]
    dft = np.fft.rfft(arr, axis=-1)[..., :count]
    k = copies * np.arange(count)
    # the DFT's phase refers to the first centre, lower + h / 2
    phase = np.exp(-1j * k * (grid.lower[0] + 0.5 * h))
    return TWO_PI / n * dft * phase / _sinc(0.5 * k * h)


def mode_amplitude(density: np.ndarray, grid: Grid, k: int) -> np.ndarray:
    """``|c_k| / c_0``: the relative amplitude of mode ``k`` (for ``(1 + a cos(k theta))``
    data this is ``a / 2``)."""
    copies = circle_copies(grid)
    if k % copies:
        raise ValueError(f"mode k = {k} is not a multiple of the grid's symmetry m = {copies}")
    modes = fourier_modes(density, grid, k)
    return np.abs(modes[..., k // copies]) / np.real(modes[..., 0])


def clusters(
    density: np.ndarray, grid: Grid, threshold: float = 2.0
) -> tuple[np.ndarray, np.ndarray]:
    """Clusters of a density on the circle: local maxima above ``threshold`` times the
    uniform density of the same mass, each with the mass of its basin.

    The basin of a maximum reaches to the minima on either side (periodic); a basin whose
    maximum is below the threshold is merged into nothing (its mass is not counted). Returns
    the angles of the maxima (cell centres) and the masses of their basins, by angle.
    """
    copies = circle_copies(grid)
    rho = np.asarray(density, float)
    n = rho.size
    h = grid.spacing[0]
    level = threshold * rho.sum() * h * copies / TWO_PI
    left, right = np.roll(rho, 1), np.roll(rho, -1)
    # a plateau counts once: strictly above the left neighbour, at least the right one
    peaks = np.flatnonzero((rho > left) & (rho >= right) & (rho > level))
    if peaks.size == 0:
        return np.empty(0), np.empty(0)
    minima = np.flatnonzero((rho <= left) & (rho < right))
    masses = np.empty(peaks.size)
    for i, p in enumerate(peaks):
        # the minima bounding the basin of p (periodic search)
        if minima.size == 0:
            masses[i] = rho.sum() * h
            continue
        after = minima[minima > p]
        before = minima[minima < p]
        hi = after[0] if after.size else minima[0] + n
        lo = before[-1] if before.size else minima[-1] - n
        index = np.arange(lo, hi) % n
        # the minima cells are shared: half to each side
        masses[i] = (rho[index].sum() - 0.5 * rho[lo % n] + 0.5 * rho[hi % n]) * h
    return grid.centres(0)[peaks], masses


def full_circle(theta: np.ndarray, density: np.ndarray, copies: int):
    """An m-fold run (``copies`` = m) on the whole circle: the angles ``theta`` of one period
    and the ``density`` (..., cells) repeated m times."""
    if copies == 1:
        return theta, density
    period = TWO_PI / copies
    theta = np.concatenate([theta + j * period for j in range(copies)])
    return theta, np.concatenate([density] * copies, axis=-1)


def order_parameter(density: np.ndarray, grid: Grid, copies: int) -> np.ndarray:
    """The order parameter ``|c_m| / c_0`` of every snapshot of ``density`` (time, cells)
    (``m`` = copies; m = 1: ``|<e^{i theta}>|``; :func:`fourier_modes`), shape (time,)."""
    modes = fourier_modes(density, grid, copies)
    return np.abs(modes[..., -1]) / np.maximum(np.abs(modes[..., 0]), 1e-300)


def atoms_on_cells(
    density: np.ndarray,
    grid: Grid,
    centre: np.ndarray,
    mass: np.ndarray,
    variance: np.ndarray,
) -> np.ndarray:
    """The cell averages ``(time, cells)`` of ``density`` plus atoms: each atom's wrapped
    normal ``m N(a, s)`` averaged over the cells, ``m / h sum_w (Phi((e_{j+1} - a - w L) /
    sqrt s) - Phi((e_j - a - w L) / sqrt s))`` (``L`` the period, ``w`` the wraps within 8
    standard deviations; a point mass, ``s = 0``, into the cell of its centre). ``centre``,
    ``mass``, ``variance``: ``(time, slots)``, NaN in an empty slot (the file's atoms,
    tpde.atoms_io). ``density`` is not changed."""
    from scipy.special import ndtr

    density = np.array(density, dtype=float)
    n = density.shape[-1]
    h = grid.spacing[0]
    period = n * h
    edges = np.arange(n + 1) * h
    centre = np.mod(np.asarray(centre, float), period)
    for r in range(density.shape[0]):
        held = np.flatnonzero(np.isfinite(centre[r]) & np.isfinite(mass[r]))
        for j in held:
            a, m, v = centre[r, j], mass[r, j], max(float(variance[r, j]), 0.0)
            sigma = np.sqrt(v)
            if sigma < 1e-9 * h:  # (a point: its cell holds it)
                density[r, min(int(a / h), n - 1)] += m / h
                continue
            wraps = np.arange(
                -int(np.ceil(8 * sigma / period)) - 1, int(np.ceil(8 * sigma / period)) + 2
            )
            shifted = (edges[None, :] - a - wraps[:, None] * period) / sigma
            density[r] += m * np.diff(ndtr(shifted), axis=1).sum(axis=0) / h
    return density
