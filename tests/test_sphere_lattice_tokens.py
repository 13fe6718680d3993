"""Lattice tokens on the sphere as the reference of the atoms (docs/validation.md, 'Atoms on
the sphere'): the harmonic token sums against the dense ones, the matched weights' field
against the density's own by quadrature."""

from __future__ import annotations

import math

import numpy as np

from tpde.grid import cubed_sphere as cs
from tpde.validation.s2_tokens import sample_mixture, sphere_token_velocity
from tpde.validation.sphere_atoms import HarmonicTokens, lattice_tokens


def test_harmonic_token_velocity_matches_dense_sums():
    """2000 tokens, half in three tight clusters (kappa = 400, 2000) and half a lattice, under
    A = 16 I: the velocity by spherical harmonics equals the dense O(n^2) sums to 1e-12
    (also after a step, the positions moved, the plan and coefficients renewed)."""
    spread, _ = lattice_tokens(lambda x: 1.0 + 0.0 * x[:, 0], 1000, seed=3)
    clustered = sample_mixture(
        1000, [(0.5, [1, 0.2, 0], 400.0), (0.3, [0, 1, 1], 2000.0), (0.2, [0, 0, -1], 60.0)], 5
    )
    x = np.concatenate([spread, clustered])
    weights = np.random.default_rng(1).random(x.shape[0]) + 0.5
    tokens = HarmonicTokens(x, 16.0, weights)
    rows = []
    for step in range(2):
        harmonic = tokens.velocity(tokens.x)
        dense = sphere_token_velocity(tokens.x, tokens.weights, tokens.A, tokens.V)
        gap = float(np.abs(harmonic - dense).max())
        rows.append((step, gap, float(np.abs(dense).max()), tokens.engine.last["dense_targets"]))
        assert gap < 1e-12
        tokens.step(0.5)
    print("\n| step | max |v_harm - v_dense| | max |v| | dense targets |")
    for row in rows:
        print(f"| {row[0]} | {row[1]:.1e} | {row[2]:.3f} | {row[3]} |")


def _product_rule(heights: int = 80, azimuths: int = 160):
    z, wz = np.polynomial.legendre.leggauss(heights)
    phi = 2 * math.pi * (np.arange(azimuths) + 0.5) / azimuths
    ring = np.sqrt(1 - z**2)[:, None]
    y = np.stack([ring * np.cos(phi), ring * np.sin(phi), z[:, None] + 0 * phi], -1)
    return y.reshape(-1, 3), np.repeat(wz * 2 * math.pi / azimuths, azimuths)


def test_matched_lattice_weights_carry_the_density_field():
    """The noise law of examples/sphere/clusters_s2.toml (amplitude 1e-3, degrees <= 10) on
    6000 lattice tokens: the weights matched to degree 40 give the density's own partition
    sum_j w_j e^{beta <x, x_j>} (beta = 4, by a dense Gauss product rule: degree 22 carries it
    to 1e-14) to 1e-13 of it at 200 targets, where the plain weights density(x_j) err by
    ~1e-6: the lattice's own error in the perturbation's degrees, which the instability
    amplifies (the seeds' spread); the weights stay within 5 % of the plain ones."""
    _, density = cs.noise_function(cs.cubed_sphere(8), 1e-3, 10, 0)
    y, wy = _product_rule()
    my = wy * density(y)
    my /= my.sum()
    targets, _ = lattice_tokens(lambda x: 1.0 + 0.0 * x[:, 0], 200, seed=9)
    beta = 4.0

    def partition(points, masses):
        return np.exp(beta * (targets @ points.T - 1.0)) @ masses

    exact = partition(y, my)
    plain_x, plain_w = lattice_tokens(density, 6000, seed=2)
    x, w = lattice_tokens(density, 6000, seed=2, match=40)
    assert np.array_equal(x, plain_x)
    plain = float(np.abs(partition(x, plain_w) - exact).max() / exact.max())
    matched = float(np.abs(partition(x, w) - exact).max() / exact.max())
    change = float(np.abs(w / plain_w - 1).max())
    print(f"\nplain {plain:.1e}, matched {matched:.1e}, weight change {change:.1e}")
    assert matched < 1e-13
    assert plain > 1e3 * matched  # the correction is what makes the difference
    assert change < 5e-2 and w.min() > 0 and abs(w.sum() - 1) < 1e-13
