"""Cells plus atoms on the circle against mid-quantile tokens: merges and the energy staircase
(docs/theory.md, 'Cells plus atoms')."""

from __future__ import annotations

import numpy as np
import pytest
from exact import kill_after

from tpde.validation.circle_atoms import atoms_against_tokens, plateau_gaps, plateau_windows

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


def test_plateau_windows_cut_the_merges_out():
    """Counts 0 (forming), 3, 2, 2, 1 on t = 0..9: the plateaus of 3, 2 and 1 clusters, each
    cut by the margin; a plateau no longer than the margin is none."""
    times = np.arange(10.0)
    counts = [0, 3, 3, 3, 3, 2, 2, 2, 2, 1]
    assert plateau_windows(times, counts, 0.5) == [(1.5, 3.5), (5.5, 7.5)]
    assert plateau_windows(times, counts, 0.5, start=6.0) == [(6.5, 7.5)]
    assert plateau_windows(times, counts, 2.0) == []


@pytest.mark.slow
def test_clusters_from_noise_to_t500_against_tokens():
    """examples/sphere/clusters.toml (beta = 32, noise of amplitude 1e-4 up to k = 48, seed 0)
    at 512 cells with atoms to t = 500 against 10^4 mid-quantile tokens of the same initial
    density (RK4, dt = 0.05), snapshots every 0.5: the cluster count equal at every
    snapshot, every merge within 5 % of the tokens', every plateau of the energy within 1e-4
    of the tokens' (units of a point mass's), mass to 1e-13."""
    from tpde.grid.circle import noise_modes

    modes = noise_modes(1e-4, 48, 0)
    study = atoms_against_tokens(32.0, 500.0, (512,), 10_000, modes=modes, spacing=0.5, dt=0.05)
    times = study["times"]
    changes = [0] + [
        i for i in range(1, times.size) if study["clusters mid"][i] != study["clusters mid"][i - 1]
    ]
    print("\n" + table({**study, "times": times}, (512,), 50))
    print("count changes (tokens):", [(float(times[i]), study["clusters mid"][i]) for i in changes])
    windows = plateau_windows(times, study["clusters mid"], margin=2.0)
    gaps = plateau_gaps(times, study["E 512"], study["E mid"], windows)
    print("| plateau | clusters | largest energy gap |\n|---|---|---|")
    for t0, t1, gap in gaps:
        count = study["clusters mid"][int(np.searchsorted(times, t0))]
        print(f"| [{t0:g}, {t1:g}] | {count} | {gap:.2e} |")
    result = study["results"][512]
    births = sum(e.kind == "atom_birth" for e in result.events)
    mass = check_mass(study, (512,))
    print(
        f"merges: tokens {study['merges mid']}, cells + atoms {study['merges 512']}; "
        f"{births} atom births, {result.steps} steps; mass change {mass:.1e}; wall: tokens "
        f"{study['wall mid']:.0f} s, cells + atoms {study['wall 512']:.0f} s"
    )
    differ = [
        float(t)
        for t, a, b in zip(times, study["clusters mid"], study["clusters 512"], strict=True)
        if a != b
    ]
    assert differ == []
    assert len(study["merges 512"]) == len(study["merges mid"])
    for ours, theirs in zip(study["merges 512"], study["merges mid"], strict=True):
        assert ours == pytest.approx(theirs, rel=0.05)
    assert windows and all(gap < 1e-4 for *_, gap in gaps)
    assert mass < 1e-13


ATOMS_CONFIG = {
    "grid": {"geometry": "circle", "cells": 128},
    "initial": {
        "kind": "mixture",
        "weights": [0.5, 0.4],
        "means": [1.0, 1.7],
        "kappas": [200, 200],
    },
    "attention": {"beta": 9.0, "engine": "fft"},
    "atoms": {"width": 2.0},
    "run": {"t_end": 6.0, "snapshots": 31},
}


def test_atoms_in_the_file_resume_bit_for_bit_and_info(tmp_path, capsys):
    """``[atoms]`` on the circle: the atoms in a fill-valued ``atom`` dimension (xarray reads
    it), a run killed after 5 snapshots and resumed equals the uninterrupted one bit for bit
    (cells and atoms), ``tpde info`` lists the atoms, their births and the merge."""

    from tpde.cli import main
    from tpde.config import dumps
    from tpde.io import read

    config = tmp_path / "atoms.toml"
    config.write_text(dumps(ATOMS_CONFIG))
    full, cut = tmp_path / "full.nc", tmp_path / "cut.nc"
    assert main(["run", str(config), "-o", str(full), "--quiet"]) == 0
    kill_after(["run", str(config), "-o", str(cut)], 8)  # atoms are born by t = 1
    assert main(["run", str(config), "-o", str(cut), "--resume", "--quiet"]) == 0
    resumed, reference = read(cut), read(full)
    for name in ("density", "atom_id", "atom_mass", "atom_centre", "atom_variance", "atom_born"):
        assert np.array_equal(resumed[name].values, reference[name].values, equal_nan=True), name
    ids = reference["atom_id"].values
    counts = (ids >= 0).sum(axis=1)
    total = reference["mass"].values + np.nansum(reference["atom_mass"].values, axis=1)
    print(f"\natoms per record: {counts.tolist()}")
    print(f"mass of cells plus atoms: largest change {np.abs(total - 1).max():.1e}")
    assert np.abs(total - 1).max() < 1e-13
    assert counts.max() == 2 and counts[-1] == 1  # two born, merged into one
    assert np.isnan(reference["atom_mass"].values[-1, 1])  # an empty slot: the fill value
    capsys.readouterr()
    assert main(["info", str(cut)]) == 0
    out = capsys.readouterr().out
    print(out[:1500])
    assert "atoms at t = 6: 1" in out and "merged from atoms 0 and 1" in out
    assert "atom 0: born at t = " in out and "atom 1: born at t = " in out
    from tpde.circle_plots import space_time_figure

    figure = space_time_figure(reference)  # the atoms' tracks over the (empty) cells
    assert "(1 at t = 6)" in figure.axes[0].get_title()
    assert figure.axes[0].collections[-1].get_offsets().shape[0] == int(counts.sum())


def test_atoms_off_a_pinned_cluster_is_named():
    """Atoms off, 512 cells, the metastability case: once a collapsed cluster drifts slower
    than h / 2 the run records one ``pinned`` event naming the fix (the README's drift of
    that cluster: 5.3e-3 < h / 2 = 6.1e-3)."""
    from tpde.grid.circle import circle_grid, uniform_modes
    from tpde.schemes.solver import Problem, Scheme, Solver
    from tpde.variants.spherical import CircleAttention, circle_head

    grid = circle_grid(512)
    field = CircleAttention(circle_head(BETA), engine="fft")
    problem = Problem(
        grid, uniform_modes(grid, MODES), field, 7.0, scheme=Scheme(dt_max=0.1), snapshots=2
    )
    events = [e for e in Solver(problem).run().events if e.kind == "pinned"]
    for e in events:
        print(f"\nt = {e.time:.3f}: {e.message}")
    assert len(events) == 1 and 5.0 < events[0].time < 7.0
    assert "[atoms]" in events[0].message and "1024 cells" in events[0].message
    drift = float(events[0].message.split("drifts at ")[1].split(" ")[0])
    assert drift < 0.5 * grid.spacing[0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"atoms": {"width": -1.0}}, "atoms.width: must be a number > 0"),
        ({"atoms": {"widht": 2.0}}, "atoms.widht: unknown key"),
        ({"attention": {"beta": 9.0, "engine": "direct"}}, "atoms: on the circle atoms need"),
        ({"grid": {"geometry": "circle", "cells": 16}}, "refine grid.cells"),
    ],
)
def test_atoms_config_errors_name_the_key(change, message):
    from tpde.config import ConfigError, build

    raw = {**ATOMS_CONFIG, **change}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        build(raw)
