"""Cells plus atoms on the circle against mid-quantile tokens: merges and the energy staircase
(docs/theory.md, 'Atoms: cells where the law is spread, points where it has concentrated')."""

from __future__ import annotations

import numpy as np
import pytest

from tpde.validation.circle_atoms import atoms_against_tokens, plateau_gaps

BETA = 9.0
MODES = [(3, 0.1, 0.0), (4, 0.1, 1.0), (5, 0.1, 2.0)]


def table(study: dict, cells, every: int) -> str:
    keys = ["mid"] + [str(c) for c in cells]
    lines = [
        "| t | "
        + " | ".join(f"clusters {k}" for k in keys)
        + " | "
        + " | ".join(f"E {k}" for k in keys)
        + " |",
        "|" + "---|" * (1 + 2 * len(keys)),
    ]
    for i in range(0, len(study["times"]), every):
        counts = " | ".join(str(study[f"clusters {k}"][i]) for k in keys)
        energies = " | ".join(f"{study[f'E {k}'][i]:.6f}" for k in keys)
        lines.append(f"| {study['times'][i]:g} | {counts} | {energies} |")
    return "\n".join(lines)


def check_mass(study: dict, cells) -> float:
    worst = 0.0
    for c in cells:
        result = study["results"][c]
        worst = max(worst, max(abs(s.mass - result.snapshots[0].mass) for s in result.snapshots))
    return worst


def test_two_clusters_merge_with_the_tokens():
    """Two narrow von Mises clusters (kappa = 200, masses 0.5 and 0.4, 0.7 apart) over a wide
    one (0.1): 256 cells with atoms against 1000 mid-quantile tokens to t = 5. The narrow ones
    become atoms at t ~ 0.7 and merge at the tokens' time (3.6 against 3.7: the counting
    histogram is 0.1 apart in time); mass to 1e-13."""
    components = [(0.5, 1.0, 200.0), (0.4, 1.7, 200.0), (0.1, 4.0, 2.0)]
    study = atoms_against_tokens(BETA, 5.0, (256,), 1000, components=components, spacing=0.1)
    print("\n" + table(study, (256,), 5))
    print("merges: tokens", study["merges mid"], "cells + atoms", study["merges 256"])
    result = study["results"][256]
    for event in result.events:
        if event.kind.startswith("atom"):
            print(f"t = {event.time:.3f}: {event.message}")
    mass = check_mass(study, (256,))
    print(f"mass change {mass:.1e}")
    assert mass < 1e-13
    assert len(study["merges mid"]) == len(study["merges 256"]) == 1
    assert study["merges 256"][0] == pytest.approx(study["merges mid"][0], rel=0.05)
    gaps = np.abs(np.array(study["E 256"]) - np.array(study["E mid"]))
    print(f"largest energy gap {gaps.max():.2e} (units of a point mass's)")
    assert gaps.max() < 5e-4
    kinds = [e.kind for e in result.events]
    assert kinds.count("atom_birth") == 2  # (the atoms themselves merge at t ~ 5.2)


@pytest.mark.slow
def test_metastability_with_atoms_against_tokens():
    """The metastability case (A = 9 I, modes 3, 4, 5 at 0.1) to t = 40: 512 and 256 cells with
    atoms against 10^4 mid-quantile tokens, snapshots every 0.1. Done when: the merge time
    within 5 % (512 cells) and 10 % (256) of the tokens', every plateau of the energy (t in
    [10, 20] with four clusters, [30, 40] with three) within 1e-4 of a point mass's, mass to
    1e-13."""
    cells = (512, 256)
    study = atoms_against_tokens(BETA, 40.0, cells, 10_000, modes=MODES, spacing=0.1)
    print("\n" + table(study, cells, 20))
    merges = {k: study[f"merges {k}"] for k in ["mid"] + [str(c) for c in cells]}
    print("merge times:", merges)
    print("| cells | plateau | largest energy gap |\n|---|---|---|")
    gaps = {}
    for c in cells:
        gaps[c] = plateau_gaps(
            study["times"], study[f"E {c}"], study["E mid"], [(10, 20), (30, 40)]
        )
        for t0, t1, gap in gaps[c]:
            print(f"| {c} | [{t0:g}, {t1:g}] | {gap:.2e} |")
    for c in cells:
        result = study["results"][c]
        print(f"{c} cells: {result.steps} steps, {result.wall_time:.1f} s")
    mass = check_mass(study, cells)
    print(f"mass change {mass:.1e}")
    assert mass < 1e-13
    assert len(merges["mid"]) == len(merges["512"]) == len(merges["256"]) == 1
    assert merges["512"][0] == pytest.approx(merges["mid"][0], rel=0.05)
    assert merges["256"][0] == pytest.approx(merges["mid"][0], rel=0.10)
    for c in cells:
        assert all(gap < 1e-4 for _, _, gap in gaps[c])
