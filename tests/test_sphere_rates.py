"""The linear rates of attention on the sphere, checked by quadrature before anything relies on
them (docs/theory.md, 'Attention dynamics on the sphere')."""

from __future__ import annotations

import math

import pytest

from tpde.validation.sphere_rates import (
    fastest_mode,
    fit_rate,
    funk_hecke,
    funk_hecke_quadrature,
    linear_rate,
    rate_by_quadrature,
)

BETAS = (1.0, 4.0, 16.0, 64.0)
DEGREES = (1, 2, 3, 5, 8, 13, 20)


def measurable(l: int, beta: float, d: int) -> bool:
    """Where the rate stands above the quadratures' round-off (about 1e-16 lambda_max)."""
    return linear_rate(l, beta, d) > 1e-10 * linear_rate(fastest_mode(beta, d), beta, d)


@pytest.mark.parametrize("d", [2, 3])
def test_funk_hecke_closed_form_matches_the_integral(d):
    # the quadrature sums terms up to kappa_0: its round-off is absolute, ~1e-16 kappa_0
    worst = 0.0
    for beta in BETAS:
        for l in (0,) + DEGREES:
            gap = abs(funk_hecke_quadrature(l, beta, d) - funk_hecke(l, beta, d))
            worst = max(worst, gap / funk_hecke(0, beta, d))
    print(f"\nS^{d - 1}: Funk-Hecke, closed form vs quadrature: max gap / kappa_0 {worst:.1e}")
    assert worst < (1e-14 if d == 2 else 3e-13)


def test_circle_and_sphere_special_cases():
    # S^1: kappa_k = I_k(beta); S^2: kappa_l = sqrt(pi / (2 beta)) I_{l+1/2}(beta)
    from scipy.special import iv

    assert funk_hecke(3, 2.5, 2) == pytest.approx(iv(3, 2.5), rel=1e-14)
    assert funk_hecke(3, 2.5, 3) == pytest.approx(
        math.sqrt(math.pi / 5.0) * iv(3.5, 2.5), rel=1e-14
    )
    assert linear_rate(2, 3.0, 2) == pytest.approx(4 * iv(2, 3.0) / (3.0 * iv(0, 3.0)), rel=1e-14)
    assert linear_rate(2, 3.0, 3) == pytest.approx(
        6 * iv(2.5, 3.0) / (3.0 * iv(0.5, 3.0)), rel=1e-14
    )
    assert linear_rate(2, 3.0, 2, normalised=False) == pytest.approx(
        4 * iv(2, 3.0) / 3.0, rel=1e-14
    )


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("normalised", [True, False])
def test_rate_from_the_field_matches_the_formula(d, normalised):
    rows = []
    for beta in BETAS:
        for l in DEGREES:
            if not measurable(l, beta, d):
                continue
            formula = linear_rate(l, beta, d, normalised)
            linear = rate_by_quadrature(l, beta, d, normalised=normalised)
            rows.append((beta, l, formula, abs(linear / formula - 1.0)))
    print(f"\nS^{d - 1} ({'normalised' if normalised else 'unnormalised'}): beta l formula gap")
    for beta, l, formula, gap in rows:
        print(f"  {beta:4g} {l:3d} {formula:.10e} {gap:.1e}")
    assert max(gap for *_, gap in rows) < 1e-11


@pytest.mark.parametrize("d", [2, 3])
def test_nonlinear_field_at_small_amplitude(d):
    # S^1: cos^2 has no cos(k theta) part, the gap is O(eps^2) + round-off / eps; S^2: O(eps)
    worst = 0.0
    for beta in BETAS:
        fastest = linear_rate(fastest_mode(beta, d), beta, d)
        for l in (1, 2, 5, 8):
            rate = rate_by_quadrature(l, beta, d, eps=1e-6)
            worst = max(worst, abs(rate - linear_rate(l, beta, d)) / fastest)
    print(f"\nS^{d - 1}: nonlinear field at eps = 1e-6: max gap / lambda_max {worst:.1e}")
    assert worst < (1e-9 if d == 2 else 1e-6)


def test_fastest_mode_is_about_sqrt_two_beta():
    for beta in (8.0, 32.0, 64.0, 100.0):
        assert abs(fastest_mode(beta) - math.sqrt(2.0 * beta)) <= 0.6
    assert fastest_mode(16.0) == 6 and fastest_mode(4.0) == 3
    assert linear_rate(fastest_mode(100.0), 100.0) == pytest.approx(2.0 / math.e, abs=5e-3)


def test_fit_rate_recovers_an_exponential():
    import numpy as np

    t = np.linspace(0.0, 3.0, 7)
    assert fit_rate(t, 1e-8 * np.exp(0.37 * t)) == pytest.approx(0.37, rel=1e-12)
    with pytest.raises(ValueError, match="rates.beta"):
        linear_rate(1, -1.0)
    with pytest.raises(ValueError, match="rates.l"):
        funk_hecke(1.5, 1.0)
