"""Kernel sums on the sphere S^2 by spherical harmonics: the plane-wave expansion of
``e^{<c, y>}``, non-uniform transforms (ducc0's ``sht.experimental``).

docs/theory.md, 'Kernel sums by spherical harmonics'. For a discrete measure
``mu = sum_j m_j delta_{y_j}`` on the unit sphere (the Gauss nodes of the cells, weights times
reconstructed values) and tilts ``c = A x`` at targets ``x`` (``r = |c|``, ``c^ = c / r``),
the partition and its gradient

    Z(c) = sum_j m_j e^{<c, y_j>},   G(c) = grad_c Z = sum_j m_j y_j e^{<c, y_j>},

follow from the plane-wave expansion (Funk-Hecke for the zonal kernel
``e^{r <c^, y>}``, the addition theorem for ``P_l``)

    e^{<c, y>} = sum_l (2 l + 1) i_l(r) P_l(<c^, y>) = sum_l 4 pi i_l(r) sum_m Y_lm(c^) Y_lm*(y)

(``i_l`` the modified spherical Bessel functions, ``Y_lm`` orthonormal): with the
coefficients ``a_lm = sum_j m_j Y_lm*(y_j)`` (one non-uniform adjoint synthesis),

    e^{-r} Z   = sum_l 4 pi e^{-r} i_l(r) S_l(c^),              S_l = sum_m a_lm Y_lm,
    e^{-r} G   = c^ sum_l 4 pi e^{-r} i_l'(r) S_l(c^) + sum_l 4 pi e^{-r} (i_l(r) / r) grad S_l(c^),

the surface gradient from one spin-1 synthesis (``DERIV1``), the radial part (needed only for
``V != I``) from a spin-0 one. Every weight is scaled by ``e^{-r}`` (``scipy.special.ive``:
no overflow; the sums come out scaled as the dense engine's). For ``A = beta I`` every target
has ``r = beta``: one synthesis per part. For a general ``A`` the weights are expanded in
Chebyshev polynomials of ``r`` over the targets' range, ``w_l(r) = sum_k C_lk T_k(r)``: one
synthesis per term ``k`` and part, summed per target with ``T_k(r_x)``.

Truncation, checked a posteriori: ``|P_l| <= 1`` and ``sum_l (2 l + 1) e^{-r} i_l(r) = 1``,
so dropping the degrees above ``L`` changes the scaled sums by at most ``mass * tail_L(r)``,
``tail_L(r) = sum_{l > L} (2 l + 1)(1 + l / r) e^{-r} i_l(r)`` (the factor ``1 + l / r`` for
the gradient). ``L`` is the least degree whose tail is below ``TAIL_TOLERANCE`` times the
uniform measure's scaled partition ``e^{-r} i_0(r)`` at the largest ``r``: ``e^{-r} i_l(r)``
falls off like ``e^{-l^2 / (2 r)}``, so ``L`` grows like ``sqrt(2 r log(1 / tol))`` (22 at
``r = 4``, 52 at ``r = 32``, 154 at ``r = 300``). The Chebyshev terms are doubled until
their last two coefficients, bounded the same way, weigh below ``CHEBYSHEV_TOLERANCE`` of it
(or their own round-off). The transforms' own error (``NUFFT_EPSILON``) is relative to
the largest of the scaled sums (``NOISE``): the tilted mean ``G / Z`` at a target errs by at
most twice the sums' error over its ``e^{-r} Z`` (``estimate``, per target: 2.4e-12 where
``e^{-r} Z`` is at its largest; a bound, far from tight: tests/test_sphere_harmonics.py
measures 7.4e-13 at most, also where it allows 1e-8). Where that
estimate exceeds ``tolerance`` (``VELOCITY_TOLERANCE``: a target far from all the mass,
``e^{-r} Z`` below about 1e-4 of its largest value) or where the direction is undefined
(``r`` at zero, a pole of the transforms' ``(theta, phi)`` frame), the target is summed
densely. The flux ``rho v`` errs less still: a target's own neighbourhood bounds
``e^{-r} Z`` from below by its density. ``last`` records the degree, the Chebyshev terms, the
number of dense targets and the panel reduction's ``K`` (0: none) of the last call.

Fewer points for the coefficients: the cubed sphere's Gauss nodes (``9`` a cell, 221184 at 64
cells a panel) oversample degree ``L`` many times over, and the adjoint transform's cost is
their spreading. :class:`PanelReduction` moves each panel's masses onto ``K x K`` Chebyshev
points by the tensor Lagrange weights (two matrix products a panel), exact for every
degree-``L`` function but for a measured interpolation bound that joins the estimate; the
transform then runs on ``6 K^2`` points (38400 at ``L = 52``: 5.8 times fewer, the
coefficients' cost 10 ms to 3 ms on one thread). A nearly uniform density (the seeded modes
of the rate fits, noise) has its uniform part ``c w`` by the full transform of the weights,
once, and only the deviation ``m - c w`` reduced: the reduction's error is a smooth,
cube-symmetric pattern, and a fit of a slow mode seeded at 1e-6 over 200 steps feels it
(``beta = 4``, ``l = 8``: 2.9e-6 off the full transform's fit with the masses reduced whole,
8.6e-8 with the split; 1e-7 is what the transforms' accuracy 3e-13 to 1e-12 moves it).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numba as nb
import numpy as np

from tpde.grid import profile
from tpde.grid.cubed_sphere import CubedSphere, gauss_nodes, node_points, to_sphere
from tpde.grid.threads import ensure_policy

__all__ = [
    "MAX_DEGREE",
    "NUFFT_EPSILON",
    "VELOCITY_TOLERANCE",
    "TAIL_TOLERANCE",
    "HarmonicSums",
    "PanelReduction",
    "SphereHarmonicsError",
    "coefficients",
    "degree_for",
    "scaled_bessel",
    "scaled_energy",
]

#: the truncation's tail weight, relative to the uniform measure's scaled partition
TAIL_TOLERANCE = 1e-14
#: the accuracy asked of ducc0's non-uniform transforms (its floor in double is 2e-13)
NUFFT_EPSILON = 3e-13
#: the transforms' error bound in the scaled sums, relative to their largest value (measured
#: up to 1.2 NUFFT_EPSILON, tests/test_sphere_harmonics.py: the margin)
NOISE = 2 * NUFFT_EPSILON
#: a target whose tilted mean's estimated error exceeds this is summed densely (such a
#: target is far from all the mass: its own density is negligible, see the module docstring)
VELOCITY_TOLERANCE = 1e-8
#: the largest degree the engine uses (|A| <= 300, the attention's bound, needs 154)
MAX_DEGREE = 1024
#: the Chebyshev expansion's error bound, relative to the uniform measure's scaled partition
#: (its coefficients carry round-off near 1e-16 per unit mass: the tail's 1e-14 is out of reach)
CHEBYSHEV_TOLERANCE = 1e-13
#: the round-off of a Chebyshev coefficient, relative to its table's largest value
ROUNDOFF = 64 * float(np.finfo(float).eps)
#: the most Chebyshev terms in r (a general A whose |A x| spans a wide range)
MAX_TERMS = 256
#: targets this close (relative) to r = 0 or to the poles are summed densely
SINGULAR = 1e-9
#: the panel reduction's largest measured interpolation error of a single frequency along a
#: grid line (its round-off floor is near 5e-15; its bound for every degree-L function,
#: some 40 times more, joins the error estimate)
REDUCTION_TOLERANCE = 1e-14
#: the panel reduction splits off the uniform part (exact coefficients) when the deviation
#: from it weighs at most this fraction of the mass (a vMF mixture, 0.92: reduced whole;
#: noise of amplitude 0.3, 0.09: split, velocity gap to the dense sums 1.3e-13 to 6.0e-14)
UNIFORM_SPLIT = 0.25
#: the reduction is used when its points are at most this fraction of the Gauss nodes
REDUCTION_GAIN = 0.5


class SphereHarmonicsError(ValueError):
    """The harmonic engine cannot reach its tolerance within its limits (degree, terms)."""


def scaled_bessel(l_max: int, r: float | np.ndarray) -> np.ndarray:
    """``e^{-r} i_l(r)`` for ``l = 0 .. l_max`` at radii ``r > 0`` ``(..., l_max + 1)``:
    ``i_l(r) = sqrt(pi / (2 r)) I_{l + 1/2}(r)``, ``scipy.special.ive``."""
    from scipy.special import ive

    r = np.asarray(r, float)[..., None]
    l = np.arange(int(l_max) + 1, dtype=float)
    return ive(l + 0.5, r) * np.sqrt(0.5 * math.pi / r)


def _tail_weights(l_max: int, r: float) -> np.ndarray:
    """``(2 l + 1)(1 + l / r) e^{-r} i_l(r)``, ``l = 0 .. l_max``: the bound of degree ``l``'s
    part of the scaled sums and of their gradient, per unit mass."""
    l = np.arange(int(l_max) + 1)
    return (2 * l + 1) * (1 + l / r) * scaled_bessel(l_max, r)


def degree_for(r_max: float, tolerance: float = TAIL_TOLERANCE) -> int:
    """The least ``L`` with ``tail_L(r_max) <= tolerance e^{-r} i_0(r)`` (module docstring);
    raises :class:`SphereHarmonicsError` beyond :data:`MAX_DEGREE`."""
    r = max(float(r_max), SINGULAR)
    cap = int(2 * r + 20 * math.sqrt(r) + 60)  # far beyond the tail (ive underflows to 0)
    u = _tail_weights(cap, r)
    tail = np.cumsum(u[::-1])[::-1]  # tail[l] = sum_{l' >= l}
    below = np.flatnonzero(tail <= tolerance * u[0])
    if below.size == 0 or below[0] > MAX_DEGREE:
        raise SphereHarmonicsError(
            f"attention: the harmonic engine needs a degree above {MAX_DEGREE} for |A x| = "
            f'{r:.4g} (tail {tail[-1]:.1e}); use attention.engine = "direct"'
        )
    return max(int(below[0]) - 1, 1)


def _locations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(theta, phi)`` ``(M, 2)`` of unit vectors (``theta = atan2(rho, z)``: accurate near the
    poles), the frame ``e_theta``, ``e_phi`` ``(M, 3)`` and ``rho = sqrt(x^2 + y^2)``."""
    rho = np.hypot(x[:, 0], x[:, 1])
    theta = np.arctan2(rho, x[:, 2])
    phi = np.arctan2(x[:, 1], x[:, 0]) % (2 * math.pi)
    loc = np.ascontiguousarray(np.stack([theta, phi], 1))
    safe = np.where(rho > 0, rho, 1.0)
    cos_phi, sin_phi = x[:, 0] / safe, x[:, 1] / safe
    e_theta = np.stack([x[:, 2] * cos_phi, x[:, 2] * sin_phi, -rho], 1)
    e_phi = np.stack([-sin_phi, cos_phi, np.zeros_like(rho)], 1)
    return loc, np.stack([e_theta, e_phi]), rho


def _chebyshev(values: np.ndarray) -> np.ndarray:
    """Chebyshev coefficients ``(..., K)`` of the values ``(..., K)`` at the first-kind nodes
    ``t_k = cos(pi (k + 1/2) / K)``."""
    K = values.shape[-1]
    k = np.arange(K)
    cosines = np.cos(np.pi * np.outer(k, k + 0.5) / K)  # (j, k)
    coefficients = (2.0 / K) * values @ cosines.T
    coefficients[..., 0] *= 0.5
    return coefficients


@dataclass
class _Plan:
    """What is fixed for one set of targets: the directions and radii of the tilts, the
    degree, the Chebyshev weights per part ``(L + 1, K)`` and basis ``(M, K)``, the targets
    summed densely."""

    points: np.ndarray
    loc: np.ndarray
    frame: np.ndarray  # (2, M, 3): e_theta, e_phi at c^
    directions: np.ndarray  # (M, 3)
    shift: np.ndarray  # (M,): r = |A x|
    degree: int
    weights: dict[str, np.ndarray]  # "z", "tangent", "radial": (K, nalm) per-alm weights
    basis: np.ndarray  # (M, K)
    dense: np.ndarray  # (M,) bool: singular targets
    lines: LineSynthesis | None = None  # the targets on the axis frames' meridians


class _LastCoefficients:
    """The last ``a_lm`` of a measure (degree, sources, masses) and the interpolation bound
    they carry (0: the full transform, else :meth:`PanelReduction.coefficients`'s, per unit
    of the kernel's largest value): a second engine
    summing the same measure at other targets in the same stage (the atoms' probes) reuses
    them; the masses are compared whole and the sources whole unless both are the same
    read-only array (:func:`_same_frozen`), so a changed measure is never served stale
    coefficients."""

    def __init__(self) -> None:
        self._key: tuple[int, np.ndarray, np.ndarray] | None = None
        self._value: tuple[np.ndarray, float] | None = None

    def get(
        self, degree: int, sources: np.ndarray, masses: np.ndarray
    ) -> tuple[np.ndarray, float] | None:
        key = self._key
        if (
            key is None
            or key[0] != degree
            or key[1].shape != sources.shape
            or key[2].shape != masses.shape
            or _differ_at_a_sample(key[2], masses)
            or not np.array_equal(key[2], masses)
            or not _same_array(key[1], sources)
        ):
            return None
        return self._value

    def put(self, degree: int, sources, masses, alm: np.ndarray, error: float) -> None:
        kept = sources if _frozen(sources) else np.array(sources, float)
        self._key = (degree, kept, np.array(masses, float))
        self._value = (alm, float(error))


def _differ_at_a_sample(a: np.ndarray, b: np.ndarray) -> bool:
    """True when arrays of one shape and one layout differ at one element in 997 (a new
    stage's masses differ everywhere: this spares the whole comparison)."""
    if a.strides != b.strides:
        return False
    return not np.array_equal(a.ravel(order="K")[::997], b.ravel(order="K")[::997])


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _frozen(a: np.ndarray) -> bool:
    """True when ``a`` and the array that owns its memory are read-only (nothing can change
    it: the cached node geometry of :func:`tpde.grid.cubed_sphere.point_values`)."""
    return isinstance(a, np.ndarray) and not a.flags.writeable and not _root(a).flags.writeable


def _same_array(kept: np.ndarray, a: np.ndarray) -> bool:
    """``kept`` and ``a`` hold the same numbers: the same read-only memory and layout (no
    comparison of the elements), else compared whole."""
    if (
        _frozen(kept)
        and _frozen(a)
        and kept.shape == a.shape
        and kept.strides == a.strides
        and kept.dtype == a.dtype
        and kept.__array_interface__["data"][0] == a.__array_interface__["data"][0]
    ):
        return True
    return bool(np.array_equal(kept, a))


_ALM = _LastCoefficients()


@nb.njit(cache=True)
def _frame_sum(surface, frame, out):  # pragma: no cover - compiled
    """``out[i] = surface[0, i] frame[0, i] + surface[1, i] frame[1, i]`` ``(M, 3)``: the
    surface gradient from its ``(theta, phi)`` components (numpy's broadcast product with a
    last axis of 3 is slow; the same operations)."""
    for i in range(out.shape[0]):
        for k in range(3):
            out[i, k] = surface[0, i] * frame[0, i, k] + surface[1, i] * frame[1, i, k]


def _lagrange(nodes: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``(len(x), K)``: the Lagrange basis of the first-kind Chebyshev points ``nodes``
    (ascending, ``K`` of them) at ``x`` (barycentric form, weights
    ``(-1)^k sin((2 k + 1) pi / (2 K))``, up to a common sign)."""
    K = nodes.size
    k = np.arange(K)
    barycentric = (-1.0) ** k * np.sin((2 * k + 1) * np.pi / (2 * K))
    gap = x[:, None] - nodes[None, :]
    hit = gap == 0.0
    gap[hit] = 1.0
    q = barycentric[None, :] / gap
    out = q / q.sum(axis=1, keepdims=True)
    rows, columns = np.nonzero(hit)
    out[rows] = 0.0
    out[rows, columns] = 1.0
    return out


@dataclass(frozen=True)
class PanelReduction:
    """The Gauss nodes of a cubed sphere (``nodes x nodes`` a cell, ``n`` cells a panel edge:
    a tensor grid of ``n nodes`` angles per panel axis) traded for ``K x K`` Chebyshev points
    a panel, exactly for the coefficients up to degree ``L`` but for ``error``.

    On panel ``p`` a node is ``x(a_i, b_j)`` and every degree-``L`` function ``f`` (the
    truncated kernel ``y -> sum_l (2 l + 1) e^{-r} i_l(r) P_l(<c^, y>)`` among them) is the
    tensor interpolant through the Chebyshev points ``t_k`` of ``[-pi/4, pi/4]`` but for the
    interpolation error, so

        sum_ij m_ij f(x(a_i, b_j)) = sum_kl M_kl f(x(t_k, t_l)),   M = Lg^T m Lg,

    ``Lg[i, k] = l_k(a_i)`` the Lagrange basis at the nodes: the adjoint transform runs on
    ``6 K^2`` points instead of ``6 (n nodes)^2``. Every grid line of a panel is a great
    circle on which ``f`` is a trigonometric polynomial of degree ``L`` in the arc angle
    ``psi = atan(tan a cos b)`` (``|d psi / d a| <= 1``), so the error is at most
    ``(1 + Lambda) sqrt(2 L + 1) max_k eps_k`` times ``max |f|``: ``eps_k`` the measured
    interpolation error of ``e^{i k psi}`` at the nodes (``k <= L``, lines ``b = 0, pi/8,
    pi/4``), ``Lambda`` the largest ``sum_k |l_k(a_i)|``. ``K`` is the least multiple of 4
    from ``pi L / 4`` on whose ``max_k eps_k`` is below :data:`REDUCTION_TOLERANCE` (48 at
    ``L = 22``, 80 at ``L = 52``: bounds 1.2e-13, 4.2e-13; the bound is far from tight: at
    ``K = 72`` the coefficients already agree with the full transform to 2e-14 of their
    largest)."""

    n: int
    nodes: int
    degree: int
    terms: int  # K
    lagrange: np.ndarray  # (n nodes, K), rows (i, g) as the node angles a_i + h s_g
    points: np.ndarray  # (6 K^2, 3), order (p, k, l)
    loc: np.ndarray  # (6 K^2, 2)
    error: float  # the interpolation bound relative to max |f|
    _uniform: dict = field(default_factory=dict, compare=False, repr=False)
    _laid_out: dict = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    @functools.lru_cache(maxsize=8)
    def build(n: int, nodes: int, degree: int) -> PanelReduction | None:
        """The reduction of ``n`` cells a panel, ``nodes`` Gauss nodes a cell axis, for degree
        ``degree``; None when it would keep more than :data:`REDUCTION_GAIN` of the nodes
        (small grids: the full transform is as cheap)."""
        grid = CubedSphere(int(n))
        s, _ = gauss_nodes(int(nodes))
        angles = (grid.centres[:, None] + grid.h * s[None, :]).reshape(-1)  # (n g,)
        size = angles.size
        k = np.arange(int(degree) + 1)
        K = 4 * math.ceil(math.pi * degree / 16)
        while 6 * K * K <= REDUCTION_GAIN * 6 * size * size:
            t = -np.cos(np.pi * (np.arange(K) + 0.5) / K) * (0.25 * math.pi)
            basis = _lagrange(t, angles)
            lebesgue = float(np.abs(basis).sum(axis=1).max())
            worst = 0.0
            for b in (0.0, 0.125 * math.pi, 0.25 * math.pi):
                psi_nodes = np.arctan(np.tan(angles) * math.cos(b))
                psi_points = np.arctan(np.tan(t) * math.cos(b))
                exact = np.exp(1j * np.outer(psi_nodes, k))
                interpolated = basis @ np.exp(1j * np.outer(psi_points, k))
                worst = max(worst, float(np.abs(interpolated - exact).max()))
            if worst <= REDUCTION_TOLERANCE:
                error = (1.0 + lebesgue) * math.sqrt(2 * degree + 1) * worst
                points = to_sphere(np.arange(6)[:, None, None], t[None, :, None], t[None, None, :])
                points = np.ascontiguousarray(points.reshape(-1, 3))
                reduction = PanelReduction(
                    int(n),
                    int(nodes),
                    int(degree),
                    K,
                    basis,
                    points,
                    _locations(points)[0],
                    error,
                )
                for array in (basis, points, reduction.loc):
                    array.flags.writeable = False
                return reduction
            K += 4
        return None

    def coefficients(self, masses: np.ndarray, **common) -> tuple[np.ndarray, float]:
        """``a_lm`` of the node measure and the bound of their interpolation error (to be
        multiplied by the kernel's largest value): the node weights' own coefficients, by the
        full transform once (:meth:`uniform`), times ``c = sum m / sum w``, plus the reduced
        transform of the deviation ``m - c w`` alone (a nearly uniform density keeps the full
        transform's accuracy: the reduction's error scales with ``sum |m - c w|``); where
        ``sum |m - c w|`` exceeds :data:`UNIFORM_SPLIT` of ``sum m`` the masses are reduced
        whole (the base's own transform noise, ``NOISE sum m``, would outweigh the gain)."""
        from ducc0.sht.experimental import adjoint_synthesis_general

        base, weights = self.uniform(common["lmax"], common["epsilon"], common["nthreads"])
        m = np.asarray(masses, float).reshape(6, self.n, self.n, self.nodes, self.nodes)
        total = float(np.sum(m))
        c = total / (6.0 * float(np.sum(weights)))
        # the weights laid out as the masses (kept): the passes below run contiguous
        laid = self._laid_out.get(m.strides)
        if laid is None:
            laid = np.empty_like(m)
            laid[...] = weights
            self._laid_out[m.strides] = laid
        deviation = np.multiply(laid, -c, out=np.empty_like(m))
        deviation += m
        spread = float(np.sum(np.abs(deviation)))
        if spread > UNIFORM_SPLIT * total:  # far from uniform: the base would add its noise
            alm = adjoint_synthesis_general(
                map=self.masses(m)[None, :], spin=0, loc=self.loc, **common
            )[0]
            return alm, self.error * total
        alm = adjoint_synthesis_general(
            map=self.masses(deviation)[None, :], spin=0, loc=self.loc, **common
        )[0]
        alm += c * base
        return alm, self.error * spread

    def uniform(self, degree: int, epsilon: float, threads: int) -> tuple[np.ndarray, np.ndarray]:
        """The coefficients of the node weights ``J w h^2`` (the uniform density 1) by the
        full transform of the Gauss nodes, kept, and the weights ``(n, n, g, g)``."""
        key = (int(degree), float(epsilon))
        points, weights = node_points(CubedSphere(self.n), self.nodes)
        if key not in self._uniform:
            full = np.broadcast_to(weights, points.shape[:-1])
            self._uniform[key] = coefficients(
                points.reshape(-1, 3), np.ascontiguousarray(full).reshape(-1), degree, epsilon
            )
        return self._uniform[key], weights

    def masses(self, masses: np.ndarray) -> np.ndarray:
        """``M = Lg^T m Lg`` per panel ``(6 K^2,)`` of the node masses ``(6 n^2 g^2,)`` or
        ``(6, n, n, g, g)`` in :func:`tpde.grid.cubed_sphere.point_values`' order
        ``(p, i, j, g, h)``, any memory layout (its own, ``(p, g, i, h, j)``, is read without
        a copy: the node angles are then taken in the order ``(g, i)``)."""
        n, g = self.n, self.nodes
        m = np.asarray(masses, float).reshape(6, n, n, g, g).transpose(0, 3, 1, 4, 2)
        m = m.reshape(6, g * n, g * n)  # rows (g, i), columns (h, j)
        basis = self._by_node
        return np.matmul(np.matmul(basis.T, m), basis).reshape(-1)

    @functools.cached_property
    def _by_node(self) -> np.ndarray:
        """The Lagrange rows in the order ``(g, i)`` ``(g n, K)``."""
        n, g, K = self.n, self.nodes, self.terms
        return np.ascontiguousarray(self.lagrange.reshape(n, g, K).transpose(1, 0, 2)).reshape(
            g * n, K
        )


#: the cube's axes as the poles of three frames: ``x' = R x`` with ``x'_z`` along the axis,
#: and the Euler angles ``(psi, theta, phi)`` of ducc0's ``rotate_alm`` that carry the
#: coefficients of ``f`` to those of ``x' -> f(R^T x')`` (None: the identity)
_AXIS_FRAMES: tuple[tuple[np.ndarray, tuple[float, float, float] | None], ...] = (
    (np.eye(3), None),
    (
        np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]),
        (math.pi, 0.5 * math.pi, 0.5 * math.pi),
    ),
    (
        np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]),
        (0.5 * math.pi, 0.5 * math.pi, 0.0),
    ),
)
#: a line's points are on one meridian of a frame when their longitudes agree to this, and
#: lines share one colatitude table when their sorted colatitudes agree to this (radians: a
#: few units in the last place; the values move by at most the degree times as much)
LINE_ANGLES = 1e-14
#: a line's frame keeps its pole this far from the line's points (``|<x, pole>| <= ``): the
#: frame's ``1 / sin(theta)`` stays below 3.2
LINE_POLE = 0.95


@nb.njit(cache=True)
def _line_gradients(
    values, row, reverse, cos_t, sin_t, cos_p, sin_p, frame, line_frame, scale, z, g
):  # pragma: no cover - compiled
    """``z`` ``(M,)`` and the Cartesian surface gradient ``g`` ``(M, 3)`` (times ``scale``) at
    the lines' points ``(line i, point j)``, ``M = lines x n``, from ``values (rows, 3, n)``
    (value, ``d theta``, ``d phi`` at ascending colatitudes of the line's row ``row[i]``,
    ``reverse[i]``: the line's points run the other way) in the frame ``x' = R x`` of the
    line (``frame (3, 3, 3)``, ``line_frame (lines,)``): ``g = R^T (d_theta e_theta +
    d_phi / sin(theta) e_phi)``."""
    lines, n = cos_t.shape
    for i in range(lines):
        r = row[i]
        R = frame[line_frame[i]]
        cp, sp = cos_p[i], sin_p[i]
        for j in range(n):
            jj = n - 1 - j if reverse[i] else j
            ct, st = cos_t[i, j], sin_t[i, j]
            k = i * n + j
            z[k] = values[r, 0, jj]
            d_theta = values[r, 1, jj] * scale
            d_phi = values[r, 2, jj] * scale / st
            # e_theta = (ct cp, ct sp, -st), e_phi = (-sp, cp, 0) in the line's frame
            u0 = d_theta * ct * cp - d_phi * sp
            u1 = d_theta * ct * sp + d_phi * cp
            u2 = -d_theta * st
            for c in range(3):
                g[k, c] = R[0, c] * u0 + R[1, c] * u1 + R[2, c] * u2


class LineSynthesis:
    """A degree-``L`` function and its surface gradient, exact to round-off, at targets that
    lie on meridians of the cube's three axis frames, ``n`` consecutive targets a line (the
    face centres of :class:`tpde.schemes.cubed_sphere.CubedSphereOperator`: every grid line
    of a panel is a great circle through the centres of two opposite panels).

    In a frame whose pole is a cube axis, ``f(theta, phi) = sum_{k, m} C_km e^{i k theta}
    e^{i m phi}`` on the doubled torus (``theta in [0, 2 pi)``, ``f(2 pi - theta, phi + pi) =
    f(theta, phi)``): ``C`` from the rotated coefficients (ducc0's ``rotate_alm``, exact) by
    one synthesis on a ``(L + 2) x (2 L + 2)`` Fejer grid (``synthesis_2d``) and two FFTs. On a
    meridian ``phi = phi_0`` the function is the trigonometric polynomial ``sum_k (A_k cos k
    theta + B_k sin k theta)``, its coefficients one matrix product for all the frame's lines
    (and ``d phi`` from the same with ``m``); ``d theta`` is ``k`` times them, and the values at
    the line's colatitudes are one matrix product per table of colatitudes (lines related by
    the cube's symmetry share one; a table symmetric about the equator splits into its even
    and odd parts, half the work each). No non-uniform transform: no ``epsilon``."""

    def __init__(self, points: np.ndarray, n: int, degree: int):
        L = self.degree = int(degree)
        lines = np.asarray(points, float).reshape(-1, n, 3)
        count = lines.shape[0]
        line_frame = np.empty(count, np.int64)
        phi = np.empty(count)
        theta = np.empty((count, n))
        for i in range(count):
            normal = np.cross(lines[i, 0], lines[i, -1])
            normal /= np.linalg.norm(normal)
            k = next(
                (
                    f
                    for f, (R, _) in enumerate(_AXIS_FRAMES)
                    if abs(normal @ R[2]) < LINE_ANGLES
                    and np.abs(lines[i] @ R[2]).max() <= LINE_POLE
                ),
                -1,
            )
            if k < 0:
                raise ValueError("the targets are not on meridians of the cube's axis frames")
            x = lines[i] @ _AXIS_FRAMES[k][0].T
            longitude = np.arctan2(x[:, 1], x[:, 0])
            longitude = longitude[0] + np.angle(np.exp(1j * (longitude - longitude[0])))
            if np.ptp(longitude) > LINE_ANGLES:
                raise ValueError("a line of targets is not on one meridian")
            line_frame[i], phi[i] = k, float(np.mean(longitude))
            theta[i] = np.arctan2(np.hypot(x[:, 0], x[:, 1]), x[:, 2])
        steps = np.diff(theta, axis=1)
        reverse = np.all(steps < 0, axis=1)
        if not np.all(reverse | np.all(steps > 0, axis=1)):
            raise ValueError("the targets of a line are not monotonic in colatitude")
        ordered = np.where(reverse[:, None], theta[:, ::-1], theta)
        # lines sharing one colatitude table (the cube's symmetry), ordered table by table
        tables: list[np.ndarray] = []
        table = np.empty(count, np.int64)
        for i in np.lexsort(ordered.T[::-1]):
            if not tables or np.abs(ordered[i] - tables[-1]).max() > LINE_ANGLES:
                tables.append(ordered[i])
            table[i] = len(tables) - 1
        order = np.argsort(table, kind="stable")
        bounds = np.searchsorted(table[order], np.arange(len(tables) + 1))
        self.slices = [slice(int(bounds[s]), int(bounds[s + 1])) for s in range(len(tables))]
        row = np.empty(count, np.int64)
        row[order] = np.arange(count)
        self.row, self.reverse, self.line_frame = row, reverse, line_frame
        self.cos_t, self.sin_t = np.cos(theta), np.sin(theta)
        self.cos_p, self.sin_p = np.cos(phi), np.sin(phi)
        self.frames = np.stack([R for R, _ in _AXIS_FRAMES])
        self.n = n
        # the rows of the line coefficients: [cos k theta, k = 0..L; sin k theta, k = 0..L],
        # reordered as the even part (cos even k, sin odd k) then the odd part
        waves_up = np.arange(L + 1)
        cos_rows, sin_rows = waves_up, L + 1 + waves_up
        even = np.concatenate([cos_rows[waves_up % 2 == 0], sin_rows[waves_up % 2 == 1]])
        odd = np.concatenate([cos_rows[waves_up % 2 == 1], sin_rows[waves_up % 2 == 0]])
        self.split = even.size
        permutation = np.concatenate([even, odd])
        # d theta of (A_k cos + B_k sin) is (k B_k) cos - (k A_k) sin: as a signed row map
        source = np.concatenate([sin_rows, cos_rows])[permutation]
        sign = np.concatenate([waves_up, -waves_up]).astype(float)[permutation]
        position = np.empty(2 * (L + 1), np.int64)
        position[permutation] = np.arange(2 * (L + 1))
        self.derivative_source, self.derivative_scale = position[source], sign
        # the tables' half colatitudes (symmetric about the equator) and their basis
        self.half = (n + 1) // 2
        self.bases = []
        for values in tables:
            mirrored = math.pi - values[::-1]
            if np.abs(mirrored - values).max() > LINE_ANGLES:
                raise ValueError("a colatitude table is not symmetric about the equator")
            t = values[: self.half]
            basis = np.concatenate(
                [np.cos(np.outer(t, waves_up)), np.sin(np.outer(t, waves_up))], axis=1
            )
            basis = basis[:, permutation]
            self.bases.append(
                (
                    np.ascontiguousarray(basis[:, : self.split].T),
                    np.ascontiguousarray(basis[:, self.split :].T),
                )
            )
        # per frame: its lines at longitudes phi_0 + 2 pi j / N (the grid lines of the panels
        # around the frame's axis: N = 4 n, uniform); each line (table order) as f N + j
        self.start = np.zeros(len(_AXIS_FRAMES))
        slots = 4 * n
        flat = np.empty(count, np.int64)
        for f in range(len(_AXIS_FRAMES)):
            members = np.flatnonzero(line_frame[order] == f)
            longitudes = phi[order][members]
            self.start[f] = float(longitudes[0])
            j = ((longitudes - self.start[f]) / (2 * math.pi)) % 1.0 * slots
            near = np.round(j)
            if np.abs(j - near).max() > 1e-9:
                raise ValueError("the lines of a frame are not at longitudes 2 pi j / (4 n)")
            flat[members] = f * slots + near.astype(np.int64) % slots
        self.slots, self.flat = slots, flat
        # m onto the real inverse FFT's 0..N/2: r = m mod N, r > N/2 as conj at N - r; the
        # weights of irfft (1 at 0 and N/2, 2 between) undone
        r = np.arange(L + 1) % slots
        upper = r > slots // 2
        self.fold = np.where(upper, slots - r, r)
        self.fold_conj = upper
        inner = (self.fold > 0) & (2 * self.fold != slots)
        self.fold_factor = np.where(inner, 0.5, 1.0)
        self.unfolded = bool(np.unique(self.fold).size == L + 1 and not np.any(upper))
        self.rings, self.ring_points = L + 2, 2 * L + 2
        torus = 2 * self.rings
        waves = np.arange(-L, L + 1)
        self.waves = np.concatenate([np.arange(torus - L, torus), np.arange(L + 1)])
        m = np.arange(L + 1)
        self.parity = (-1.0) ** m
        # the F1 rings at theta = pi (t + 1/2) / rings: the FFT's half-sample shift; the
        # FFTs' 1 / (torus rings points); m > 0 stands for m and -m (f = Re sum_{k, m >= 0});
        # the longitudes from phi_0: (frames, 2 L + 1, L + 1)
        phases = np.exp(-1j * math.pi * waves / torus)[:, None] / (torus * self.ring_points)
        phases = phases * np.where(m > 0, 2.0, 1.0)[None, :]
        self.phases = phases[None] * np.exp(1j * np.outer(self.start, m))[:, None, :]
        self.permutation = permutation

    @staticmethod
    def build(points: np.ndarray, degree: int) -> LineSynthesis | None:
        """The synthesis of ``points (M, 3)`` when they are lines of ``n`` targets
        (``M = 12 n (n + 1)``, the face centres' layout) on the frames' meridians; else None."""
        M = points.shape[0]
        n = int(round((math.sqrt(1 + M / 3) - 1) / 2))
        if n < 2 or 12 * n * (n + 1) != M:
            return None
        try:
            return LineSynthesis(points, n, degree)
        except ValueError:
            return None

    def _coefficients(self, alm: np.ndarray, threads: int) -> np.ndarray:
        """The line coefficients ``(lines, 2, 2 (L + 1))`` (value, ``d phi``; rows permuted:
        even part, odd part), lines in table order: per frame, ``G_k(phi_j) = sum_m C_km
        e^{i m phi_j}`` at the ``N`` equispaced longitudes by one FFT over ``m`` (folded mod
        ``N``: exact at those longitudes), then ``A_k = Re (G_k + G_-k)``, ``B_k = Im (G_-k -
        G_k)``, ``f = sum_k A_k cos k theta + B_k sin k theta`` on the meridian."""
        from ducc0.sht import rotate_alm, synthesis_2d

        L, N = self.degree, self.slots
        frames = len(_AXIS_FRAMES)
        rings = np.empty((frames, self.rings, self.ring_points))
        for f, (_, angles) in enumerate(_AXIS_FRAMES):
            b = alm if angles is None else rotate_alm(alm, L, *angles, nthreads=threads)
            synthesis_2d(
                alm=b[None, :],
                spin=0,
                lmax=L,
                geometry="F1",
                ntheta=self.rings,
                nphi=self.ring_points,
                nthreads=threads,
                map=rings[f : f + 1],
            )
        F = np.fft.rfft(rings, axis=2)[:, :, : L + 1]  # (frames, rings, m = 0..L)
        torus = np.concatenate([F, (F * self.parity)[:, ::-1]], axis=1)
        C = np.fft.fft(torus, axis=1)[:, self.waves]  # (frames, k = -L..L, m)
        C *= self.phases  # the F1 rings' half offset, the FFTs' scales, m and -m, phi_0
        # the meridian's cos k theta (C_k + C_-k) and sin k theta (i (C_k - C_-k)) rows,
        # permuted, each Re sum_m D_m e^{i m phi}: value and d phi (times i m)
        D = np.empty((frames, 2, 2 * (L + 1), L + 1), complex)
        positive, negative = C[:, L:], C[:, L::-1]  # k = 0..L, -k = 0..-L
        rows = np.concatenate([positive + negative, 1j * (positive - negative)], axis=1)
        rows[:, 0] = C[:, L]  # k = 0 once
        rows[:, L + 1] = 0.0
        D[:, 0] = rows[:, self.permutation]
        D[:, 1] = D[:, 0] * (1j * np.arange(L + 1))
        # Re sum_m D_m e^{2 pi i m j / N} by one real inverse FFT (m folded onto 0..N/2)
        Y = np.zeros((frames, 2, 2 * (L + 1), N // 2 + 1), complex)
        if self.unfolded:
            Y[..., self.fold] = D * self.fold_factor
        else:
            for mm in range(L + 1):
                value = D[..., mm] * self.fold_factor[mm]
                Y[..., self.fold[mm]] += np.conj(value) if self.fold_conj[mm] else value
        X = np.fft.irfft(Y, n=N, axis=3, norm="forward")  # (frames, 2, rows, N)
        X = X.transpose(0, 3, 1, 2).reshape(frames * N, 2, 2 * (L + 1))
        return X[self.flat]

    def evaluate(
        self, alm: np.ndarray, scale: float, threads: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """``f`` ``(M,)`` and ``scale`` times its Cartesian surface gradient ``(M, 3)`` at the
        targets, ``alm`` the coefficients of ``f`` (ducc0's order)."""
        coefficients = self._coefficients(np.ascontiguousarray(alm), threads)
        lines, n, h, split = self.row.size, self.n, self.half, self.split
        # (lines, 3, rows): value, d theta, d phi; the even rows and the odd rows apart
        # (contiguous: one matrix product per table)
        even_rhs = np.empty((lines, 3, split))
        odd_rhs = np.empty((lines, 3, coefficients.shape[2] - split))
        for part, rows in ((even_rhs, slice(None, split)), (odd_rhs, slice(split, None))):
            part[:, 0] = coefficients[:, 0, rows]
            part[:, 1] = (
                coefficients[:, 0, self.derivative_source[rows]] * self.derivative_scale[rows]
            )
            part[:, 2] = coefficients[:, 1, rows]
        even_flat = even_rhs.reshape(lines * 3, -1)
        odd_flat = odd_rhs.reshape(lines * 3, -1)
        values = np.empty((lines, 3, n))
        low = n - h  # the mirrored colatitudes pi - t_j, j < n - h, descending
        for s, (even, odd) in zip(self.slices, self.bases, strict=True):
            rows = slice(3 * s.start, 3 * s.stop)
            e = (even_flat[rows] @ even).reshape(-1, 3, h)
            o = (odd_flat[rows] @ odd).reshape(-1, 3, h)
            values[s, :, :h] = e + o
            values[s, :, h:] = (e[:, :, :low] - o[:, :, :low])[:, :, ::-1]
        z = np.empty(lines * n)
        g = np.empty((lines * n, 3))
        _line_gradients(
            values,
            self.row,
            self.reverse,
            self.cos_t,
            self.sin_t,
            self.cos_p,
            self.sin_p,
            self.frames,
            self.line_frame,
            float(scale),
            z,
            g,
        )
        return z, g


class HarmonicSums:
    """The scaled partition ``e^{-r} Z`` and gradient ``e^{-r} G`` at tilts ``c = A x`` of a
    discrete measure on the unit sphere, by spherical harmonics (module docstring)."""

    def __init__(self, A: np.ndarray, tolerance: float = VELOCITY_TOLERANCE):
        self.A = np.asarray(A, float)
        #: the largest estimated error of a tilted mean the transforms may leave
        self.tolerance = float(tolerance)
        #: the last call's estimated error of each target's tilted mean ``G / Z`` (0: dense)
        self.estimate = np.zeros(0)
        #: ``A = beta I``: ``c^ = x``, the radial part of ``G`` is along ``x``
        self.isotropic = bool(np.array_equal(self.A, self.A[0, 0] * np.eye(3)))
        self._plan: _Plan | None = None
        #: the bound of the Chebyshev expansion's error per unit mass (0: none)
        self.chebyshev_error = 0.0
        self._sources: tuple[np.ndarray, np.ndarray] | None = None
        #: the last call: degree, Chebyshev terms, targets summed densely, targets
        self.last: dict[str, int] = {}

    # ---- plans ----------------------------------------------------------------------------
    def _source_locations(self, sources: np.ndarray) -> np.ndarray:
        if (
            self._sources is not None
            and self._sources[0].shape == sources.shape
            and _same_array(self._sources[0], sources)
        ):
            return self._sources[1]
        loc = _locations(sources)[0]
        self._sources = (sources if _frozen(sources) else sources.copy(), loc)
        return loc

    def plan(self, points: np.ndarray) -> _Plan:
        """The plan of the targets ``points (M, 3)`` (kept while they do not change)."""
        if self._plan is not None and np.array_equal(self._plan.points, points):
            return self._plan
        tilts = points @ self.A.T
        shift = np.linalg.norm(tilts, axis=1)
        r_hi = float(shift.max())
        dense = shift <= SINGULAR * max(r_hi, 1.0)
        directions = tilts / np.where(dense, 1.0, shift)[:, None]
        directions[dense] = (0.0, 0.0, 1.0)
        loc, frame, rho = _locations(directions)
        dense |= rho <= SINGULAR
        live = shift[~dense]
        r_lo, r_hi = (float(live.min()), float(live.max())) if live.size else (1.0, 1.0)
        degree = degree_for(r_hi)
        self.chebyshev_error = 0.0
        if r_hi - r_lo <= 1e-14 * r_hi:
            terms, radii = 1, np.array([r_hi])
            coefficients = self._tables(degree, radii)  # (L + 1, 1)
            basis = np.ones((points.shape[0], 1))
        else:
            coefficients, terms = self._expansion(degree, r_lo, r_hi)
            t = np.clip((2 * shift - (r_lo + r_hi)) / (r_hi - r_lo), -1.0, 1.0)
            basis = np.cos(np.arccos(t)[:, None] * np.arange(terms)[None, :])
        l_of = np.concatenate([np.arange(m, degree + 1) for m in range(degree + 1)])
        weights = {
            k: np.ascontiguousarray(4 * math.pi * v[l_of].T) for k, v in coefficients.items()
        }
        lines = None
        if self.isotropic and terms == 1:  # c^ = x, one radius: the targets' own lines
            lines = LineSynthesis.build(points, degree)
        self._plan = _Plan(
            points.copy(), loc, frame, directions, shift, degree, weights, basis, dense, lines
        )
        return self._plan

    def _tables(self, degree: int, radii: np.ndarray) -> dict[str, np.ndarray]:
        """The scaled weights ``(L + 1, len(radii))`` of the parts: ``e^{-r} i_l``,
        ``e^{-r} i_l / r`` (the surface gradient) and ``e^{-r} i_l'`` (radial)."""
        b = scaled_bessel(degree + 1, radii).T  # (L + 2, R)
        l = np.arange(degree + 1)[:, None]
        # i_l' = i_{l+1} + l / r i_l (also at l = 0: i_0' = i_1)
        radial = b[1:] + l * b[:-1] / radii[None, :]
        return {"z": b[:-1], "tangent": b[:-1] / radii[None, :], "radial": radial}

    def _expansion(self, degree: int, r_lo: float, r_hi: float) -> tuple[dict, int]:
        """Chebyshev coefficients in ``r`` over ``[r_lo, r_hi]`` of the weight tables, with
        as many terms as their last two coefficients need to weigh below the tolerance, or
        below their own round-off (``ROUNDOFF`` of each table's largest value)."""
        l = np.arange(degree + 1)[:, None]
        bound = (2 * l + 1) * (1 + l / r_lo)
        floor = CHEBYSHEV_TOLERANCE * float(scaled_bessel(0, r_hi)[0])
        terms = 8
        while True:
            t = np.cos(np.pi * (np.arange(terms) + 0.5) / terms)
            radii = 0.5 * (r_lo + r_hi) + 0.5 * (r_hi - r_lo) * t
            tables = self._tables(degree, radii)
            coefficients = {k: _chebyshev(v) for k, v in tables.items()}
            worst = max(
                float(np.sum(bound * (np.abs(c[:, -1:]) + np.abs(c[:, -2:-1]))))
                for c in coefficients.values()
            )
            noise = max(
                float(np.sum(bound * np.abs(v).max(axis=1, keepdims=True))) for v in tables.values()
            )
            if worst <= max(floor, ROUNDOFF * noise):
                self.chebyshev_error = worst
                return coefficients, terms
            if terms >= MAX_TERMS:
                raise SphereHarmonicsError(
                    f"attention: |A x| spans {r_lo:.4g} .. {r_hi:.4g}; {MAX_TERMS} Chebyshev "
                    f'terms leave {worst:.1e}; use attention.engine = "direct"'
                )
            terms *= 2

    # ---- sums -----------------------------------------------------------------------------
    @profile.timed("velocity.harmonic")
    def sums(
        self,
        sources: np.ndarray,
        masses: np.ndarray,
        points: np.ndarray,
        radial: bool = True,
        extra: np.ndarray | None = None,
        panels: tuple[int, int] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``extra (M,)``: a part of ``e^{-r} Z`` summed exactly elsewhere (the atoms' of
        :mod:`tpde.schemes.sphere_atoms`), not added here; the error estimate of a target's
        tilted mean is relative to the total ``z + extra``. ``panels = (n, nodes)``: the
        sources are the Gauss nodes of :func:`tpde.grid.cubed_sphere.point_values` on ``n``
        cells a panel edge, in its order; the coefficients then come from the
        :class:`PanelReduction` of the masses where it pays (its bound joins the estimate).

        ``e^{-r} Z`` ``(M,)``, ``e^{-r} G`` ``(M, 3)`` and ``r = |A x|`` ``(M,)`` at the
        targets ``points (M, 3)`` of the measure ``sum_j masses_j delta_{sources_j}``
        (``sources (S, 3)`` unit vectors, ``masses >= 0`` ``S`` of them, ``(S,)`` or any shape
        whose C order is the sources' order). ``radial = False`` (only
        for ``A = beta I``): ``G`` less its part along ``c^ = x``, all that ``P_x G``
        needs (one synthesis fewer)."""
        from ducc0.sht.experimental import adjoint_synthesis_general, synthesis_general

        threads = ensure_policy()
        plan = self.plan(points)
        degree = plan.degree
        common = {"lmax": degree, "epsilon": NUFFT_EPSILON, "nthreads": threads}
        reduction = None
        if panels is not None and sources.shape[0] == 6 * (panels[0] * panels[1]) ** 2:
            reduction = PanelReduction.build(int(panels[0]), int(panels[1]), degree)
        cached = _ALM.get(degree, sources, masses)
        if cached is None:
            if reduction is not None:
                cached = reduction.coefficients(masses, **common)
            else:
                alm = adjoint_synthesis_general(
                    map=np.ascontiguousarray(masses, float).reshape(1, -1),
                    spin=0,
                    loc=self._source_locations(sources),
                    **common,
                )[0]  # (as coefficients(), the source locations kept)
                cached = (alm, 0.0)
            _ALM.put(degree, sources, masses, *cached)
        alm, reduced = cached
        M = points.shape[0]
        terms = plan.basis.shape[1]
        with_radial = radial or not self.isotropic
        z, surface = np.zeros(M), np.zeros((2, M))
        radial_part = np.zeros(M) if with_radial else None
        on_lines = plan.lines is not None and not with_radial
        if plan.lines is not None and on_lines:
            # exact at the face centres: e^{-r} G's tangent part is grad_S (e^{-r} Z) / r
            z, g = plan.lines.evaluate(
                alm * plan.weights["z"][0], 1.0 / float(plan.shift[0]), threads
            )
        for k in range(0 if on_lines else terms):

            def synthesis(part: str, spin: int, mode: str = "STANDARD", k: int = k) -> np.ndarray:
                coefficients = (alm * plan.weights[part][k])[None, :]
                return synthesis_general(
                    alm=coefficients, spin=spin, loc=plan.loc, mode=mode, **common
                )

            if terms == 1:  # one radius: the basis is 1, the sums are the syntheses
                z, surface = synthesis("z", 0)[0], synthesis("tangent", 1, "DERIV1")
                radial_part = synthesis("radial", 0)[0] if with_radial else None
                break
            column = plan.basis[:, k]
            z += column * synthesis("z", 0)[0]
            surface += column * synthesis("tangent", 1, "DERIV1")
            if radial_part is not None:
                radial_part += column * synthesis("radial", 0)[0]
        if not on_lines:
            g = np.empty((M, 3))
            _frame_sum(np.ascontiguousarray(surface), plan.frame, g)
        if radial_part is not None:
            g += radial_part[:, None] * plan.directions
        interpolation = 0.0
        if reduced > 0.0:
            # the reduction's bound times the largest truncated kernel (value or gradient)
            live = plan.shift[~plan.dense]
            r_lo = float(live.min()) if live.size else 1.0
            interpolation = reduced * float(np.sum(_tail_weights(degree, r_lo)))
        error = (
            NOISE * float(z.max())
            + (TAIL_TOLERANCE + self.chebyshev_error) * float(np.sum(masses))
            + interpolation
        )
        # the tilted mean G / Z errs by at most |dG| / Z + |G / Z| |dZ| / Z <= 2 error / Z
        total = z if extra is None else z + extra
        with np.errstate(divide="ignore"):
            estimate = np.where(total > 0, 2.0 * error / total, np.inf)
        dense = plan.dense | (estimate > self.tolerance)
        estimate[dense] = 0.0
        self.estimate = estimate
        if np.any(dense):
            with profile.phase("velocity.direct"):
                z[dense], g[dense] = self._dense(sources, masses.reshape(-1), points[dense])
        self.last = {
            "degree": degree,
            "terms": terms,
            "lines": int(on_lines),
            "dense_targets": int(np.count_nonzero(dense)),
            "targets": M,
            "reduction": 0 if reduction is None else reduction.terms,
        }
        return z, g, plan.shift

    def _dense(
        self, sources: np.ndarray, masses: np.ndarray, points: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The scaled sums at a few targets by the dense formula (blocked)."""
        tilts = points @ self.A.T
        shift = np.linalg.norm(tilts, axis=1)
        columns = np.concatenate([masses[:, None], masses[:, None] * sources], axis=1)
        out = np.empty((points.shape[0], 4))
        block = max(1, 4_000_000 // max(sources.shape[0], 1))
        for start in range(0, points.shape[0], block):
            rows = slice(start, start + block)
            exponent = tilts[rows] @ sources.T - shift[rows, None]
            out[rows] = np.exp(exponent, out=exponent) @ columns
        return out[:, 0], out[:, 1:]


def coefficients(
    sources: np.ndarray, masses: np.ndarray, degree: int, epsilon: float = NUFFT_EPSILON
) -> np.ndarray:
    """``a_lm = sum_j masses_j Y_lm*(sources_j)``, ``m >= 0`` (ducc0's order: ``m`` major),
    by one non-uniform adjoint synthesis."""
    from ducc0.sht.experimental import adjoint_synthesis_general

    return adjoint_synthesis_general(
        map=np.ascontiguousarray(masses, float)[None, :],
        spin=0,
        lmax=int(degree),
        loc=_locations(sources)[0],
        epsilon=float(epsilon),
        nthreads=ensure_policy(),
    )[0]


def scaled_energy(sources: np.ndarray, masses: np.ndarray, beta: float) -> float:
    """``e^{-beta} sum_{i, j} m_i m_j e^{beta <y_i, y_j>}`` by Funk-Hecke:
    ``sum_l 4 pi e^{-beta} i_l(beta) sum_{m = -l}^{l} |a_lm|^2`` (module docstring; the degree
    by :func:`degree_for`, the tail bounded as for the sums)."""
    degree = degree_for(beta)
    alm = coefficients(sources, masses, degree)
    l_of = np.concatenate([np.arange(m, degree + 1) for m in range(degree + 1)])
    doubled = np.full(l_of.size, 2.0)
    doubled[: degree + 1] = 1.0  # m = 0 once, m > 0 twice (the real measure's -m)
    power = np.bincount(l_of, weights=doubled * np.abs(alm) ** 2, minlength=degree + 1)
    return float(4.0 * math.pi * np.sum(scaled_bessel(degree, beta) * power))
