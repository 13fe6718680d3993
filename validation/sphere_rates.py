"""Linear growth rates of attention dynamics around the uniform measure on the sphere.

docs/theory.md, 'Attention dynamics on the sphere'. Tokens on ``S^{d-1}`` (``d = 2``: the
circle, ``d = 3``: the sphere) follow ``d/dt mu + div_S(mu P_x Gamma_mu) = 0``; with ``A =
beta I`` and ``V = I`` the tangential field is ``grad_S log Z_mu / beta``, ``Z_mu(x) = int
e^{beta <x, y>} dmu(y)``, and a perturbation of the uniform measure ``sigma`` along a
spherical harmonic of degree ``l`` grows at

    lambda_l = l (l + d - 2) kappa_l / (beta kappa_0)                (normalised attention)
    lambda_l = l (l + d - 2) kappa_l / beta                          (unnormalised, "usa")

with the Funk-Hecke eigenvalues ``kappa_l = Gamma(d/2) (2/beta)^nu I_{l+nu}(beta)``,
``nu = (d - 2)/2`` (``kappa_0 = int e^{beta <x, y>} dsigma(y)``). On the circle
``lambda_k = k^2 I_k(beta) / (beta I_0(beta))``.

Besides the closed forms this module holds the two checks the section describes, computed by
quadrature and independent of the finite-volume code: ``funk_hecke_quadrature`` (the
eigenvalue as the integral of the kernel against the Gegenbauer polynomial) and
``rate_by_quadrature`` (the growth rate of the degree-``l`` harmonic from the field itself:
``Z`` by quadrature, the tangential field, the divergence on the sphere, projected back on the
harmonic; linearised exactly or with a finite amplitude ``eps``), and ``fit_rate`` (the slope
of the log of a mode amplitude), used by the grid and token studies.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.special import (
    eval_chebyt,
    eval_gegenbauer,
    eval_legendre,
    gammaln,
    ive,
    roots_jacobi,
    roots_legendre,
)

__all__ = [
    "circle_grid_rate",
    "circle_sampled_token_rates",
    "circle_token_rate",
    "cubed_sphere_fitted_rate",
    "cubed_sphere_rate",
    "fastest_mode",
    "fit_rate",
    "funk_hecke",
    "funk_hecke_quadrature",
    "linear_rate",
    "noisy_rate",
    "rate_by_quadrature",
    "sphere_token_rates",
    "sphere_token_slope",
]


def _check(l: int, beta: float, d: int) -> tuple[int, float, int]:
    if isinstance(l, bool) or int(l) != l or l < 0:
        raise ValueError(f"rates.l: expected an integer >= 0, got {l!r}")
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"rates.beta: expected a finite number > 0, got {beta!r}")
    if isinstance(d, bool) or int(d) != d or d < 2:
        raise ValueError(f"rates.d: expected the ambient dimension d >= 2, got {d!r}")
    return int(l), float(beta), int(d)


def funk_hecke(l: int, beta: float, d: int = 2, scaled: bool = False) -> float:
    """``kappa_l = int e^{beta <x, y>} Y_l(y) dsigma(y) / Y_l(x)`` on ``S^{d-1}`` with the
    uniform probability ``sigma``: ``Gamma(d/2) (2/beta)^nu I_{l+nu}(beta)``,
    ``nu = (d-2)/2`` (``I_l(beta)`` on the circle). ``scaled``: times ``e^{-beta}``
    (no overflow for large ``beta``)."""
    l, beta, d = _check(l, beta, d)
    nu = 0.5 * (d - 2)
    log_prefactor = gammaln(0.5 * d) + nu * math.log(2.0 / beta)
    value = math.exp(log_prefactor) * float(ive(l + nu, beta))
    return value if scaled else value * math.exp(beta)


def linear_rate(l: int, beta: float, d: int = 2, normalised: bool = True) -> float:
    """Growth rate of the degree-``l`` harmonic around the uniform measure, ``A = beta I``,
    ``V = I``: ``l (l + d - 2) kappa_l / (beta kappa_0)``; ``normalised=False`` (the
    unnormalised variant) multiplies by ``kappa_0``."""
    l, beta, d = _check(l, beta, d)
    nu = 0.5 * (d - 2)
    ratio = float(ive(l + nu, beta) / ive(nu, beta))
    rate = l * (l + d - 2) * ratio / beta
    return rate if normalised else rate * funk_hecke(0, beta, d)


def noisy_rate(l: int, beta: float, eps: float, d: int = 2, normalised: bool = True) -> float:
    """The rate of :func:`linear_rate` with noise ``eps Delta`` (docs/theory.md, 'Noise: linear
    rates'): ``Y_l`` is an eigenfunction of the Laplace-Beltrami operator with eigenvalue
    ``-l (l + d - 2)``, so the rate is ``linear_rate - eps l (l + d - 2)``."""
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"rates.eps: expected a finite number >= 0, got {eps!r}")
    l, beta, d = _check(l, beta, d)
    return linear_rate(l, beta, d, normalised) - eps * l * (l + d - 2)


def fastest_mode(beta: float, d: int = 2, l_max: int = 1000) -> int:
    """The degree with the largest ``linear_rate`` (about ``sqrt(2 beta)`` on the circle for
    large ``beta``)."""
    rates = [linear_rate(l, beta, d) for l in range(1, l_max + 1)]
    return int(np.argmax(rates)) + 1


def _zonal(l: int, d: int, t: np.ndarray) -> np.ndarray:
    """The zonal harmonic of degree l on S^{d-1}, normalised to 1 at t = 1."""
    if d == 2:
        return eval_chebyt(l, t)
    nu = 0.5 * (d - 2)
    return eval_gegenbauer(l, nu, t) / eval_gegenbauer(l, nu, 1.0)


@functools.lru_cache(maxsize=4)
def _jacobi(nodes: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    return roots_jacobi(nodes, alpha, alpha)


def funk_hecke_quadrature(l: int, beta: float, d: int = 2, nodes: int = 120) -> float:
    """``kappa_l`` by Gauss-Jacobi quadrature of
    ``c_d int_{-1}^{1} e^{beta t} P_l(t) (1 - t^2)^{(d-3)/2} dt``,
    ``c_d = Gamma(d/2) / (sqrt(pi) Gamma((d-1)/2))``, ``P_l`` the zonal harmonic with
    ``P_l(1) = 1`` (Chebyshev on the circle, Legendre on S^2). Independent of the Bessel
    form of :func:`funk_hecke`."""
    l, beta, d = _check(l, beta, d)
    alpha = 0.5 * (d - 3)
    t, w = _jacobi(int(nodes), alpha)
    c_d = math.exp(gammaln(0.5 * d) - 0.5 * math.log(math.pi) - gammaln(0.5 * (d - 1)))
    return float(c_d * np.sum(w * np.exp(beta * t) * _zonal(l, d, t)))


def rate_by_quadrature(
    l: int,
    beta: float,
    d: int = 2,
    eps: float | None = None,
    normalised: bool = True,
    nodes: int = 256,
) -> float:
    """The growth rate of ``mu = sigma (1 + eps P_l)`` computed from the field itself.

    ``Z(x) = int e^{beta <x, y>} dmu(y)`` by quadrature (trapezoid in the angle on the
    circle; Gauss-Legendre in ``z = cos(polar angle)`` and the closed azimuthal integral
    ``2 pi e^{beta z z'} I_0(beta s s')`` on S^2 for the zonal ``P_l``), the tangential
    field ``v = grad_S log Z / beta`` (``grad_S Z / beta`` unnormalised), and
    ``d/dt mu = -div_S(mu v)`` projected on ``P_l``, divided by the amplitude. ``eps=None``:
    exactly linearised (the uniform part's ``grad_S Z`` vanishes, so only the perturbation
    enters ``grad Z``, and ``mu``, ``Z`` in the products are the uniform ones); otherwise the
    nonlinear field at amplitude ``eps`` (the result is the rate up to ``O(eps)``).
    """
    l, beta, d = _check(l, beta, d)
    if d == 2:
        return _rate_circle(l, beta, eps, normalised, nodes)
    if d == 3:
        return _rate_sphere(l, beta, eps, normalised, nodes)
    raise ValueError(f"rates.d: the quadrature check covers d = 2 and 3, got {d}")


def _rate_circle(k: int, beta: float, eps: float | None, normalised: bool, m: int) -> float:
    theta = 2.0 * np.pi * np.arange(m) / m
    s = theta[None, :] - theta[:, None]  # phi - theta (targets in rows)
    kernel = np.exp(beta * (np.cos(s) - 1.0))  # scaled by e^{-beta}
    perturbation = np.cos(k * theta) / (2.0 * np.pi)
    uniform = np.full(m, 1.0 / (2.0 * np.pi))
    amplitude = 1.0 if eps is None else float(eps)
    rho = uniform + amplitude * perturbation
    dphi = 2.0 * np.pi / m
    # dZ/dtheta = beta int sin(phi - theta) e^{beta cos(phi - theta)} rho(phi) dphi
    source = perturbation * amplitude if eps is None else rho
    z_prime = beta * (kernel * np.sin(s)) @ source * dphi
    z = kernel @ (uniform if eps is None else rho) * dphi
    field = z_prime / (beta * z) if normalised else z_prime * math.exp(beta) / beta
    flux = (uniform if eps is None else rho) * field
    # -d/dtheta flux, projected on cos(k theta): int flux * (-k sin(k theta)) ... by parts
    # int (-flux') cos(k theta) dtheta = -int flux k sin(k theta) dtheta
    growth = -np.sum(flux * k * np.sin(k * theta)) * dphi
    norm = amplitude * np.sum(perturbation * np.cos(k * theta)) * dphi
    return float(growth / norm)


@functools.lru_cache(maxsize=8)
def _sphere_kernels(beta: float, m: int) -> tuple[np.ndarray, ...]:
    """Gauss-Legendre nodes and weights in z and the zonal kernel with its z-derivative (both
    scaled by e^{-beta}): 2 pi e^{beta z z'} I_0(beta s s'), s = sqrt(1 - z^2)."""
    z, w = roots_legendre(m)
    s = np.sqrt(1.0 - z * z)
    zz = z[:, None] * z[None, :]  # targets in rows
    arg = beta * (s[:, None] * s[None, :])
    scaled = np.exp(beta * (zz - 1.0) + arg)
    kernel = 2.0 * np.pi * scaled * ive(0, arg)
    # d/dz: beta z' K - 2 pi e^{..} I_1(beta s s') beta s' z / s
    dkernel = beta * z[None, :] * kernel - 2.0 * np.pi * scaled * ive(1, arg) * beta * (
        s[None, :] * (z / s)[:, None]
    )
    return z, w, kernel, dkernel


def _rate_sphere(l: int, beta: float, eps: float | None, normalised: bool, m: int) -> float:
    z, w, kernel, dkernel = _sphere_kernels(beta, m)
    p = eval_legendre(l, z)
    dp = l * (z * p - eval_legendre(l - 1, z)) / (z * z - 1.0) if l > 0 else np.zeros_like(z)
    uniform = np.full(m, 1.0 / (4.0 * np.pi))
    perturbation = p / (4.0 * np.pi)
    amplitude = 1.0 if eps is None else float(eps)
    rho = uniform + amplitude * perturbation
    source = amplitude * perturbation if eps is None else rho
    z_prime = dkernel @ (source * w)
    zval = kernel @ ((uniform if eps is None else rho) * w)
    field = z_prime / (beta * zval) if normalised else z_prime * math.exp(beta) / beta
    # zonal: div_S(rho v) = d/dz((1 - z^2) rho v_z); projected on P_l by parts
    weight = uniform if eps is None else rho
    growth = 2.0 * np.pi * np.sum(w * (1.0 - z * z) * weight * field * dp)
    norm = 2.0 * np.pi * amplitude * np.sum(w * perturbation * p)
    return float(growth / norm)


def _record(key: str, mode: int, beta: float, rate: float, measured: float, **extra) -> dict:
    """One row of a rate table: the mode (under ``key``, "k" or "l"), beta, the formula's
    rate, the measured one, their relative error, then ``extra``."""
    return {
        key: int(mode),
        "beta": float(beta),
        "formula": rate,
        "measured": measured,
        "error": abs(measured / rate - 1.0),
        **extra,
    }


def _run_record(
    key: str,
    mode: int,
    beta: float,
    rate: float,
    times,
    amplitudes,
    t_end: float,
    steps: int,
    masses,
    **extra,
) -> dict:
    """The row of a solver run: the rate fitted to the mode's ``amplitudes`` at ``times``,
    the horizon, the amplitude's growth, the steps and the relative mass change."""
    amplitudes = np.asarray(amplitudes, float)
    return _record(
        key,
        mode,
        beta,
        rate,
        fit_rate(times, amplitudes),
        t_end=float(t_end),
        growth=float(amplitudes[-1] / amplitudes[0]),
        steps=steps,
        mass_change=_relative_change(masses),
        **extra,
    )


def _relative_change(masses) -> float:
    """The largest change of the mass over a run, relative to its start."""
    masses = np.asarray(masses, float)
    return float(np.abs(masses - masses[0]).max() / masses[0])


def fit_rate(times: np.ndarray, amplitudes: np.ndarray) -> float:
    """Least-squares slope of ``log |amplitude|`` against time."""
    t = np.asarray(times, float)
    a = np.log(np.abs(np.asarray(amplitudes, float)))
    if t.size < 2 or t.shape != a.shape:
        raise ValueError("fit_rate: expected matching times and amplitudes, at least 2")
    t0 = t - t.mean()
    return float(np.sum(t0 * (a - a.mean())) / np.sum(t0 * t0))


# ---- measured rates: the grid solver and the tokens on the circle ----------------------------
def _fastest_in(
    copies: int,
    beta: float,
    k_limit: int,
    exclude: int | None = None,
    noise: float = 0.0,
    normalised: bool = True,
) -> float:
    """The largest rate among the modes ``copies, 2 copies, ..`` below ``k_limit``."""
    ks = [j for j in range(copies, k_limit + 1, copies) if j != exclude]
    return max((noisy_rate(j, beta, noise, 2, normalised) for j in ks), default=0.0)


def circle_grid_rate(
    k: int,
    beta: float,
    cells: int = 16,
    copies: int | None = None,
    amplitude: float = 1e-8,
    span: float = 1.0,
    noise_span: float = 20.0,
    step: float = 0.05,
    snapshots: int = 11,
    reconstruction: str = "weno5z",
    noise: float = 0.0,
    normalised: bool = True,
) -> dict:
    """Seed mode ``k`` at ``amplitude`` on the uniform measure, run the finite-volume solver
    (FFT engine, ``A = beta I``, ``V = I``) and fit the growth rate of the mode's amplitude.
    ``noise``: eps of the noisy PDE (the formula is :func:`noisy_rate`); ``normalised``:
    False for the unnormalised model.

    ``copies`` (default ``k``): the m-fold reduced grid ``[0, 2 pi / m)`` with ``cells``
    cells per period (``1``: the whole circle, ``cells`` in all). The run lasts
    ``T = span / lambda_k``, cut so that the fastest other mode of the grid grows by at most
    ``e^noise_span`` from round-off (the state stays linear); the step is
    ``step / lambda`` for the fastest mode on the grid (SSP-RK3's rate error is
    ``(lambda dt)^3 / 24``). Returns the measured and the formula's rate and the run's
    numbers.
    """
    from tpde.grid.circle import circle_grid, mode_amplitude, uniform_modes
    from tpde.schemes.solver import Problem, Scheme, Solver
    from tpde.variants.spherical import CircleAttention, circle_head

    copies = int(k) if copies is None else int(copies)
    grid = circle_grid(cells, copies)
    nyquist = copies * (cells // 2 - 1)
    if k > nyquist:
        raise ValueError(f"mode {k} is beyond the grid's resolved modes (<= {nyquist})")
    rate = noisy_rate(k, beta, noise, 2, normalised)
    others = _fastest_in(copies, beta, nyquist, k, noise, normalised)
    t_end = span / abs(rate)
    if others > 0:
        t_end = min(t_end, noise_span / others)
    # the transport's own rate sets the step (SSP-RK3's rate error), not the net rate
    dt = step / max(abs(rate), others, linear_rate(k, beta, 2, normalised))
    density = uniform_modes(grid, [(k, amplitude, 0.0)])
    problem = Problem(
        grid,
        density,
        CircleAttention(circle_head(beta), normalised=normalised, engine="fft"),
        t_end,
        scheme=Scheme(reconstruction=reconstruction, dt_max=dt),
        snapshots=snapshots,
        noise=noise,
    )
    result = Solver(problem).run()
    amplitudes = [mode_amplitude(s.density, grid, k) for s in result.snapshots]
    masses = [s.mass for s in result.snapshots]
    return _run_record(
        "k",
        k,
        beta,
        rate,
        result.times,
        amplitudes,
        t_end,
        result.steps,
        masses,
        cells=int(cells),
        copies=copies,
    )


def circle_token_rate(
    k: int,
    beta: float,
    n: int = 10_000,
    amplitude: float = 1e-6,
    span: float = 1.0,
    noise_span: float = 20.0,
    step: float = 0.1,
    snapshots: int = 11,
) -> dict:
    """The growth rate of mode ``k`` measured with ``n`` quasi-uniform tokens: the
    mid-quantiles of ``(1 + amplitude cos(k theta)) / (2 pi)`` (no sampling noise below mode
    ``n``), RK4 in the angles with ``dt = step / lambda`` of the fastest mode, for
    ``T = span / lambda_k`` cut at ``noise_span / lambda_max`` (round-off grows in every
    mode, as on the whole-circle grid)."""
    from tpde.variants.spherical import circle_head

    from .sphere_tokens import CircleTokens, mode_tokens, token_modes

    rate = linear_rate(k, beta)
    fastest = max(linear_rate(j, beta) for j in range(1, n // 2))
    t_end = min(span / rate, noise_span / fastest)
    times = np.linspace(0.0, t_end, snapshots)
    tokens = CircleTokens(mode_tokens(n, k, amplitude), circle_head(beta))
    angles = tokens.integrate(times, step / fastest)
    amplitudes = np.abs(token_modes(angles, None, k)[:, k])
    measured = fit_rate(times, amplitudes)
    return _record(
        "k",
        k,
        beta,
        rate,
        measured,
        t_end=float(t_end),
        growth=float(amplitudes[-1] / amplitudes[0]),
    )


def circle_sampled_token_rates(
    beta: float,
    ks: list[int] | range,
    n: int = 10_000,
    seed: int = 0,
    span: float = 2.0,
    step: float = 0.1,
    snapshots: int = 11,
) -> list[dict]:
    """The growth rates of the modes ``ks`` fitted from ONE run of ``n`` i.i.d. uniform
    tokens over ``T = span / lambda_max``: every mode starts at the sampling noise,
    ``|c_k| ~ n^{-1/2}``, instead of a chosen amplitude (what a particle simulation of the
    instability measures)."""
    from tpde.variants.spherical import circle_head

    from .sphere_tokens import CircleTokens, token_modes

    fastest = max(linear_rate(j, beta) for j in range(1, 200))
    times = np.linspace(0.0, span / fastest, snapshots)
    rng = np.random.default_rng(seed)
    tokens = CircleTokens(rng.uniform(0.0, 2.0 * np.pi, n), circle_head(beta))
    angles = tokens.integrate(times, step / fastest)
    modes = np.abs(token_modes(angles, None, max(ks)))
    rows = []
    for k in ks:
        rate = linear_rate(k, beta)
        measured = fit_rate(times, modes[:, k])
        rows.append(_record("k", k, beta, rate, measured, initial=float(modes[0, k])))
    return rows


# ---- the cubed sphere ------------------------------------------------------------------------
def cubed_sphere_rate(
    l: int, beta: float, n: int = 12, nodes: int = 3, eps: float = 1e-3, normalised: bool = True
) -> dict:
    """The growth rate of the zonal harmonic ``P_l(z)`` under the semi-discrete finite-volume
    operator of the cubed sphere (:mod:`tpde.schemes.cubed_sphere`, attention ``A = beta I``,
    ``V = I``): ``<P_l, dL> / <P_l, P>`` with ``P`` the cell averages of ``P_l / 4 pi`` and
    ``dL = (L(u + eps P) - L(u - eps P)) / (2 eps)`` (``u`` uniform; the symmetric difference
    cancels the quadratic term and the uniform measure's own field). This is the slope at
    ``t = 0`` of the fitted amplitude: unlike a fit over a long span it is not swamped by the
    grid's coupling of ``P_l`` to faster modes (docs/theory.md, 'The cubed sphere').
    ``normalised = False``: the unnormalised model (rate :func:`linear_rate` likewise)."""
    from tpde.grid import cubed_sphere as cs
    from tpde.schemes.cubed_sphere import CubedSphereOperator
    from tpde.variants.cubed_sphere import CubedSphereAttention

    grid = cs.cubed_sphere(n)
    operator = CubedSphereOperator(grid)
    field = CubedSphereAttention(beta, nodes, cache_entries=50_000_000, normalised=normalised)
    uniform = np.full(grid.shape, 1.0 / (4.0 * np.pi))
    mode = cs.harmonic_mode(grid, l, 1.0) - uniform

    def derivative(density):
        return operator.derivative(density, operator.node_speeds(field, density, 0.0))

    change = (derivative(uniform + eps * mode) - derivative(uniform - eps * mode)) / (2 * eps)
    measured = cs.legendre_moment(grid, change, l) / cs.legendre_moment(grid, mode, l)
    rate = linear_rate(l, beta, 3, normalised)
    return _record("l", l, beta, rate, float(measured), mass_change=abs(grid.integrate(change)))


def cubed_sphere_fitted_rate(
    l: int,
    beta: float,
    n: int = 8,
    amplitude: float = 1e-6,
    span: float = 1.0,
    noise_span: float = 20.0,
    step: float = 0.2,
    snapshots: int = 11,
    velocity_at: str = "nodes",
) -> dict:
    """Seed ``P_l(z)`` at ``amplitude`` on the uniform measure, run the cubed-sphere solver
    (SSP-RK3, positivity limiter; the velocity at ``velocity_at``) to ``T = min(span /
    lambda_l, noise_span / lambda_max)`` with ``dt = step / lambda_max`` and fit the growth
    rate of the projected amplitude. Where
    ``lambda_l`` is far below ``lambda_max`` the grid's coupling of ``P_l`` to faster modes,
    grown over ``T``, swamps the projection (docs/theory.md, 'The cubed sphere')."""
    from tpde.grid import cubed_sphere as cs
    from tpde.schemes.cubed_sphere import solve
    from tpde.variants.cubed_sphere import CubedSphereAttention

    grid = cs.cubed_sphere(n)
    rate = linear_rate(l, beta, 3)
    fastest = max(linear_rate(j, beta, 3) for j in range(1, 4 * n + 1))
    t_end = min(span / rate, noise_span / fastest)
    result = solve(
        grid,
        cs.harmonic_mode(grid, l, amplitude),
        CubedSphereAttention(beta, 4, cache_entries=20_000_000),
        t_end,
        dt_max=step / fastest,
        snapshots=snapshots,
        velocity_at=velocity_at,
    )
    amplitudes = [cs.zonal_projection(grid, d, l) for d in result.densities]
    return _run_record(
        "l", l, beta, rate, result.times, amplitudes, t_end, result.steps, result.masses
    )


# ---- tokens on S^2 ---------------------------------------------------------------------------
def sphere_token_slope(l: int, beta: float, n: int = 10_000, eps: float = 1e-3) -> dict:
    """The growth rate of ``P_l(z)`` for ``n`` quasi-uniform tokens at ``t = 0``: the Fibonacci
    lattice pushed onto ``(1 +- eps P_l(z)) / (4 pi)``
    (:func:`tpde.validation.s2_tokens.zonal_mode_tokens`), the moment
    ``M = sum_j P_l(z_j) / n`` and its derivative ``D = sum_j P_l'(z_j) z_j' / n`` from the
    token velocities (``A = beta I``, ``V = I``), ``(D_+ - D_-) / (M_+ - M_-)``: the symmetric
    difference cancels the lattice's own field to first order, as
    :func:`cubed_sphere_rate` does on the grid."""
    from .s2_tokens import sphere_token_velocity, zonal_mode_tokens

    rate = linear_rate(l, beta, 3)
    moments, derivatives = [], []
    for sign in (1.0, -1.0):
        x = zonal_mode_tokens(n, [(l, sign * eps)])
        z = x[:, 2]
        v = sphere_token_velocity(x, np.full(n, 1.0 / n), beta * np.eye(3), np.eye(3))
        p = eval_legendre(l, z)
        dp = l * (z * p - eval_legendre(l - 1, z)) / (z * z - 1.0)
        moments.append(float(np.mean(p)))
        derivatives.append(float(np.mean(dp * v[:, 2])))
    measured = (derivatives[0] - derivatives[1]) / (moments[0] - moments[1])
    return _record("l", l, beta, rate, measured)


def sphere_token_rates(
    beta: float,
    ls=range(1, 9),
    n: int = 10_000,
    amplitude: float = 1e-3,
    seed: int | None = None,
    span: float = 2.0,
    step: float = 0.2,
    snapshots: int = 6,
) -> list[dict]:
    """The growth rates of the degrees ``ls`` fitted from ONE run of ``n`` tokens (CF4,
    ``A = beta I``, ``V = I``) over ``T = span / lambda_max`` (``lambda_max`` over the degrees
    below ``sqrt(n)``), ``dt = step / lambda_max``: the degree amplitudes ``A_l``
    (:func:`tpde.validation.s2_tokens.token_amplitudes`) at ``snapshots`` times, the slope of
    ``log A_l``. ``seed = None``: the Fibonacci lattice carrying ``amplitude P_l(z)`` for every
    ``l`` at once (quasi-uniform tokens); a seed: ``n`` i.i.d. uniform tokens with the same
    modes, which the sampling noise ``A_l ~ (2 l + 1) / sqrt(n)`` buries (what a particle
    simulation measures). Slow degrees (``lambda_l T`` small) are measured poorly by design:
    the table shows where."""
    from .s2_tokens import SphereTokens, token_amplitudes, zonal_mode_tokens

    ls = [int(l) for l in ls]
    fastest = max(linear_rate(j, beta, 3) for j in range(1, max(2, math.isqrt(n)) + 1))
    times = np.linspace(0.0, span / fastest, int(snapshots))
    x0 = zonal_mode_tokens(n, [(l, amplitude) for l in ls], seed)
    path = SphereTokens(x0, beta * np.eye(3)).integrate(times, step / fastest)
    amplitudes = token_amplitudes(path, max(ls))
    rows = []
    for l in ls:
        rate = linear_rate(l, beta, 3)
        measured = fit_rate(times, amplitudes[:, l])
        initial, growth = float(amplitudes[0, l]), float(amplitudes[-1, l] / amplitudes[0, l])
        rows.append(_record("l", l, beta, rate, measured, initial=initial, growth=growth))
    return rows
