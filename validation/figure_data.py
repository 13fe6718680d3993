"""What the figures draw, computed from plain arrays: cell volumes, per-slice mass and mean,
reference moments in time, Gaussian level sets (whole, on a plane, conditional), covariance
eigenvalues, marginal projections, snapshot matching, round-off bounds, relative changes.

tpde.plots, tpde.circle_plots and tpde.sphere_plots read a dataset and draw; the numbers
they draw come from here (no xarray, no matplotlib), so each is tested against a closed form
(tests/test_figure_data.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "ROUNDOFF",
    "cell_volumes",
    "common_times",
    "conditional_gaussian",
    "eigenvalues",
    "ellipse",
    "gaussian_pdf",
    "interpolate_moments",
    "max_index",
    "pick_snapshots",
    "plane_slice",
    "projections",
    "reference_moments",
    "relative_change",
    "roundoff_bound",
    "shared_snapshots",
    "slice_statistics",
    "snapshot_at",
    "snapshot_at_or_before",
    "top_value",
    "xy_marginal",
]

#: a record whose largest |value| is at most this times its scale is zero to round-off
ROUNDOFF = 1e-10
#: the three coordinate planes of a 3-D density: (x, y), (x, z), (y, z)
PLANES = ((0, 1), (0, 2), (1, 2))


def cell_volumes(edges: Sequence[np.ndarray]) -> np.ndarray:
    """Volumes (n_x, n_y, ...) of a tensor grid's cells: the outer product of the edge
    differences ``prod_a (e_a[i_a + 1] - e_a[i_a])``."""
    widths = np.diff(np.asarray(edges[0], float))
    for e in edges[1:]:
        widths = np.multiply.outer(widths, np.diff(np.asarray(e, float)))
    return widths


def slice_statistics(
    density: np.ndarray, volumes: np.ndarray, centres: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Mass (S,) and mean (S, d) of each position slice of ``density`` (S, n_x, ...):
    ``m_s = sum_c rho_s(c) |c|``, ``mu_s = sum_c rho_s(c) |c| x_c / m_s`` (x_c the cell
    centres); the mean is NaN where a slice holds no positive mass."""
    cells = density * volumes
    count = cells.shape[0]
    mass = cells.reshape(count, -1).sum(axis=1)
    mesh = np.meshgrid(*centres, indexing="ij")
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.stack([(cells * x).reshape(count, -1).sum(axis=1) / mass for x in mesh], axis=1)
    mean[~(mass > 0)] = np.nan
    return mass, mean


def pick_snapshots(times: np.ndarray, wanted: Sequence[float] | None, default: int) -> list[int]:
    """Snapshot indices: up to ``default`` evenly spaced ones (first and last included), or
    the nearest snapshot to each wanted time. ValueError (``plot: ...``) for no snapshot or
    no wanted time."""
    n = times.size
    if n == 0:
        raise ValueError("plot: the dataset has no snapshots (time has length 0)")
    if wanted is None:
        k = min(default, n)
        return sorted({int(round(i)) for i in np.linspace(0, n - 1, k)})
    targets = np.atleast_1d(np.asarray(wanted, dtype=float))
    if targets.size == 0:
        raise ValueError("plot: times is empty; give at least one time or None")
    return [int(np.nanargmin(np.abs(times - t))) for t in targets]


def reference_moments(reference: Mapping[str, Any] | None, d: int) -> dict[str, np.ndarray] | None:
    """Reference moments as arrays ``time`` (m,), ``mean`` (m, d), ``cov`` (m, d, d), sorted
    in time, from a mapping with ``time``, ``mean`` (or ``mean_position``, a reference
    dataset's name) and ``covariance``; None for None. ValueError (``plot: ...``) for a
    missing array or shapes that do not match ``d``."""
    if reference is None:
        return None
    if "mean" not in reference and "mean_position" in reference:  # a reference Dataset
        reference = {
            **{k: reference[k] for k in ("time", "covariance") if k in reference},
            "mean": reference["mean_position"],
        }
    missing = [key for key in ("time", "mean", "covariance") if key not in reference]
    if missing:
        raise ValueError(
            f"plot: reference needs arrays time, mean, covariance; missing {', '.join(missing)}"
        )
    time = np.atleast_1d(np.asarray(reference["time"], dtype=float))
    mean = np.asarray(reference["mean"], dtype=float).reshape(time.size, -1)
    cov = np.asarray(reference["covariance"], dtype=float)
    if mean.shape[1] != d or cov.shape != (time.size, d, d):
        raise ValueError(
            f"plot: reference shapes mean {mean.shape}, covariance {cov.shape} do "
            f"not match {time.size} times in d = {d}"
        )
    order = np.argsort(time)
    return {"time": time[order], "mean": mean[order], "cov": cov[order]}


def interpolate_moments(
    ref: Mapping[str, np.ndarray], t: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean (d,) and symmetrised covariance (d, d) of :func:`reference_moments` at time ``t``,
    linear in time between the reference's times; None outside them (to a relative slack of
    1e-9): a reference that blew up is not drawn after it did."""
    rt = ref["time"]
    slack = 1e-9 * max(1.0, abs(float(rt[-1])))
    if not rt[0] - slack <= t <= rt[-1] + slack:
        return None  # the reference stopped (a blow-up) or starts later: nothing to draw
    mean = np.array([np.interp(t, rt, ref["mean"][:, i]) for i in range(ref["mean"].shape[1])])
    d = mean.size
    cov = np.array([[np.interp(t, rt, ref["cov"][:, i, j]) for j in range(d)] for i in range(d)])
    return mean, 0.5 * (cov + cov.T)


def roundoff_bound(values: np.ndarray, scale: float, tolerance: float = ROUNDOFF) -> float | None:
    """The largest finite ``|values|`` when it is at most ``tolerance * |scale|`` (the record
    is zero to round-off), else None (also for a record with no finite value or a scale that
    is not finite)."""
    v = np.asarray(values, float)
    finite = v[np.isfinite(v)]
    if finite.size == 0 or not np.isfinite(scale):
        return None
    top = float(np.max(np.abs(finite)))
    return top if top <= tolerance * abs(scale) else None


def ellipse(mean: np.ndarray, cov: np.ndarray, radius: float, points: int = 200) -> np.ndarray:
    """Points (2, points) of the ellipse ``(x - m)^T cov^-1 (x - m) = radius^2``:
    ``m + radius V diag(sqrt(lambda)) (cos a, sin a)`` with ``cov = V diag(lambda) V^T``."""
    angle = np.linspace(0.0, 2.0 * np.pi, points)
    values, vectors = np.linalg.eigh(cov)
    circle = np.stack([np.cos(angle), np.sin(angle)])
    return mean[:, None] + radius * vectors @ (np.sqrt(np.clip(values, 0, None))[:, None] * circle)


def conditional_gaussian(
    mean: np.ndarray, cov: np.ndarray, plane: tuple[int, int], fixed: int, value: float
) -> tuple[np.ndarray, np.ndarray]:
    """Mean (2,) and covariance (2, 2) whose ellipses are the level sets of N(mean, cov) on
    the plane ``x[fixed] = value``: the conditional law of the two coordinates ``plane``,
    ``mu_p + S_pc (value - mu_c) / S_cc`` and the Schur complement
    ``S_pp - S_pc S_pc^T / S_cc`` (the marginal block where ``S_cc <= 0``)."""
    p = list(plane)
    s_pc = cov[p, fixed]
    s_cc = cov[fixed, fixed]
    if s_cc <= 0:
        return mean[p], cov[np.ix_(p, p)]
    cond_mean = mean[p] + s_pc * (value - mean[fixed]) / s_cc
    cond_cov = cov[np.ix_(p, p)] - np.outer(s_pc, s_pc) / s_cc
    return cond_mean, cond_cov


def gaussian_pdf(x: np.ndarray, mean: float, variance: float, mass: float = 1.0) -> np.ndarray:
    """``mass exp(-(x - m)^2 / (2 v)) / sqrt(2 pi v)``, the variance floored at 1e-300 (a
    collapsed reference is drawn as a spike, not a division by zero)."""
    var = max(float(variance), 1e-300)
    return mass * np.exp(-0.5 * (x - mean) ** 2 / var) / np.sqrt(2 * np.pi * var)


def eigenvalues(cov: np.ndarray) -> np.ndarray:
    """Ascending eigenvalues (m, d) of each symmetrised matrix of ``cov`` (m, d, d); a row of
    NaN where the matrix is not finite."""
    out = np.full(cov.shape[:2], np.nan)
    ok = np.isfinite(cov).all(axis=(1, 2))
    if ok.any():
        sym = 0.5 * (cov[ok] + np.swapaxes(cov[ok], 1, 2))
        out[ok] = np.linalg.eigvalsh(sym)
    return out


def top_value(values: Iterable[np.ndarray]) -> float:
    """The largest finite value of the arrays (1 when there is none or it is not positive):
    the top of a shared colour scale."""
    top = max((float(np.nanmax(v)) for v in values if np.isfinite(v).any()), default=1.0)
    return top if top > 0 else 1.0


def max_index(rho: np.ndarray) -> tuple[int, ...]:
    """Index of the maximum of ``rho`` ignoring NaN (the middle cell when all is NaN)."""
    if not np.isfinite(rho).any():
        return tuple(n // 2 for n in rho.shape)
    return tuple(int(i) for i in np.unravel_index(np.nanargmax(rho), rho.shape))


def plane_slice(rho: np.ndarray, plane: tuple[int, int], at: tuple[int, ...]) -> np.ndarray:
    """The 2-D slice of a 3-D ``rho`` on ``plane`` through the cell ``at``."""
    fixed = 3 - sum(plane)
    index: list[Any] = [slice(None)] * 3
    index[fixed] = at[fixed]
    return rho[tuple(index)]


def projections(rho: np.ndarray, widths: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The marginals of a 3-D density on the (x, y), (x, z), (y, z) planes: the NaN-ignoring
    sum along the third axis times its cell widths (each integrates to the mass)."""
    shape = [(-1, 1, 1), (1, -1, 1), (1, 1, -1)]
    out = []
    for a, b in PLANES:
        fixed = 3 - a - b
        out.append(np.nansum(rho * widths[fixed].reshape(shape[fixed]), axis=fixed))
    return out


def xy_marginal(rho: np.ndarray, dz: np.ndarray) -> np.ndarray:
    """The x-y marginal of a 3-D density: ``sum_k rho[..., k] dz_k`` ignoring NaN."""
    return np.nansum(rho * dz.reshape(1, 1, -1), axis=2)


def snapshot_at(times: np.ndarray, t: float) -> int | None:
    """The index of ``times`` at ``t`` (within 1e-9 relative), None if there is none."""
    if times.size == 0:
        return None
    i = int(np.argmin(np.abs(times - t)))
    return i if abs(times[i] - t) <= 1e-9 * max(1.0, abs(t)) else None


def snapshot_at_or_before(times: np.ndarray, t: float) -> int | None:
    """:func:`snapshot_at`; else, for records that go on past ``t``, the last one before it
    (a run that stopped between a reference's snapshot times is drawn beside its latest
    earlier one). None for records that ended before ``t`` (an ODE past its blow-up)."""
    exact = snapshot_at(times, t)
    if exact is not None:
        return exact
    earlier = np.flatnonzero(times < t)
    return int(earlier[-1]) if earlier.size and times.max() > t else None


def shared_snapshots(first: np.ndarray, second: np.ndarray, count: int) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)`` with ``first[i] == second[j]`` (:func:`snapshot_at`), thinned to
    at most ``count`` evenly spaced ones (the first and the last shared time included)."""
    common = [(i, j) for i, tv in enumerate(first) if (j := snapshot_at(second, tv)) is not None]
    if not common:
        return []
    picks = sorted(
        {int(round(k)) for k in np.linspace(0, len(common) - 1, min(count, len(common)))}
    )
    return [common[k] for k in picks]


def common_times(
    times: np.ndarray, others: Sequence[np.ndarray]
) -> tuple[list[float], list[int], list[list[int]]]:
    """The times of ``times`` that every array of ``others`` holds (``numpy.isclose``, its
    default tolerances; all of ``times`` when there are no others), the index of each in
    ``times`` and, per other array, in it (the first close one)."""
    common = [float(x) for x in times if all(np.isclose(o, x).any() for o in others)]
    at = [int(np.flatnonzero(np.isclose(times, x))[0]) for x in common]
    picks = [[int(np.flatnonzero(np.isclose(o, x))[0]) for x in common] for o in others]
    return common, at, picks


def relative_change(values: np.ndarray) -> tuple[np.ndarray, str]:
    """``(E(t) - E(0)) / |E(0)|`` of a record (E(0) its first finite value) and a note: ""
    for a relative change, " (constant to round-off)" when the change is within
    :data:`ROUNDOFF` (then exactly 0 where finite), " (absolute)" (``E`` itself) when E(0) is
    0 or there is no finite value."""
    values = np.asarray(values, float)
    first = values[np.isfinite(values)][:1]
    start = float(first[0]) if first.size else np.nan
    if not (np.isfinite(start) and start != 0.0):
        return values, " (absolute)"
    values = (values - start) / abs(start)
    if roundoff_bound(values, 1.0) is not None:  # constant: its round-off is not drawn
        return np.where(np.isfinite(values), 0.0, np.nan), " (constant to round-off)"
    return values, ""
