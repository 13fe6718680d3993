"""Softmax attention on the circle S^1: the tangential field on a periodic grid of angles.

docs/theory.md, 'Attention dynamics on the sphere' and 'The circle on the grid'. Tokens are
``x = (cos theta, sin theta)``; the angle moves at ``theta' = <t(theta), Gamma(x)>``, ``t``
the unit tangent, with

    Gamma(x) = C int y e^{<A x, y>} dmu(y) / int e^{<A x, y>} dmu(y)    (normalised)
    Gamma(x) = C int y e^{<A x, y>} dmu(y)                              (unnormalised)

for a head ``(A, V[, W])``, ``C = W V`` (docs/theory.md, 'Conventions'). The velocity is the
angular one, on the lattices of the periodic angle grid (:mod:`tpde.grid.circle`), so the
finite-volume scheme of :mod:`tpde.schemes` (WENO5-Z, positivity limiter, SSP-RK) runs on it
unchanged.

Engines (``engine=``):

* ``"fft"``: for a rotation-invariant kernel (``A = a I + b J``, ``J`` the rotation by
  pi/2) the sums are circular convolutions. With ``s = phi - theta`` the kernel is
  ``g(s) = e^{a cos s + b sin s}`` with Fourier coefficients ``I_|k|(r) e^{-i k alpha}``
  (``r e^{i alpha} = a + i b``), the tangential numerator of the conformal part
  ``p I + q J`` of ``C`` is ``(p sin s + q cos s) g(s)``, and the rest of ``C``,
  ``[[c, d], [d, -c]]``, contributes ``Re[(d + i c) e^{2 i theta} int e^{i s} g(s) dmu]``.
  The Fourier coefficients of the density come from the DFT of the cell averages divided by
  ``sinc(k h / 2)`` (the exact cell-average correction: the box filter acts on
  ``e^{i k theta}`` by that factor), so the sums are exact up to the aliasing of the
  density's modes beyond the grid's Nyquist mode: spectral accuracy. The accuracy is
  absolute, ``~1e-16`` of the largest term, and it is exact mode by mode, which the linear
  rates need (a mode's velocity is its own coefficient times the kernel's, whatever the
  other modes hold). Any other 2 x 2 ``A`` takes the Jacobi-Anger series of
  :mod:`tpde.variants.engines.bessel` from the same coefficients: per target ``c = A x``,
  ``e^{c.y} = sum_k I_k(|c|) e^{i k (phi - arg c)}``, cut a posteriori where the tail bound
  falls below 1e-14 of the sums' scale (``O(N K)`` per lattice, ``K ~ |A| + 30``; the same
  absolute accuracy).
* ``"bessel"``: that series for every head, ``a I + b J`` included (atoms and m-fold grids
  take ``"fft"``).
* ``"direct"``: any ``A``, ``C``: dense sums over eighth-order point values of the density
  (``tpde.grid.stencils.point_values``, negatives set to zero) with all terms positive:
  relative accuracy in the denominator however small the sums are (a clustered density
  far from its clusters), ``O(N^2)`` per lattice.
* ``"auto"`` (default): ``"fft"`` for any head with ``|A| <= 8``
  (``e^{2 |A|} 1e-16 <= 1e-9``: the relative error of the smallest sums), ``"direct"``
  otherwise.

The m-fold reduced grids of :mod:`tpde.grid.circle` (``copies = m > 1``) need a
rotation-invariant kernel and value map (``A`` and ``C`` of the form ``a I + b J``) and the
FFT engine: the density's modes are then the multiples of ``m``.

A normalised velocity is clipped to ``|theta'| <= ||C||_2`` (the tangential part of an
average of points mapped by ``C``; docs/theory.md, 'Clip of tilted means'); where the
FFT denominator is not positive (round-off far from all mass) the velocity is 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numba
import numpy as np
from numpy.typing import ArrayLike
from scipy.special import ive

from tpde.grid import Grid
from tpde.grid.circle import TWO_PI, circle_copies, fourier_modes
from tpde.grid.stencils import point_values
from tpde.schemes.velocity import VelocityField

from .circle_atoms import (
    add_atom_spectrum,
    atom_modes_upto,
    check_band,
    dft_factor,
    kernel_band,
    kernel_modes,
    mode_factor,
    series_bound_order,
    series_velocity_at,
    velocity_at,
)
from .engines.bessel import BesselSeries
from .engines.cache import Recent
from .engines.registry import check_engine, engine_names
from .parameters import Head, ParamSpec, as_param_spec, params_at

__all__ = [
    "CIRCLE_ENGINES",
    "CircleAttention",
    "circle_head",
    "conformal_parts",
    "is_conformal",
    "interaction_energy",
]

#: the circle's engine names (:data:`~.engines.registry.CONFIG_ENGINES`)
CIRCLE_ENGINES = engine_names("circle")
#: the largest |A| for which "auto" takes the FFT engine
FFT_AUTO_MAX_NORM = 8.0
_CONFORMAL_TOLERANCE = 1e-12


def circle_head(beta: float, value: float = 1.0) -> Head:
    """The standard head on the circle: ``A = beta I``, ``V = value I``."""
    return Head(float(beta) * np.eye(2), float(value) * np.eye(2))


def conformal_parts(M: np.ndarray) -> tuple[float, float, float, float]:
    """``M = a I + b J + [[c, d], [d, -c]]`` (``J = [[0, -1], [1, 0]]``): ``(a, b, c, d)``.

    The first part commutes with rotations (``<(a I + b J) x, y> = a cos s + b sin s``,
    ``s = phi - theta``); the second is a reflection part
    (``<[[c, d], [d, -c]] x, y> = c cos(phi + theta) + d sin(phi + theta)``).
    """
    M = np.asarray(M, float)
    return (
        0.5 * (M[0, 0] + M[1, 1]),
        0.5 * (M[1, 0] - M[0, 1]),
        0.5 * (M[0, 0] - M[1, 1]),
        0.5 * (M[0, 1] + M[1, 0]),
    )


def is_conformal(M: np.ndarray) -> bool:
    """Whether ``M = a I + b J`` (commutes with rotations) up to 1e-12 relative."""
    a, b, c, d = conformal_parts(M)
    return math.hypot(c, d) <= _CONFORMAL_TOLERANCE * max(1.0, math.hypot(a, b))


def _head(spec: ParamSpec, t: float) -> Head:
    head = params_at(spec, t)
    if not isinstance(head, Head) or head.dim != 2:
        raise ValueError(
            "attention: on the circle the parameters are one head with 2 x 2 A and C = W V "
            "(the embedded points x = (cos theta, sin theta))"
        )
    return head


def _fingerprint(rho: np.ndarray) -> tuple[float, float, int]:
    """A cheap identity of a density (its sum, a weighted sum, its size): the atoms' modes of
    a face evaluation are reused only for the same density."""
    total, weighted = _density_sums(rho.reshape(-1))
    return (total, weighted, int(rho.size))


@numba.njit(cache=True)
def _density_sums(flat):  # pragma: no cover - compiled
    """``sum rho_j`` and ``sum j rho_j`` in one pass (an identity, not a value: both sides
    of the comparison are this function's)."""
    total = 0.0
    weighted = 0.0
    for j in range(flat.size):
        total += flat[j]
        weighted += j * flat[j]
    return total, weighted


def _summed_for(kept: tuple | None, atoms, rho: np.ndarray):
    """The value a face evaluation kept as ``(atoms, fingerprint, value)`` when it was for
    these atoms and this density (the same stage), else None."""
    if kept is not None and kept[0] is atoms and kept[1] == _fingerprint(rho):
        return kept[2]
    return None


def _sinc(x: np.ndarray) -> np.ndarray:
    return np.sinc(np.asarray(x, float) / math.pi)


class CircleAttention(VelocityField):
    """Softmax attention on the circle; the velocity is ``theta'`` (shape ``(1, P)``).

    params: a :class:`Head` with 2 x 2 ``A`` and ``C`` (``circle_head(beta)`` for
    ``A = beta I``, ``V = I``), or Layers / a callable of them. normalised: False for the
    unnormalised variant. engine: ``"auto"`` | ``"fft"`` | ``"bessel"`` | ``"direct"``
    (module docstring; :func:`~.engines.registry.check_engine`, aliases read as names).
    """

    def __init__(self, params: ParamSpec, normalised: bool = True, engine: str = "auto"):
        self.engine = check_engine(engine, "circle")
        self.spec = as_param_spec(params)
        self.normalised = bool(normalised)
        self.last_engine: str | None = None
        self._fixed = Recent(16)  # kernel coefficients / tables per (grid, head, offset)
        #: what this stage's face evaluation summed for its atoms, (atoms, fingerprint of the
        #: density, value): the atoms' modes (convolution) and the series' c_m (any head)
        self._atom_modes: tuple | None = None
        self._series_modes: tuple | None = None

    # ---- the protocol ----------------------------------------------------------------------
    def at(self, density: np.ndarray, grid: Grid, t: float, offset: ArrayLike) -> np.ndarray:
        return self.at_many(density, grid, t, [offset])[0]

    def at_many(
        self, density: np.ndarray, grid: Grid, t: float, offsets: Sequence[ArrayLike]
    ) -> list[np.ndarray]:
        copies = circle_copies(grid)
        head = _head(self.spec, t)
        engine = self.choose(head, copies)
        self.last_engine = engine
        rho = np.asarray(density, float)
        if rho.shape != grid.shape:
            raise ValueError(f"density: expected shape {grid.shape}, got {rho.shape}")
        # the face lattice (offset 1/2) starts at the lower boundary face: face j is at
        # centre j - 1/2, and the last face (n) repeats face 0
        offs = [float(np.asarray(off, float).reshape(-1)[0]) for off in offsets]
        shifts = [-0.5 if off == 0.5 else off for off in offs]
        if self.atoms is not None and self.atoms.count:
            self._check_atoms(grid, head, engine, copies)
        if engine == "fft" and is_conformal(head.A):
            values = self._fft(rho, grid, head, copies, shifts)
        elif engine in ("fft", "bessel"):  # (fft: the series where A is not a I + b J)
            values = self._bessel(rho, grid, head, shifts)
        else:
            values = self._direct(rho, grid, head, shifts)
        return [
            (np.append(v, v[0]) if off == 0.5 else v)[None, :]
            for v, off in zip(values, offs, strict=True)
        ]

    # ---- atoms (docs/theory.md, 'Cells plus atoms') ------------------
    def _check_atoms(self, grid: Grid, head: Head, engine: str, copies: int) -> None:
        # the atoms' modes join the convolution's spectrum (A = a I + b J) or the Bessel
        # series' coefficients (any A, engines/bessel.py); the direct engine's point sums
        # have no atom share, so it is refused, never silently cellular
        key = ("atoms-checked", grid, id(head), engine, copies)
        cached = self._fixed.get(key)
        if cached is not None and cached[0] is head:
            return  # (checked for this grid and head: every stage asks again)
        if engine != "fft" or copies != 1:
            raise ValueError(
                'atoms: on the circle atoms need attention.engine = "fft" (auto takes it for '
                "|A| <= 8) and grid.copies = 1"
            )
        if is_conformal(head.A):
            self._atom_kernel(grid, head)  # (the convolution's band holds the kernel)
        self._fixed[key] = (head, True)

    def atom_velocity(self, density, grid: Grid, t: float, atoms):
        """``(u, u', u'')`` at the atoms' centres, shapes (K, 1), (K, 1, 1), (K, 1, 1, 1)."""
        head = _head(self.spec, t)
        rho = np.asarray(density, float)
        if not self._rotation_invariant(head):  # any head: the series
            reuse = _summed_for(self._series_modes, atoms, rho)  # (the faces' c_m)
            if reuse is None:  # (else the faces' evaluation checked these atoms)
                copies = circle_copies(grid)
                self._check_atoms(grid, head, self.choose(head, copies), copies)
            u, du, d2u = series_velocity_at(
                rho,
                grid,
                atoms,
                head,
                atoms.centre[:, 0],
                self._mode_factors(grid),
                self.normalised,
                self._series_order(head),
                reuse,
            )
            return u[:, None], du[:, None, None], d2u[:, None, None, None]
        modes = _summed_for(self._atom_modes, atoms, rho)
        if modes is None:
            copies = circle_copies(grid)
            self._check_atoms(grid, head, self.choose(head, copies), copies)
        u, du, d2u = velocity_at(
            rho,
            grid,
            atoms,
            head,
            atoms.centre[:, 0],
            self.normalised,
            self._atom_kernel(grid, head),
            modes,
        )
        return u[:, None], du[:, None, None], d2u[:, None, None, None]

    def _rotation_invariant(self, head: Head) -> bool:
        """Whether ``A`` and ``C`` are both ``a I + b J`` (:func:`is_conformal`), kept while
        the head is."""
        key = ("rotation-invariant", id(head))
        cached = self._fixed.get(key)
        if cached is None or cached[0] is not head:
            cached = (head, is_conformal(head.A) and is_conformal(head.C))
            self._fixed[key] = cached
        return cached[1]

    def _series_order(self, head: Head) -> int:
        """:func:`series_bound_order` of the head, kept while it is."""
        key = ("series-order", id(head))
        cached = self._fixed.get(key)
        if cached is None or cached[0] is not head:
            cached = (head, series_bound_order(head))
            self._fixed[key] = cached
        return cached[1]

    def _atom_kernel(self, grid: Grid, head: Head):
        """The kernel's modes the atoms' sums need (fixed while grid and head are)."""
        key = ("atoms", grid, id(head))
        cached = self._fixed.get(key)
        if cached is None or cached[0] is not head:
            a, b, _, _ = conformal_parts(head.A)
            check_band(grid, head)
            band = kernel_band(math.hypot(a, b), grid.cells[0])
            cached = (head, kernel_modes(head, band))
            self._fixed[key] = cached
        return cached[1]

    def _atom_factors(self, grid: Grid, head: Head) -> tuple[int, np.ndarray, np.ndarray]:
        """The band of :meth:`_atom_kernel` with its :func:`dft_factor` and
        :func:`mode_factor` (fixed while grid and head are: no look-up per stage)."""
        key = ("atom-factors", grid, id(head))
        cached = self._fixed.get(key)
        if cached is None or cached[0] is not head:
            band = self._atom_kernel(grid, head)[0].size
            cached = (head, (band, dft_factor(grid, band), mode_factor(grid, band)))
            self._fixed[key] = cached
        return cached[1]

    def choose(self, head: Head, copies: int = 1) -> str:
        """The engine for ``head`` (and an m-fold grid)."""
        conformal = is_conformal(head.A)
        if copies > 1:
            if not (conformal and is_conformal(head.C)):
                raise ValueError(
                    "grid.copies: an m-fold symmetric circle grid needs A and C of the form "
                    "a I + b J (rotation-invariant attention)"
                )
            if self.engine != "auto" and self.engine != "fft":
                raise ValueError('grid.copies: an m-fold circle grid needs engine = "fft"')
            return "fft"
        if self.engine != "auto":
            return self.engine
        return "fft" if self._norms(head)[0] <= FFT_AUTO_MAX_NORM else "direct"

    def _norms(self, head: Head) -> tuple[float, float]:
        """``(||A||_2, ||C||_2)``, kept while the head is (an SVD each: a step's cost)."""
        key = ("norms", id(head))
        cached = self._fixed.get(key)
        if cached is None or cached[0] is not head:
            norms = (float(np.linalg.norm(head.A, 2)), float(np.linalg.norm(head.C, 2)))
            cached = (head, norms)
            self._fixed[key] = cached
        return cached[1]

    def _bound(self, head: Head) -> float:
        """``||C||_2``: the clip of a normalised velocity."""
        return self._norms(head)[1]

    # ---- the FFT engine -------------------------------------------------------------------
    def _fft_coefficients(self, grid: Grid, head: Head, copies: int, shift: float):
        """Per lattice: the kernel factors of Z, of the conformal numerator and of the
        reflection numerator on the grid's modes (FFT order), with the target phases."""
        key = ("fft", grid, id(head), shift)
        cached = self._fixed.get(key)
        if cached is not None and cached[0] is head:
            return cached[1]
        n = grid.cells[0]
        h = grid.spacing[0]
        q = np.fft.fftfreq(n, 1.0 / n).astype(int)  # 0, 1, .., -1
        k = copies * q
        a, b, _, _ = conformal_parts(head.A)
        r, alpha = math.hypot(a, b), math.atan2(b, a)
        p, qq, c, d = conformal_parts(head.C)

        def g0(kk: np.ndarray) -> np.ndarray:  # e^{r cos(s - alpha)}, scaled by e^{-r}
            return ive(np.abs(kk), r) * np.exp(-1j * kk * alpha)

        # the convolution int G(phi - theta) rho(phi) dphi = sum_k G_hat(-k) c_k e^{i k theta}
        z_factor = g0(-k)
        sin_part = (g0(-k - 1) - g0(-k + 1)) / 2j
        cos_part = (g0(-k - 1) + g0(-k + 1)) / 2.0
        numerator = p * sin_part + qq * cos_part
        reflection = g0(-k - 1) if math.hypot(c, d) > 0 else None
        # c_k from the DFT: (2 pi / n) DFT_q e^{-i k theta_0} / sinc(k h / 2), theta_0 the
        # first centre; the targets are theta_0 + shift h + j h: e^{i k (theta_0 + shift h)}
        correction = (TWO_PI / n) * np.exp(1j * k * shift * h) / _sinc(0.5 * k * h)
        if n % 2 == 0:
            correction[n // 2] = 0.0  # the Nyquist mode is ambiguous for real data
        factors = (
            z_factor * correction,
            numerator * correction,
            None if reflection is None else reflection * correction,
            r,
            complex(d, c),
        )
        self._fixed[key] = (head, factors)
        return factors

    def _fft(self, rho, grid: Grid, head: Head, copies: int, shifts: list[float]):
        n = grid.cells[0]
        spectrum = np.fft.fft(rho)
        if self.atoms is not None and self.atoms.count:  # their exact modes join the cells'
            band, dft_f, mode_f = self._atom_factors(grid, head)
            # (in place on the band: the same sums as adding atom_spectrum, bit for bit)
            add_atom_spectrum(spectrum, grid, self.atoms, band, dft_f)
            # the measure's c_k, kept for atom_velocity at the same atoms and density
            modes = spectrum[:band] * mode_f
            self._atom_modes = (self.atoms, _fingerprint(rho), modes)
        bound = self._bound(head)
        out = []
        for shift in shifts:
            z_f, num_f, refl_f, r, refl_c = self._fft_coefficients(grid, head, copies, shift)
            numerator = np.fft.ifft(spectrum * num_f).real * n
            if refl_f is not None:
                theta = grid.lower[0] + (np.arange(n) + 0.5 + shift) * grid.spacing[0]
                conv = np.fft.ifft(spectrum * refl_f) * n
                numerator += (refl_c * np.exp(2j * theta) * conv).real
            if self.normalised:
                z = np.fft.ifft(spectrum * z_f).real * n
                with np.errstate(divide="ignore", invalid="ignore"):
                    u = np.where(z > 0.0, numerator / z, 0.0)
                np.clip(u, -bound, bound, out=u)
            else:
                u = numerator * math.exp(r)
            out.append(u)
        return out

    # ---- the Jacobi-Anger series (any A) --------------------------------------------------
    def _series(self, grid: Grid, head: Head, shift: float):
        """Per lattice: the Bessel table of the tilts ``A x`` and ``C^T t`` at the targets
        (:class:`~.engines.bessel.BesselSeries`), fixed while grid and head are."""
        key = ("bessel", grid, id(head), shift)
        cached = self._fixed.get(key)
        if cached is not None and cached[0] is head:
            return cached[1]
        targets = grid.lower[0] + (np.arange(grid.cells[0]) + 0.5 + shift) * grid.spacing[0]
        tilts = np.stack([np.cos(targets), np.sin(targets)], axis=1) @ head.A.T  # c = A x
        tangents = np.stack([-np.sin(targets), np.cos(targets)], axis=1)
        series = BesselSeries(
            np.hypot(tilts[:, 0], tilts[:, 1]), np.arctan2(tilts[:, 1], tilts[:, 0])
        )
        entry = (series, tangents @ head.C)  # <t, C y> = (C^T t) . y
        self._fixed[key] = (head, entry)
        return entry

    def _mode_factors(self, grid: Grid) -> np.ndarray:
        """``(2 pi / n) e^{-i m theta_0} / sinc(m h / 2)``, ``m = 0 .. n // 2 - 1``: the rfft
        of the cell averages to ``c_m`` (:func:`tpde.grid.circle.fourier_modes`)."""
        key = ("modes", grid)
        cached = self._fixed.get(key)
        if cached is None:
            delta = np.zeros(grid.cells[0])
            delta[0] = 1.0  # its rfft is 1 in every mode: fourier_modes gives the factors
            cached = fourier_modes(delta, grid)
            self._fixed[key] = cached
        return cached

    def _bessel(self, rho, grid: Grid, head: Head, shifts: list[float]):
        """theta' from the series sums ``e^{-r} Z`` and ``e^{-r} (M_1 + i M_2)``: the
        numerator ``(C^T t) . M``, over ``Z`` (normalised) or times ``e^{r}``."""
        if self._norms(head)[0] > 300.0:
            raise ValueError("attention.A: |A| > 300 overflows the sums on the circle")
        bound = self._bound(head)
        tables = [self._series(grid, head, shift) for shift in shifts]
        # the coefficients c_m the longest series reads (m <= K + 1), below Nyquist
        longest = max(series.order for series, _ in tables) + 2
        count = min(longest, grid.cells[0] // 2)
        positive = np.fft.rfft(rho)[:count] * self._mode_factors(grid)[:count]
        if self.atoms is not None and self.atoms.count:
            # the atoms' exact modes to the longest series' order: a narrow atom has them
            # beyond the grid's Nyquist mode
            # (docs/theory.md, 'Atoms under any head on the circle')
            summed = atom_modes_upto(self.atoms, longest)
            summed[:count] += positive
            positive = summed
            # the measure's c_m, kept for atom_velocity at the same atoms and density
            self._series_modes = (self.atoms, _fingerprint(rho), positive)
        out = []
        for series, weights in tables:
            z, moment = series.sums(positive)
            numerator = weights[:, 0] * moment.real + weights[:, 1] * moment.imag
            if self.normalised:
                with np.errstate(divide="ignore", invalid="ignore"):
                    u = np.where(z > 0.0, numerator / z, 0.0)
                np.clip(u, -bound, bound, out=u)
            else:
                u = numerator * np.exp(series.radius)
            out.append(u)
        return out

    # ---- the direct engine ----------------------------------------------------------------
    def _direct_matrices(self, grid: Grid, head: Head, shift: float):
        key = ("direct", grid, id(head), shift)
        cached = self._fixed.get(key)
        if cached is not None and cached[0] is head:
            return cached[1]
        h = grid.spacing[0]
        sources = grid.centres(0)
        targets = grid.lower[0] + (np.arange(grid.cells[0]) + 0.5 + shift) * h
        x = np.stack([np.cos(targets), np.sin(targets)], axis=1)
        y = np.stack([np.cos(sources), np.sin(sources)], axis=1)
        tangents = np.stack([-np.sin(targets), np.cos(targets)], axis=1)
        exponent = (x @ head.A.T) @ y.T  # <A x_i, y_j>
        shift_rows = exponent.max(axis=1, keepdims=True)
        kernel = np.exp(exponent - shift_rows)  # >= e^{-2 |A|}: no underflow for |A| < 350
        projected = (tangents @ head.C) @ y.T  # <t_i, C y_j>
        matrices = (kernel, kernel * projected, shift_rows[:, 0])
        self._fixed[key] = (head, matrices)
        return matrices

    def _direct(self, rho, grid: Grid, head: Head, shifts: list[float]):
        if self._norms(head)[0] > 300.0:
            raise ValueError("attention.A: |A| > 300 overflows the direct sums on the circle")
        weights = np.maximum(point_values(rho, grid), 0.0) * grid.spacing[0]
        bound = self._bound(head)
        out = []
        for shift in shifts:
            kernel, projected, row_shift = self._direct_matrices(grid, head, shift)
            numerator = projected @ weights
            if self.normalised:
                z = kernel @ weights
                with np.errstate(divide="ignore", invalid="ignore"):
                    u = np.where(z > 0.0, numerator / z, 0.0)
                np.clip(u, -bound, bound, out=u)
            else:
                u = numerator * np.exp(row_shift)
            out.append(u)
        return out

    def reset(self) -> None:
        """Nothing to forget: the cached kernels are fixed while grid and head are."""


def interaction_energy(density: np.ndarray, grid: Grid, beta: float) -> float:
    """``E = 1/(2 beta) iint e^{beta cos(phi - theta)} dmu dmu`` on the circle from the cell
    averages: ``1/(2 beta) sum_k I_k(beta) |c_k|^2`` with ``c_k = int rho e^{-i k theta}``
    (:func:`tpde.grid.circle.fourier_modes`; spectrally accurate, absolute accuracy
    ``1e-16 E``).
    """
    copies = circle_copies(grid)
    modes = fourier_modes(density, grid)
    k = copies * np.arange(modes.shape[-1])
    weights = np.where(k == 0, 1.0, 2.0) * ive(k, beta)  # +-k for k > 0
    total = np.sum(weights * np.abs(modes) ** 2) * math.exp(beta)
    return float(total / (2.0 * beta))
