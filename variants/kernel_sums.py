"""Every kernel-sum engine as a :class:`~.engines.protocol.KernelSums`: the adapters where an
engine's own call differs.

The dense and table engines of the flat grid (:class:`~.engines.direct.DirectSums`,
:class:`~.engines.separable.SeparableSums`) implement the protocol themselves. The others
answer other questions natively: the FFT convolutions and the sheared passes serve the
lattices of a grid, the circle's and the sphere's engines return sums scaled by ``e^{-|c|}``,
sigmoid sums its own kernel. Each adapter here takes the engine's own inputs (the measure as
the engine reads it), calls the engine's own code, and answers ``log Z(c)``, ``m(c)`` and the
engine's estimate in the protocol's units (docs/architecture.md, 'Kernel sums: one
interface, one vocabulary'). The variants keep calling the engines natively: the adapters
change no result.

:func:`engines_of` lists, per geometry, the adapter classes (tests/test_kernel_sums.py builds
each on a small case and checks it against the dense sums to its stated tolerance).

Shapes: tilts ``c (P, d)`` (``d = 2`` on the circle, 3 on the sphere); a lattice is one 1-D
array of coordinates per axis, its points in C order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import ive

from tpde.grid import Grid
from tpde.grid.threads import ensure_policy

from .cubed_sphere import CubedSphereAttention
from .engines.bessel import SERIES_TOLERANCE, BesselSeries
from .engines.direct import (
    DIRECT_TOLERANCE,
    DirectSums,
    density_sources,
    lattice_tilts,
    support_box,
)
from .engines.direct import log_partition as dense_log_partition
from .engines.direct import tilted_means as dense_means
from .engines.fft import FFTSoftmaxSums, checked_total
from .engines.policy import tilt_bounds
from .engines.protocol import KernelSums
from .engines.separable import TABLE_TOLERANCE, SeparableSums, resolved_sums
from .engines.sphere_harmonics import VELOCITY_TOLERANCE, HarmonicSums
from .sigmoid import NEGLIGIBLE_SHARE, sigmoid_lattice_sums, sigmoid_sums, significant_sources
from .spherical import is_conformal

__all__ = [
    "BesselSums",
    "CircleDirectSums",
    "CircleFFTSums",
    "FFTSums",
    "KernelSums",
    "ShearedSums",
    "SigmoidSums",
    "SphereDirectSums",
    "SphereHarmonicSums",
    "engines_of",
]

EPS = float(np.finfo(float).eps)
#: the FFT engines' stated accuracy inside their domain (a kernel whose dynamic range the
#: transforms hold: fft.py measures 1e-15 for symmetric A of scale <= 0.5 at 48^2); their
#: accuracy is absolute, of the largest term, so ``error()`` says where it is lost
FFT_TOLERANCE = 1e-12


class _Lattice:
    """The tilts of one lattice, which lattice-only engines compare every request with."""

    def __init__(self, coords: Sequence[np.ndarray], matrix: np.ndarray):
        self.coords = [np.asarray(x, float) for x in coords]
        self.matrix = np.asarray(matrix, float)
        self.tilts = lattice_tilts(self.coords, self.matrix)

    def check(self, c: np.ndarray, name: str) -> None:
        if not (np.shape(c) == self.tilts.shape and np.array_equal(c, self.tilts)):
            raise ValueError(
                f"{name} engine: serves the tilts of the lattice it was built for only"
            )


# ---- flat grids -------------------------------------------------------------------------------
class ShearedSums:
    """The separable tables taken to one lattice by the sheared passes (2-D, 3-D), sized a
    posteriori (:func:`~.engines.separable.resolved_sums`, as the policy's
    ``TABLE_ADAPTIVE``): one table of the means, one of ``log M``. ``weights`` (*grid.shape)
    >= 0; ``coords``: the lattice; ``matrix``: ``c = matrix x``."""

    name = "sheared"
    #: resolved_sums' tolerance: of the support's radius for the means, absolute for log M
    tolerance = TABLE_TOLERANCE

    def __init__(self, weights: np.ndarray, grid: Grid, coords, matrix: np.ndarray):
        if grid.ndim not in (2, 3):
            raise ValueError("sheared engine: the passes are 2-D or 3-D")
        self.lattice = _Lattice(coords, matrix)
        low, high = support_box(weights, grid)
        bounds, extent = tilt_bounds([self.lattice.coords], self.lattice.matrix), high - low
        scale = float(np.abs([low, high]).max())
        self.tables: dict[str, SeparableSums] = {}
        for fields, size in (("means", scale), ("log", 1.0)):
            sums, _ = resolved_sums(
                weights, grid, bounds, extent, size, self.lattice.matrix, [coords], None, fields
            )
            if sums is None:
                raise ValueError("sheared engine: the passes miss the tolerance under the cap")
            self.tables[fields] = sums
        self.scale = scale

    def log_partition(self, c: np.ndarray) -> np.ndarray:
        self.lattice.check(c, self.name)
        return self.tables["log"].on_lattice(self.lattice.coords, self.lattice.matrix)[:, 0]

    def means(self, c: np.ndarray) -> np.ndarray:
        self.lattice.check(c, self.name)
        return self.tables["means"].on_lattice(self.lattice.coords, self.lattice.matrix)

    def error(self) -> float:
        """The passes' own estimate (:meth:`~.engines.separable.TiltTable.pass_errors`),
        the means' relative to the support's radius."""
        worst = 0.0
        for fields, size in (("means", self.scale), ("log", 1.0)):
            errors = self.tables[fields].pass_errors([self.lattice.coords], self.lattice.matrix)
            if errors is None:
                return float("nan")
            worst = max(worst, float(np.max(errors)) / size)
        return worst


class FFTSums:
    """Softmax's convolutions (:class:`~.engines.fft.FFTSoftmaxSums`, symmetric ``A``) on the
    lattice ``grid.lattice(offset)``: the measure ``weights_s delta_{y_s}`` at the cell
    centres, the sums ``sum_s w_s e^{<A x, y_s>} (1, y_s)`` as the engine convolves them,
    times the factors it divides out (``e^{x^T A x / 2}`` and the shifts of its weight and
    kernel arrays)."""

    name = "fft"
    tolerance = FFT_TOLERANCE

    def __init__(self, weights: np.ndarray, grid: Grid, A: np.ndarray, offset: Sequence[float]):
        engine = FFTSoftmaxSums(A)
        d = grid.ndim
        self.lattice = _Lattice(grid.lattice(offset), engine.A)
        w = engine.weights(weights, grid)
        y = grid.mesh()
        convolved = engine.convolve(
            [w] + [w * y[b] for b in range(d)], grid, [(offset, [*range(d + 1)])]
        )[0]
        total = checked_total(convolved[0])
        self._means = np.stack(convolved[1:], axis=1) / total[:, None]
        # the engine's shifts: max over the mass of y^T A y / 2, and of the kernel's exponent
        points = np.stack(grid.mesh(sparse=False), axis=-1)
        quad = 0.5 * np.einsum("...i,ij,...j->...", points, engine.A, points)
        lags = []
        for a, (n, h) in enumerate(zip(grid.shape, grid.spacing, strict=True)):
            shift = -0.5 if float(offset[a]) == 0.5 else float(offset[a])
            lag = np.concatenate([np.arange(0, n + 1), np.arange(-(n - 1), 0)])
            lags.append((lag + shift) * h)
        z = np.stack(np.meshgrid(*lags, indexing="ij"), axis=-1)
        kernel_max = float((-0.5 * np.einsum("...i,ij,...j->...", z, engine.A, z)).max())
        x = np.stack([m.reshape(-1) for m in np.meshgrid(*self.lattice.coords, indexing="ij")], 1)
        own = 0.5 * np.einsum("pi,ij,pj->p", x, engine.A, x)
        self._log = np.log(total) + own + float(quad[weights > 0].max()) + kernel_max
        # an FFT returns each sum to about eps N of its largest term (fft.py): relative to Z
        largest = float(np.abs(w).sum())
        self._error = float(np.max(2.0 * EPS * grid.size * largest / total))

    def log_partition(self, c: np.ndarray) -> np.ndarray:
        self.lattice.check(c, self.name)
        return self._log.copy()

    def means(self, c: np.ndarray) -> np.ndarray:
        self.lattice.check(c, self.name)
        return self._means.copy()

    def error(self) -> float:
        """``2 eps N sum|w| / Z`` at worst: the transforms' round-off relative to the sums."""
        return self._error


class SigmoidSums:
    """Sigmoid's kernel ``sigma(c . y + bias)`` against ``weights`` on the cells
    (:mod:`.sigmoid`): ``engine = "direct"`` (:func:`~.sigmoid.sigmoid_sums`, any tilts) or
    ``"lattice"`` (:func:`~.sigmoid.sigmoid_lattice_sums`, the tilts of ``lattice = (coords,
    matrix)`` only; the cells of at most NEGLIGIBLE_SHARE of ``sum w |y|`` left out, as the
    field does). The partition is the engine's sum with the weights, the moments with the
    weights times ``y_a``."""

    tolerance = DIRECT_TOLERANCE

    def __init__(
        self,
        weights: np.ndarray,
        grid: Grid,
        bias: float = 0.0,
        engine: str = "direct",
        lattice: tuple[Sequence[np.ndarray], np.ndarray] | None = None,
    ):
        ensure_policy()
        self.name = engine
        self.bias = float(bias)
        sources, w = density_sources(weights, grid)
        self.lattice = None
        if engine == "lattice":
            if lattice is None:
                raise ValueError("lattice engine: give the lattice (coords, matrix) it serves")
            self.lattice = _Lattice(*lattice)
            # (the cells left out move a sum by NEGLIGIBLE_SHARE of its scale, far below)
            sources, w = significant_sources(sources, w, NEGLIGIBLE_SHARE)
        elif engine != "direct":
            raise ValueError(f"sigmoid: no engine {engine!r}")
        self.sources, self.weights = np.ascontiguousarray(sources), w

    def _sums(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = np.ascontiguousarray(c, float)
        d = self.sources.shape[1]
        if self.lattice is None:
            # the partition as one more moment: a source coordinate 1 that no tilt reaches
            ones = np.ones((self.sources.shape[0], 1))
            out = np.zeros((c.shape[0], d + 1))
            sigmoid_sums(
                np.hstack([c, np.zeros((c.shape[0], 1))]),
                self.bias,
                np.ascontiguousarray(np.hstack([self.sources, ones])),
                self.weights,
                out,
            )
            return out[:, d], out[:, :d]
        self.lattice.check(c, self.name)
        coords, matrix = self.lattice.coords, self.lattice.matrix
        shape = tuple(len(x) for x in coords)
        rows = (len(c) // shape[-1], shape[-1])
        step = matrix[:, -1] * (coords[-1][1] - coords[-1][0])
        starts = np.ascontiguousarray(c.reshape(rows + (d,))[:, 0])
        parts = []
        for w in [self.weights] + [self.weights * self.sources[:, a] for a in range(d)]:
            sums = np.empty(rows)
            sigmoid_lattice_sums(
                starts, step, rows[1], self.bias, self.sources, np.ascontiguousarray(w), sums
            )
            parts.append(sums.reshape(-1))
        return parts[0], np.stack(parts[1:], axis=1)

    def log_partition(self, c: np.ndarray) -> np.ndarray:
        return np.log(self._sums(c)[0])

    def means(self, c: np.ndarray) -> np.ndarray:
        total, moments = self._sums(c)
        return moments / total[:, None]

    def error(self) -> float:
        """0: both sums are exact to round-off (the lattice's recurrence within
        RECURRENCE_RANGE, which the field checks)."""
        return 0.0


# ---- the circle -------------------------------------------------------------------------------
def _on_circle(angles: np.ndarray) -> np.ndarray:
    return np.stack([np.cos(angles), np.sin(angles)], axis=1)


class CircleDirectSums:
    """The circle's dense sums (:class:`~.spherical.CircleAttention`'s ``"direct"``: point
    weights at the angles, every term positive), by the blocked row-shifted sums of
    :mod:`.engines.direct`: the measure ``weights_j delta_{(cos, sin)(angles_j)}``."""

    name = "direct"
    tolerance = DIRECT_TOLERANCE

    def __init__(self, angles: np.ndarray, weights: np.ndarray):
        keep = np.asarray(weights, float) > 0
        self.sources = _on_circle(np.asarray(angles, float)[keep])
        self.weights = np.asarray(weights, float)[keep]

    def log_partition(self, c: np.ndarray) -> np.ndarray:
        return dense_log_partition(c, self.sources, self.weights)

    def means(self, c: np.ndarray) -> np.ndarray:
        return dense_means(c, self.sources, self.weights)

    def error(self) -> float:
        return 0.0


class BesselSums:
    """The Jacobi-Anger series (:class:`~.engines.bessel.BesselSeries`, any tilts) of the
    measure ``weights_j delta_{(cos, sin)(angles_j)}``: its coefficients
    ``c_m = sum_j w_j e^{-i m angle_j}`` to the order the series reads. The series returns
    ``e^{-r} Z`` and ``e^{-r} (M_1 + i M_2)``: ``log Z = log(e^{-r} Z) + r``, ``m = M / Z``."""

    name = "bessel"
    #: the tail bound SERIES_TOLERANCE of the scale int |rho| I_0(r); on a case whose Z is
    #: within a few e of that scale, 1e-13 (error() is the bound relative to Z)
    tolerance = 1e-13

    def __init__(self, angles: np.ndarray, weights: np.ndarray):
        self.angles = np.asarray(angles, float)
        self.weights = np.asarray(weights, float)
        self._last = float("nan")

    def _sums(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        c = np.asarray(c, float)
        radius = np.hypot(c[:, 0], c[:, 1])
        series = BesselSeries(radius, np.arctan2(c[:, 1], c[:, 0]))
        m = np.arange(series.order + 2)
        positive = np.exp(-1j * np.outer(m, self.angles)) @ self.weights
        z, moment = series.sums(positive)
        scale = np.abs(self.weights).sum() * ive(0, radius)
        self._last = float(np.max(2.0 * SERIES_TOLERANCE * scale / z))
        return z, moment, radius

    def log_partition(self, c: np.ndarray) -> np.ndarray:
        z, _, radius = self._sums(c)
        return np.log(z) + radius

    def means(self, c: np.ndarray) -> np.ndarray:
        z, moment, _ = self._sums(c)
        return np.stack([moment.real, moment.imag], axis=1) / z[:, None]

    def error(self) -> float:
        """Twice the series' tail bound over ``Z`` at the worst target of the last call."""
        return self._last


class CircleFFTSums:
    """The circle's convolution (:class:`~.spherical.CircleAttention`'s ``"fft"`` for
    ``A = a I + b J``) of the measure ``weights_j delta`` at the cell centres of the periodic
    angle grid ``grid``, on the lattice of targets ``lower + (i + 1/2 + shift) h``. With the
    kernel ``g(s) = e^{r cos(s - alpha)}`` (coefficients ``I_|k|(r) e^{-i k alpha}``) and the
    measure's ``c_k``, ``Z(theta) = sum_k g_{-k} c_k e^{i k theta}`` and
    ``M(theta) = e^{i theta} sum_k g_{-k-1} c_k e^{i k theta}``, both one inverse FFT, as the
    engine forms them (its kernel factors; the Nyquist mode dropped)."""

    name = "fft"
    tolerance = FFT_TOLERANCE

    def __init__(self, weights: np.ndarray, grid: Grid, A: np.ndarray, shift: float = 0.0):
        if not is_conformal(A):
            raise ValueError("fft engine: the circle's convolution needs A = a I + b J")
        n, h = grid.cells[0], grid.spacing[0]
        theta = grid.lower[0] + (np.arange(n) + 0.5 + shift) * h
        x = _on_circle(theta)
        self.tilts = x @ np.asarray(A, float).T
        a, b = 0.5 * (A[0, 0] + A[1, 1]), 0.5 * (A[1, 0] - A[0, 1])
        r, alpha = math.hypot(a, b), math.atan2(b, a)
        k = np.fft.fftfreq(n, 1.0 / n).astype(int)

        def g0(kk: np.ndarray) -> np.ndarray:  # e^{-r} times the kernel's coefficients
            return ive(np.abs(kk), r) * np.exp(-1j * kk * alpha)

        phase = np.exp(1j * k * shift * h)
        if n % 2 == 0:
            phase[n // 2] = 0.0
        spectrum = np.fft.fft(np.asarray(weights, float))
        z = np.fft.ifft(spectrum * g0(-k) * phase).real * n
        moment = np.exp(1j * theta) * np.fft.ifft(spectrum * g0(-k - 1) * phase) * n
        total = checked_total(z)
        self._log = np.log(total) + r
        self._means = np.stack([moment.real, moment.imag], axis=1) / total[:, None]
        self._error = float(np.max(2.0 * EPS * n * np.abs(weights).sum() / total))

    def _check(self, c: np.ndarray) -> None:
        if not (np.shape(c) == self.tilts.shape and np.array_equal(c, self.tilts)):
            raise ValueError("fft engine: serves the tilts of the lattice it was built for only")

    def log_partition(self, c: np.ndarray) -> np.ndarray:
        self._check(c)
        return self._log.copy()

    def means(self, c: np.ndarray) -> np.ndarray:
        self._check(c)
        return self._means.copy()

    def error(self) -> float:
        """``2 eps n sum|w| / Z`` at worst (scaled sums): the transforms' round-off."""
        return self._error


# ---- the sphere -------------------------------------------------------------------------------
class _ShiftedSphereSums:
    """The sphere's engines return ``(Z, G, shift)`` per target, ``Z e^shift`` the sum of
    ``m_j e^{<c, y_j>}`` and ``G e^shift`` that of ``m_j y_j e^{<c, y_j>}``: the protocol's
    log-partition ``log Z + shift`` and tilted means ``G / Z``."""

    def _sums(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def log_partition(self, c: np.ndarray) -> np.ndarray:
        z, _, shift = self._sums(c)
        return np.log(z) + shift

    def means(self, c: np.ndarray) -> np.ndarray:
        z, g, _ = self._sums(c)
        return g / z[:, None]


class SphereHarmonicSums(_ShiftedSphereSums):
    """The sphere's harmonic sums (:class:`~.engines.sphere_harmonics.HarmonicSums`) of the
    measure ``masses_j delta_{sources_j}`` (``sources (S, 3)`` unit vectors): the engine built
    with ``A = I``, so its targets are the tilts themselves; ``log Z = log(e^{-r} Z) + r``,
    ``m = G / Z``. Targets whose estimate exceeds VELOCITY_TOLERANCE the engine sums densely."""

    name = "harmonic"
    tolerance = VELOCITY_TOLERANCE

    def __init__(self, sources: np.ndarray, masses: np.ndarray):
        self.sources = np.ascontiguousarray(sources, float)
        self.masses = np.ascontiguousarray(masses, float).reshape(-1)
        self.engine = HarmonicSums(np.eye(3))

    def _sums(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.engine.sums(self.sources, self.masses, np.ascontiguousarray(c, float))

    def error(self) -> float:
        """The engine's own estimate of the tilted means (``HarmonicSums.estimate``)."""
        estimate = self.engine.estimate
        return float(estimate.max()) if estimate.size else float("nan")


class SphereDirectSums(_ShiftedSphereSums):
    """The sphere's dense sums (:meth:`~.cubed_sphere.CubedSphereAttention._dense_sums`,
    engine ``"direct"``) of the measure ``masses_j delta_{sources_j}``, with ``A = I`` in the
    general form of the exponent (``<c, y> - |c|`` per row), so the targets are the tilts."""

    name = "direct"
    tolerance = DIRECT_TOLERANCE

    def __init__(self, sources: np.ndarray, masses: np.ndarray):
        self.sources = np.ascontiguousarray(sources, float)
        self.masses = np.ascontiguousarray(masses, float).reshape(-1)
        self.field = CubedSphereAttention(A=np.eye(3), engine="direct")
        self.field.beta = None  # (the general exponent: each row shifted by its own |c|)

    def _sums(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.field._dense_sums(self.sources, self.masses, np.ascontiguousarray(c, float))

    def error(self) -> float:
        return 0.0


def engines_of(geometry: str) -> tuple[type, ...]:
    """The classes that implement :class:`KernelSums` on ``geometry`` ("flat", "circle",
    "sphere"), the dense reference first."""
    return {
        "flat": (DirectSums, SeparableSums, ShearedSums, FFTSums, SigmoidSums),
        "circle": (CircleDirectSums, CircleFFTSums, BesselSums),
        "sphere": (SphereDirectSums, SphereHarmonicSums),
    }[geometry]
