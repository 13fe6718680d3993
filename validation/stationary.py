"""Stationary states of the noisy attention dynamics on the circle and the sphere (A = beta I).

docs/theory.md, 'Stationary states and phase transitions'. With noise ``eps`` the token law
follows ``d/dt rho = div(rho grad mu)`` with the chemical potential

    mu = eps log rho - Phi / beta              (unnormalised)
    mu = eps log rho - log(Phi) / beta         (normalised)

``Phi = K * rho``, ``Phi(x) = int e^{beta <x, y>} rho(y) dA(y)``. The flux ``rho grad mu``
vanishes at a stationary state (on the circle a constant flux ``J`` would need
``J int 1 / rho = 0``), so ``mu`` is constant: the Gibbs condition

    rho = exp(Phi / (beta eps)) / Z            (unnormalised)
    rho = Phi^{1 / (beta eps)} / Z             (normalised),

``Z`` fixing the mass. The unnormalised states are the critical points of the free energy
``F = eps int rho log rho - (1 / (2 beta)) iint e^{beta <x, y>} rho rho`` (the flow is its
Wasserstein gradient flow); the normalised flow has no such free energy (its ``F`` is NaN).

On the grid the unknowns are, on the circle, the cell averages ``u`` of the angle cells of
:func:`tpde.grid.circle.circle_grid` (densities per unit angle) and, on the sphere, for the
*zonal* (axisymmetric) states, the values at the ``n`` Gauss-Legendre latitudes ``z_i``
(densities per unit area; the ``phi``-integral of the kernel is exact in closed form, and
the Gauss-Legendre rule in ``z`` is spectrally accurate for a zonal profile, an entire
function of ``z``). The residual is the Gibbs condition, ``G(u) = u - N(u)``:

* ``Phi`` at ``nodes`` Gauss-Legendre nodes of every cell from the cell averages (the kernel
  matrix ``kernel``, shape ``(cells * nodes, cells)``): on the circle the Fourier series
  ``Phi(x) = sum_k I_k(beta) c_k e^{i k x}`` with ``c_k`` from the DFT of the cell averages
  divided by ``sinc(k h / 2)`` (exact for trigonometric data, spectral otherwise); on the
  sphere ``Phi(z_i) = 2 pi sum_j w_j e^{beta z_i z_j} I_0(beta s_i s_j) rho_j`` (one node
  per latitude, ``s = sqrt(1 - z^2)``);
* ``N(u)`` the cell averages (the same Gauss-Legendre rule) of the Gibbs function, scaled to
  mass 1 (the densities are probabilities).

The linearisation (stability): ``d/dt delta = div(rho grad delta_mu)`` with
``delta_mu = eps delta / rho - delta_Phi / beta`` (``/ (beta Phi)`` normalised); on the circle
by spectral differentiation on the whole grid (every mode; the rotation of a clustered
state is an exact zero eigenvalue), on the sphere the zonal block in the weak form with the
differentiation matrix of the latitudes (the non-axisymmetric perturbations are not
covered).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.polynomial.legendre import leggauss
from scipy.optimize import brentq
from scipy.sparse.linalg import LinearOperator, gmres
from scipy.special import ive

from tpde.grid.circle import TWO_PI
from tpde.grid.threads import ensure_policy

__all__ = [
    "GEOMETRIES",
    "MODELS",
    "NewtonError",
    "StationaryProblem",
    "amplitude",
    "critical_beta",
    "free_energy",
    "gibbs",
    "jacobian",
    "jacobian_operator",
    "jacobian_vector",
    "linearisation",
    "linear_threshold",
    "newton_krylov",
    "potential",
    "reduced_jacobian",
    "resolved",
    "residual",
    "solve",
    "spectrum",
    "stability",
    "stationary_problem",
    "uniform",
    "uniform_free_energy",
]

GEOMETRIES = ("circle", "sphere")
MODELS = ("unnormalised", "normalised")
#: Gauss-Legendre nodes per cell of the Gibbs cell averages and the kernel sums
DEFAULT_NODES = 4
#: Newton: the residual's max norm relative to the uniform density
NEWTON_TOLERANCE = 1e-13
NEWTON_MAX_ITERATIONS = 30
#: GMRES: relative residual of each Newton step (Newton then converges linearly at this rate)
GMRES_TOLERANCE = 1e-10
#: a resolved state: its Fourier (circle) modes above a third of the cells, its Legendre
#: (sphere) modes above half the nodes, below this fraction of the mass (the aliasing of
#: the kernel sums is then below it too)
TAIL_MAX = 1e-9
#: eigenvalues above this fraction of the spectral radius count as unstable
UNSTABLE_FRACTION = 1e-9


class NewtonError(ArithmeticError):
    """Newton did not converge (the message says how far it got)."""


@dataclass(frozen=True, eq=False)
class StationaryProblem:
    """One discretisation: geometry, cells, beta and model with its fixed matrices.

    ``measure``: (n,) the area of each cell (``h`` on the circle; on the sphere ``2 pi w_i``,
    the band of a latitude); ``weights``: (nodes,) the Gauss-Legendre weights of a cell
    average; ``kernel``: (n * nodes, n) ``Phi`` at the nodes (cell by cell) from the cell averages;
    ``kernel_centres``: (n, n) ``Phi`` at the cell centres; ``moment``: (n,) the amplitude
    ``a = moment @ u`` (circle ``int rho cos theta``, sphere ``int rho z``).
    """

    geometry: str
    cells: int
    beta: float
    normalised: bool
    nodes: int
    centres: np.ndarray
    measure: np.ndarray
    weights: np.ndarray
    kernel: np.ndarray
    kernel_centres: np.ndarray
    moment: np.ndarray
    _ops: dict = field(default_factory=dict, repr=False)

    @property
    def model(self) -> str:
        return "normalised" if self.normalised else "unnormalised"

    @property
    def coordinate_name(self) -> str:
        """What the cells' coordinate is (a file's long_name)."""
        return "angle theta" if self.geometry == "circle" else "z (Gauss-Legendre)"

    @property
    def density_uniform(self) -> float:
        return 1.0 / (TWO_PI if self.geometry == "circle" else 2.0 * TWO_PI)

    @property
    def reduced(self) -> int:
        """Unknowns of the symmetric reduction (circle: the even half; sphere: every latitude)."""
        return self.cells // 2 if self.geometry == "circle" else self.cells

    def expand(self, v: np.ndarray) -> np.ndarray:
        """The full state of a reduced one: on the circle ``rho(-theta) = rho(theta)``
        (cell ``j`` and ``n - 1 - j``), which fixes the rotation (the phase condition)."""
        v = np.asarray(v, float)
        return np.concatenate([v, v[..., ::-1]], axis=-1) if self.geometry == "circle" else v

    def restrict(self, u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, float)
        return u[..., : self.reduced]


def _check(geometry: str, cells: int, beta: float, model: str, nodes: int) -> None:
    if geometry not in GEOMETRIES:
        raise ValueError(f"geometry: expected one of {', '.join(GEOMETRIES)}, got {geometry!r}")
    if model not in MODELS:
        raise ValueError(f"model: expected one of {', '.join(MODELS)}, got {model!r}")
    if isinstance(cells, bool) or int(cells) != cells or cells < 16 or cells % 2:
        raise ValueError(f"cells: expected an even integer >= 16, got {cells!r}")
    if not (math.isfinite(beta) and 0 < beta <= 60):
        raise ValueError(f"beta: expected a number in (0, 60], got {beta!r}")
    if isinstance(nodes, bool) or int(nodes) != nodes or not 2 <= nodes <= 16:
        raise ValueError(f"nodes: expected an integer in 2..16, got {nodes!r}")


def stationary_problem(
    geometry: str,
    cells: int,
    beta: float,
    model: str = "unnormalised",
    nodes: int = DEFAULT_NODES,
) -> StationaryProblem:
    """The discretisation of ``geometry`` ("circle" | "sphere") with ``cells`` cells."""
    _check(geometry, cells, float(beta), model, nodes)
    cells, beta, nodes = int(cells), float(beta), int(nodes)
    ensure_policy()  # one BLAS thread: the dense products and eigenvalues here are small
    if geometry == "sphere":
        nodes = 1  # the latitude grid's unknowns are the values at its nodes
    x, w = leggauss(nodes)
    weights = 0.5 * w if nodes > 1 else np.ones(1)
    build = _circle if geometry == "circle" else _sphere
    centres, measure, kernel, kernel_centres, moment = build(cells, beta, x)
    return StationaryProblem(
        geometry,
        cells,
        beta,
        model == "normalised",
        nodes,
        centres,
        measure,
        weights,
        kernel,
        kernel_centres,
        moment,
    )


def _circle_sums(targets: np.ndarray, centres: np.ndarray, h: float, beta: float) -> np.ndarray:
    """(targets, n): ``Phi(x) = (2 pi / n) sum_{|k| < n/2} I_k(beta) / sinc(k h / 2)
    e^{i k (x - theta_j)} u_j`` (the Fourier series of ``K * rho`` with the cell-average
    correction; the Nyquist mode dropped)."""
    n = centres.size
    k = np.arange(1, n // 2)
    factor = ive(k, beta) * math.exp(beta) / np.sinc(k * h / (2.0 * math.pi))
    diff = targets[:, None] - centres[None, :]
    series = math.exp(beta) * float(ive(0, beta)) + 2.0 * np.einsum(
        "k,tjk->tj", factor, np.cos(diff[:, :, None] * k[None, None, :])
    )
    return TWO_PI / n * series


def _circle(cells: int, beta: float, x: np.ndarray):
    h = TWO_PI / cells
    centres = (np.arange(cells) + 0.5) * h
    nodes = (centres[:, None] + 0.5 * h * x[None, :]).ravel()
    kernel = _circle_sums(nodes, centres, h, beta)
    kernel_centres = _circle_sums(centres, centres, h, beta)
    # int rho cos theta = Re c_1 exactly from the cell averages: h cos(theta_j) / sinc(h / 2)
    moment = h * np.cos(centres) / np.sinc(h / (2.0 * math.pi))
    return centres, np.full(cells, h), kernel, kernel_centres, moment


def _sphere_kernel(targets: np.ndarray, sources: np.ndarray, beta: float) -> np.ndarray:
    """``2 pi e^{beta z z'} I_0(beta s s')`` (the phi-integral of ``e^{beta <x, y>}``)."""
    s_t = np.sqrt(np.maximum(0.0, 1.0 - targets**2))
    s_s = np.sqrt(np.maximum(0.0, 1.0 - sources**2))
    arg = beta * s_t[:, None] * s_s[None, :]
    return TWO_PI * np.exp(beta * targets[:, None] * sources[None, :] + arg) * ive(0, arg)


def _sphere(cells: int, beta: float, x: np.ndarray):
    # the Gauss-Legendre latitude grid: nodes z_i, dA = 2 pi w_i (spectral for zonal states)
    z, w = leggauss(cells)
    kernel = _sphere_kernel(z, z, beta) * w[None, :]
    return z, TWO_PI * w, kernel, kernel, TWO_PI * w * z


# ---- the Gibbs map --------------------------------------------------------------------------
def uniform(problem: StationaryProblem) -> np.ndarray:
    """The uniform probability density's cell averages, (n,)."""
    return np.full(problem.cells, problem.density_uniform)


def potential(problem: StationaryProblem, u: np.ndarray) -> np.ndarray:
    """``Phi = K * rho`` at the nodes, (n * nodes,)."""
    return problem.kernel @ np.asarray(u, float)


def _exponent(problem: StationaryProblem, phi: np.ndarray, eps: float) -> np.ndarray:
    if problem.normalised:
        if phi.min() <= 0:
            raise NewtonError("stationary: K * rho is not positive (the state left the grid)")
        return np.log(phi) / (problem.beta * eps)
    return phi / (problem.beta * eps)


def _averages(problem: StationaryProblem, values: np.ndarray) -> np.ndarray:
    """Cell averages of node values (cell by cell, ``nodes`` each)."""
    return values.reshape(problem.cells, problem.nodes) @ problem.weights


def gibbs(problem: StationaryProblem, u: np.ndarray, eps: float) -> np.ndarray:
    """``N(u)``: the cell averages of ``exp(psi) / Z`` with ``psi = Phi / (beta eps)``
    (unnormalised) or ``log(Phi) / (beta eps)``, of mass 1, (n,)."""
    psi = _exponent(problem, potential(problem, u), eps)
    g = _averages(problem, np.exp(psi - psi.max()))
    return g / (problem.measure @ g)


def residual(problem: StationaryProblem, u: np.ndarray, eps: float) -> np.ndarray:
    """``G(u) = u - N(u)``, (n,): zero exactly at the grid's stationary states."""
    return np.asarray(u, float) - gibbs(problem, u, eps)


def _linear_parts(problem: StationaryProblem, u: np.ndarray, eps: float):
    phi = potential(problem, u)
    psi = _exponent(problem, phi, eps)
    g = np.exp(psi - psi.max())
    mass = problem.measure @ _averages(problem, g)
    state = _averages(problem, g) / mass
    # d psi / d u = kernel / (beta eps) (unnormalised), kernel / (beta eps Phi) (normalised)
    dpsi = 1.0 / (problem.beta * eps) / (phi if problem.normalised else 1.0)
    return g / mass, state, dpsi, psi


def jacobian_operator(problem: StationaryProblem, u: np.ndarray, eps: float):
    """The matrix-free linearisation at ``(u, eps)``: a function ``(du, deps) -> dG`` with
    ``dG = du - dN``, ``dN = <g dpsi> - N <g dpsi>_mass``,
    ``dpsi = (d psi / d u) du + (d psi / d eps) deps`` (``d psi / d eps = -psi / eps``)."""
    g, state, dpsi, psi = _linear_parts(problem, u, eps)
    d_eps = -psi / eps

    def apply(du: np.ndarray, deps: float = 0.0) -> np.ndarray:
        delta = dpsi * (problem.kernel @ du)
        if deps:
            delta = delta + d_eps * deps
        dg = _averages(problem, g * delta)
        return np.asarray(du, float) - (dg - state * (problem.measure @ dg))

    return apply


def jacobian_vector(
    problem: StationaryProblem, u: np.ndarray, eps: float, du: np.ndarray, deps: float = 0.0
) -> np.ndarray:
    """``dG`` at ``(u, eps)`` along ``(du, deps)`` (:func:`jacobian_operator`)."""
    return jacobian_operator(problem, u, eps)(du, deps)


def jacobian(
    problem: StationaryProblem, u: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """Dense ``(dG / du (n, n), dG / d eps (n,))``."""
    g, state, dpsi, psi = _linear_parts(problem, u, eps)
    gm = (g * dpsi)[:, None] * problem.kernel  # (Q, n)
    dg = np.einsum("cqj,q->cj", gm.reshape(problem.cells, problem.nodes, -1), problem.weights)
    dn = dg - state[:, None] * (problem.measure @ dg)[None, :]
    de = _averages(problem, g * (-psi / eps))
    return np.eye(problem.cells) - dn, -(de - state * (problem.measure @ de))


# ---- Newton-Krylov --------------------------------------------------------------------------
def newton_krylov(
    function,
    linearise,
    x0: np.ndarray,
    scale: float,
    tolerance: float = NEWTON_TOLERANCE,
    max_iterations: int = NEWTON_MAX_ITERATIONS,
) -> tuple[np.ndarray, int]:
    """Newton's method with GMRES on the matrix-free Jacobian.

    ``function(x)`` the residual, ``linearise(x)`` a function ``dx -> J(x) dx``; stops when
    ``max |F| <= tolerance * scale``. Returns ``(x, iterations)``; NewtonError otherwise.
    The Jacobians here are the identity minus a smoothing operator (or that bordered), so
    unrestarted GMRES converges in a few dozen iterations."""
    x = np.array(x0, float)
    value = function(x)
    norm = math.inf
    for iteration in range(max_iterations + 1):
        norm = float(np.max(np.abs(value)))
        if not math.isfinite(norm):
            raise NewtonError(f"stationary: the residual is not finite at iteration {iteration}")
        if norm <= tolerance * scale:
            return x, iteration
        if iteration == max_iterations:
            break
        n = x.size
        op = LinearOperator((n, n), matvec=linearise(x), dtype=float)
        step, info = gmres(op, -value, rtol=GMRES_TOLERANCE, atol=0.0, restart=n, maxiter=4)
        if info < 0 or not np.all(np.isfinite(step)):
            raise NewtonError(f"stationary: GMRES failed (info {info})")
        x = x + step
        value = function(x)
    raise NewtonError(
        f"stationary: Newton did not converge in {max_iterations} iterations "
        f"(residual {norm / scale:.2e} of the scale)"
    )


def solve(
    problem: StationaryProblem,
    eps: float,
    guess: np.ndarray | None = None,
    tolerance: float = NEWTON_TOLERANCE,
) -> tuple[np.ndarray, int]:
    """A stationary state at noise ``eps`` by Newton-Krylov from ``guess`` (cell averages;
    default: the uniform state), in the symmetric reduction (the circle's even states: the
    phase condition fixing the rotation). Returns ``(u (n,), Newton iterations)``."""
    eps = float(eps)
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps: expected a number > 0, got {eps!r}")
    start = uniform(problem) if guess is None else np.asarray(guess, float)
    v0 = problem.restrict(start)

    def function(v):
        return problem.restrict(residual(problem, problem.expand(v), eps))

    def linearise(v):
        apply = jacobian_operator(problem, problem.expand(v), eps)
        return lambda dv: problem.restrict(apply(problem.expand(dv)))

    scale = max(problem.density_uniform, float(np.max(np.abs(v0))))  # the peak's round-off
    v, iterations = newton_krylov(function, linearise, v0, scale, tolerance)
    return problem.expand(v), iterations


def reduced_jacobian(problem: StationaryProblem, u: np.ndarray, eps: float) -> np.ndarray:
    """Dense ``dG / du`` of the symmetric reduction, (reduced, reduced)."""
    full, _ = jacobian(problem, u, eps)
    r = problem.reduced
    if problem.geometry == "circle":
        return full[:r, :r] + full[:r, r:][:, ::-1]
    return full


# ---- observables ----------------------------------------------------------------------------
def amplitude(problem: StationaryProblem, u: np.ndarray) -> np.ndarray:
    """``a = int rho cos theta`` (circle) or ``int rho z`` (sphere): 0 for the uniform state,
    up to 1 for a point mass at ``theta = 0`` / the north pole."""
    return np.asarray(u, float) @ problem.moment


def free_energy(problem: StationaryProblem, u: np.ndarray, eps: float) -> float:
    """``F = eps int rho log rho - (1/(2 beta)) int rho Phi`` of the Gibbs function of ``u``
    (its node values ``rho_q = e^{psi_q} / Z``): with ``log rho = Phi / (beta eps) - log Z``,
    ``F = (1/(2 beta)) int rho Phi - eps log Z`` (mass 1). NaN for the normalised model (no
    free energy). At a stationary state the Gibbs function's cell averages are ``u``."""
    if problem.normalised:
        return math.nan
    phi = potential(problem, u)
    psi = phi / (problem.beta * eps)
    top = psi.max()
    g = np.exp(psi - top)
    z = problem.measure @ _averages(problem, g)
    rho = g / z
    log_z = top + math.log(z)
    return float(
        problem.measure @ _averages(problem, rho * phi) / (2.0 * problem.beta) - eps * log_z
    )


def uniform_free_energy(geometry: str, beta: float, eps: float) -> float:
    """The closed form at the uniform state: ``-eps log|S| - kappa_0 / (2 beta)`` with
    ``|S| = 2 pi`` and ``kappa_0 = I_0(beta)`` (circle), ``4 pi`` and ``sinh(beta) / beta``
    (sphere)."""
    if geometry == "circle":
        return -eps * math.log(TWO_PI) - math.exp(beta) * float(ive(0, beta)) / (2.0 * beta)
    return -eps * math.log(2.0 * TWO_PI) - math.sinh(beta) / beta / (2.0 * beta)


def resolved(problem: StationaryProblem, u: np.ndarray) -> bool:
    """Whether the grid holds the state: the DFT of the cell averages beyond a third of the
    cells (circle), the Legendre coefficients beyond half the nodes (sphere), below TAIL_MAX
    of the mass (beyond, the cluster is too narrow for the grid)."""
    u = np.asarray(u, float)
    if u.min() <= 0:
        return False
    if problem.geometry == "circle":
        modes = np.abs(np.fft.rfft(u))
        return bool(modes[problem.cells // 3 :].max() <= TAIL_MAX * modes[0])
    coefficients = np.abs(_legendre(problem) @ u)
    return bool(coefficients[problem.cells // 2 :].max() <= TAIL_MAX * coefficients[0])


def _legendre(problem: StationaryProblem) -> np.ndarray:
    """(n, n): node values -> Legendre coefficients ``(2l + 1)/2 sum_i w_i rho_i P_l(z_i)``."""
    if "legendre" not in problem._ops:
        from scipy.special import eval_legendre

        z, w = problem.centres, problem.measure / TWO_PI
        l = np.arange(problem.cells)
        problem._ops["legendre"] = (l[:, None] + 0.5) * eval_legendre(l[:, None], z[None, :]) * w
    return problem._ops["legendre"]


def _differentiation(z: np.ndarray) -> np.ndarray:
    """The derivative at the nodes of the interpolating polynomial (barycentric form)."""
    diff = z[:, None] - z[None, :]
    np.fill_diagonal(diff, 1.0)
    lam = 1.0 / np.prod(diff, axis=1)
    d = (lam[None, :] / lam[:, None]) / diff
    np.fill_diagonal(d, 0.0)
    np.fill_diagonal(d, -d.sum(axis=1))
    return d


# ---- the linearised dynamics ----------------------------------------------------------------
def _circle_operators(problem: StationaryProblem):
    """Dense (n, n): cell averages -> centre values, centre values -> the cell averages of
    their derivative, and the derivative at the centres (spectral, Nyquist mode dropped)."""
    if "circle" in problem._ops:
        return problem._ops["circle"]
    n = problem.cells
    h = TWO_PI / n
    k = np.fft.fftfreq(n, 1.0 / n)
    sinc = np.sinc(k * h / (2.0 * math.pi))
    keep = np.abs(k) < n / 2
    eye = np.eye(n)
    spectrum = np.fft.fft(eye, axis=0)
    to_points = np.fft.ifft(spectrum * np.where(keep, 1.0 / sinc, 0.0)[:, None], axis=0).real
    derivative = np.fft.ifft(spectrum * np.where(keep, 1j * k, 0.0)[:, None], axis=0).real
    averaged = np.fft.ifft(spectrum * np.where(keep, 1j * k * sinc, 0.0)[:, None], axis=0).real
    problem._ops["circle"] = (to_points, derivative, averaged)
    return problem._ops["circle"]


def linearisation(problem: StationaryProblem, u: np.ndarray, eps: float) -> np.ndarray:
    """The dense matrix (n, n) of ``delta -> div(rho grad delta_mu)`` on the cell averages at
    the state ``u`` (module docstring)."""
    u = np.asarray(u, float)
    phi = problem.kernel_centres @ u
    coupling = problem.kernel_centres / problem.beta
    if problem.normalised:
        coupling = coupling / phi[:, None]
    if problem.geometry == "circle":
        to_points, derivative, averaged = _circle_operators(problem)
        rho = to_points @ u
        dmu = eps * to_points / rho[:, None] - coupling
        return averaged @ (rho[:, None] * (derivative @ dmu))
    if "derivative" not in problem._ops:
        problem._ops["derivative"] = _differentiation(problem.centres)
    derivative = problem._ops["derivative"]
    dmu = eps * np.diag(1.0 / u) - coupling
    # the weak form W d/dt delta = -D^T diag(W (1 - z^2) rho) D delta_mu (W the quadrature
    # weights): mass exact, and -W^-1 (PSD) (W S) has real eigenvalues when W S is symmetric
    mobility = problem.measure * (1.0 - problem.centres**2) * u
    weak = derivative.T @ (mobility[:, None] * derivative)
    return -(weak @ dmu) / problem.measure[:, None]


def spectrum(problem: StationaryProblem, u: np.ndarray, eps: float) -> np.ndarray:
    """Eigenvalues of :func:`linearisation` (growth rates), by decreasing real part."""
    values = np.linalg.eigvals(linearisation(problem, u, eps))
    return values[np.argsort(-values.real)]


def stability(problem: StationaryProblem, u: np.ndarray, eps: float) -> tuple[int, float]:
    """``(unstable modes, leading growth rate)``: the eigenvalues with real part above
    UNSTABLE_FRACTION of the spectral radius, and the largest real part once the neutral
    modes (the mass; on the circle the Nyquist mode, which the spectral operators drop, and
    the rotation of a clustered state) are left out."""
    values = spectrum(problem, u, eps)
    radius = float(np.max(np.abs(values)))
    neutral = 1
    if problem.geometry == "circle":
        u = np.asarray(u, float)
        clustered = np.ptp(u) > 1e-10 * problem.density_uniform  # not uniform: it can rotate
        neutral = 3 if clustered else 2
    order = np.argsort(np.abs(values))
    rest = np.delete(values, order[:neutral])
    rates = np.sort(rest.real)[::-1]
    unstable = int(np.sum(rates > UNSTABLE_FRACTION * radius))
    return unstable, float(rates[0])


# ---- closed forms ---------------------------------------------------------------------------
def linear_threshold(geometry: str, beta: float, model: str = "unnormalised") -> float:
    """``eps`` at which the uniform state's first mode turns: ``kappa_1 / beta``
    (unnormalised) or ``kappa_1 / (beta kappa_0)``, ``kappa_l`` the Funk-Hecke eigenvalues
    (circle ``I_l(beta)``; sphere ``sqrt(pi / (2 beta)) I_{l + 1/2}(beta)``)."""
    nu = 0.0 if geometry == "circle" else 0.5
    prefactor = 1.0 if geometry == "circle" else math.sqrt(math.pi / (2.0 * beta))
    k1 = float(ive(1 + nu, beta))
    if model == "normalised":
        return k1 / float(ive(nu, beta)) / beta
    return prefactor * k1 * math.exp(beta) / beta


def critical_beta(geometry: str) -> float:
    """``beta*``: the root of ``I_{d/2+1}(beta) / I_{d/2}(beta) = 1/d`` (``d = 2`` the circle,
    ``d = 3`` the sphere), by brentq on the Bessel ratio."""
    d = 2 if geometry == "circle" else 3
    return float(
        brentq(lambda b: ive(d / 2 + 1, b) / ive(d / 2, b) - 1.0 / d, 0.1, 20.0, xtol=1e-14)
    )
