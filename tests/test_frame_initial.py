"""The co-moving frame accepts every initial kind (docs/theory.md, 'The co-moving affine
frame'): gaussian, mixture, uniform (box and ball), tokens and file (a fixed-box run's output
and a frame run's). References: the closed-form moments of the uniform laws, the tokens' own
mean and covariance, the file's cell averages' moments; the pushed density must hold the
whole mass with mean 0 and covariance I in frame units (to the cells' O(h^2)), and one short
run in the frame must keep the mass."""

from __future__ import annotations

import numpy as np
import pytest

from tpde import io
from tpde.config import build
from tpde.grid import moments
from tpde.schemes.solver import Solver

#: the frame's xi box: the tilted laws of a unit law need about 7 standard deviations
#: beyond the tilt (docs/theory.md, 'Blow-up and tails'), so +-10 at 40^2 (h = 0.5)
CELLS, RADIUS = 40, 10.0
H = 2 * RADIUS / CELLS
#: the fixed box the file runs are written on
FIXED_CELLS, FIXED_RADIUS = 24, 4.0


def config(initial: dict, frame: str = "affine", t_end: float = 0.02):
    radius, cells = (RADIUS, CELLS) if frame == "affine" else (FIXED_RADIUS, FIXED_CELLS)
    return {
        "grid": {"lower": [-radius] * 2, "upper": [radius] * 2, "cells": [cells] * 2},
        "initial": initial,
        "attention": {"variant": "softmax", "A": [[0.5, 0.0], [0.0, 0.3]], "V": np.eye(2).tolist()},
        "scheme": {"frame": frame, "frame_tolerance": 1e-8},
        "run": {"t_end": t_end, "snapshots": 2},
    }


def check(initial: dict, mean: np.ndarray, cov: np.ndarray, tolerance: float, source: float = 0):
    """Build the frame problem: its frame against (mean, cov) within ``tolerance`` (exact
    references: 1e-12), the pushed density's mass 1, mean 0 and covariance I to O(h^2),
    and one short run keeps the mass. The covariance bound: mass moved within a cell of
    width h changes a variance by at most h^2 / 4, for the frame's cells (h) and, from a
    file, the source's cells (``source``: their width in frame units)."""
    problem = build(config(initial)).problem
    frame = problem.frame
    assert frame is not None
    got = frame.matrix @ frame.matrix.T
    mass, xi_mean, xi_cov = moments(problem.density, problem.grid)
    print(
        f"\n{initial['kind']}: frame mean error {np.abs(frame.mean - mean).max():.2e}, "
        f"cov error {np.abs(got - cov).max():.2e}; xi mass {mass:.15f}, mean "
        f"{np.abs(xi_mean).max():.2e}, |cov - I| {np.abs(xi_cov - np.eye(2)).max():.2e} "
        f"(h^2 = {H**2:.3f})"
    )
    assert np.abs(frame.mean - mean).max() <= tolerance
    assert np.abs(got - cov).max() <= tolerance * max(1.0, np.abs(cov).max())
    assert mass == pytest.approx(1.0, abs=1e-12)
    assert np.abs(xi_mean).max() <= 0.1 * H**2
    assert np.abs(xi_cov - np.eye(2)).max() <= 0.25 * (H**2 + source**2)
    result = Solver(problem).run()
    final = result.snapshots[-1]
    print(f"   run: {result.status} at t = {result.status_time:.3g}, mass {final.mass:.15f}")
    assert result.status == "completed", result.status_message
    assert final.mass == pytest.approx(1.0, abs=1e-12)
    return problem


def test_uniform_box():
    lo, hi = np.array([-1.0, 0.5]), np.array([2.0, 1.5])
    check(
        {"kind": "uniform", "lower": lo.tolist(), "upper": hi.tolist()},
        0.5 * (lo + hi),
        np.diag((hi - lo) ** 2 / 12.0),
        1e-12,
    )


def test_uniform_ball():
    centre, r = np.array([0.3, -0.2]), 1.2
    check(
        {"kind": "uniform", "center": centre.tolist(), "radius": r},
        centre,
        r**2 / 4 * np.eye(2),
        1e-12,
    )


def test_tokens(tmp_path):
    rng = np.random.default_rng(3)
    tokens = rng.multivariate_normal([1.0, -0.5], [[0.6, 0.2], [0.2, 0.3]], size=4000)
    path = tmp_path / "tokens.npy"
    np.save(path, tokens)
    mean = tokens.mean(axis=0)
    cov = np.cov(tokens.T, bias=True)
    check({"kind": "tokens", "file": str(path)}, mean, cov, 1e-12)


def written(tmp_path, frame: str) -> tuple[str, object]:
    """A short run of a mixture (fixed box on +-4 or the frame), written to a file."""
    mixture = {
        "kind": "mixture",
        "weights": [0.6, 0.4],
        "means": [[-0.8, 0.0], [0.9, 0.4]],
        "covariances": [[[0.3, 0.0], [0.0, 0.3]], [[0.2, 0.05], [0.05, 0.25]]],
    }
    result = Solver(build(config(mixture, frame, t_end=0.05)).problem).run()
    assert result.status == "completed", result.status_message
    path = str(tmp_path / f"{frame}.nc")
    io.write(result, path)
    return path, result


def test_file_from_a_fixed_box(tmp_path):
    path, result = written(tmp_path, "fixed")
    _, mean, cov = moments(result.snapshots[-1].density, result.grid)
    # the source's cell width in frame units: h_s over the smallest standard deviation
    source = result.grid.spacing[0] / np.sqrt(np.linalg.eigvalsh(cov)[0])
    check({"kind": "file", "file": path}, mean, cov, 1e-12, source)


def test_file_from_a_frame_run(tmp_path):
    path, result = written(tmp_path, "affine")
    last = result.snapshots[-1]
    problem = build(config({"kind": "file", "file": path})).problem
    print(f"\nframe file: density {np.abs(problem.density - last.density).max():.1e} off")
    assert np.array_equal(problem.frame.mean, last.frame.mean)
    assert np.array_equal(problem.frame.matrix, last.frame.matrix)
    assert np.abs(problem.density - last.density).max() <= 1e-12 * last.density.max()


def test_a_singular_token_cloud_is_refused(tmp_path):
    from tpde.config import ConfigError

    path = tmp_path / "line.npy"
    s = np.linspace(-1, 1, 50)
    np.save(path, np.stack([s, 2 * s], axis=1))
    with pytest.raises(ConfigError, match="singular"):
        build(config({"kind": "tokens", "file": str(path)}))
