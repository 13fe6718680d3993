"""Strong-stability-preserving Runge-Kutta methods as Shu-Osher coefficient tables.

Stage ``i`` (1-based, ``u^(0) = u^n``, ``u^(s) = u^{n+1}``) is

    u^(i) = sum_k alpha[i-1][k] * u^(k) + beta[i-1][k] * dt * L(u^(k)),

a convex combination of forward-Euler steps of size ``(beta / alpha) dt``: if forward Euler
keeps the density >= 0 for ``dt <= dt_FE``, the method does for ``dt <= c * dt_FE`` with the
SSP coefficient ``c = min(alpha / beta)``.
Reference: S. Gottlieb, C.-W. Shu, E. Tadmor, SIAM Review 43 (2001) 89.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SSPRK:
    name: str
    alpha: tuple[tuple[float, ...], ...]
    beta: tuple[tuple[float, ...], ...]
    order: int

    @property
    def stages(self) -> int:
        return len(self.alpha)

    @property
    def ssp_coefficient(self) -> float:
        ratios = [
            a / b
            for ra, rb in zip(self.alpha, self.beta, strict=True)
            for a, b in zip(ra, rb, strict=True)
            if b > 0
        ]
        return float(min(ratios))

    @property
    def stage_times(self) -> np.ndarray:
        """c_k: time of stage state u^(k) as a fraction of dt (k = 0 .. s-1)."""
        c = [0.0]
        for i in range(self.stages - 1):
            c.append(
                sum(
                    a * c[k] + b
                    for k, (a, b) in enumerate(zip(self.alpha[i], self.beta[i], strict=True))
                )
            )
        return np.array(c)


INTEGRATORS: dict[str, SSPRK] = {
    "ssprk1": SSPRK("ssprk1", ((1.0,),), ((1.0,),), 1),
    "ssprk2": SSPRK("ssprk2", ((1.0,), (0.5, 0.5)), ((1.0,), (0.0, 0.5)), 2),
    # the third stage's weights as floats whose exact sum is 1: fl(1/3) + fl(2/3) is
    # 1 - 2^-54, which took 5.6e-17 of the mass at every step (2.4e-13 over 4000 steps);
    # 1 - fl(2/3) is one ulp above fl(1/3) and exact
    "ssprk3": SSPRK(
        "ssprk3",
        ((1.0,), (0.75, 0.25), (1.0 - 2.0 / 3.0, 0.0, 2.0 / 3.0)),
        ((1.0,), (0.0, 0.25), (0.0, 0.0, 2.0 / 3.0)),
        3,
    ),
}
INTEGRATORS["euler"] = INTEGRATORS["ssprk1"]


def get_integrator(name: str) -> SSPRK:
    key = str(name).lower()
    if key not in INTEGRATORS:
        raise ValueError(
            f"scheme.integrator: unknown {name!r}; choose one of {', '.join(sorted(INTEGRATORS))}"
        )
    return INTEGRATORS[key]
