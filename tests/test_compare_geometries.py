"""`tpde compare` on the circle and the sphere: W_1 on the circle (exact for cells) against
closed forms and POT's circular distance, and the comparison figures of a grid run against
several token seeds drawn as a band (in the geometry's own terms: order parameter, W_1 on
the circle; mean length, second moment, degree amplitudes, W_2 on the sphere)."""

from __future__ import annotations

import math

import numpy as np
import ot
import pytest

from tpde.cli import main
from tpde.config import dumps
from tpde.grid import Grid
from tpde.grid.circle import TWO_PI, circle_grid, von_mises
from tpde.validation.metrics import wasserstein_circle

CIRCLE = {
    "grid": {"geometry": "circle", "cells": 32},
    "initial": {"kind": "noise", "amplitude": 0.05, "k_max": 4},
    "attention": {"beta": 4.0},
    "run": {"t_end": 0.4, "snapshots": 3},
}


def test_wasserstein_circle_closed_forms_and_pot():
    """An arc's rotation by s costs s (the short way round, also across 0); identical laws
    are at 0; two von Mises laws agree with POT's circular W_1 between the cell-centre
    atoms within h / 2 (each law's cells are within h / 4 of their centre atoms)."""
    n = 64
    grid, h = circle_grid(n), TWO_PI / n
    arc = np.zeros(n)
    arc[:10] = 1.0
    rows = []
    for shift, cost in ((1, 1), (3, 3), (7, 7), (n - 4, 4), (n - 1, 1)):
        w = wasserstein_circle(arc, np.roll(arc, shift), grid)
        rows.append((shift, w, cost * h))
        assert w == pytest.approx(cost * h, rel=1e-13, abs=1e-15)
    assert wasserstein_circle(arc, arc, grid) == 0.0
    fine = circle_grid(1024)
    a, b = von_mises(fine, 0.5, 3.0), von_mises(fine, 2.5, 1.0)
    ours = wasserstein_circle(a, b, fine)
    assert wasserstein_circle(b, a, fine) == pytest.approx(ours, rel=1e-13)
    u = (np.arange(1024) + 0.5) / 1024  # POT: the circle [0, 1), scaled by 2 pi
    theirs = TWO_PI * float(np.squeeze(ot.wasserstein_circle(u, u, a / a.sum(), b / b.sum(), p=1)))
    print("\nrotation s, W_1, s h:", rows)
    print(f"von Mises: ours {ours:.8f}, POT (cell centres) {theirs:.8f}")
    assert abs(ours - theirs) <= 0.5 * TWO_PI / 1024
    with pytest.raises(ValueError, match="periodic"):
        wasserstein_circle(np.ones(8), np.ones(8), Grid([0.0], [1.0], [8]))


def test_compare_on_the_circle_draws_seeds_as_a_band(tmp_path, capsys, monkeypatch):
    """`tpde compare RUN t1 t2 t3` on the circle writes its figure (exit 0); the figure
    draws the seeds' spread as a band, and the W_1 curve is the median over the seeds of
    the exact circular distance of each token histogram to the run (recomputed here from
    the files). A flat run refuses several token files in one line (exit 2)."""
    import xarray as xr

    from tpde.plots import compare_figure

    config = tmp_path / "circle.toml"
    config.write_text(dumps(CIRCLE))
    run, tokens = tmp_path / "run.nc", [tmp_path / f"t{s}.nc" for s in (1, 2, 3)]
    assert main(["run", str(config), "-o", str(run), "--quiet"]) == 0
    for seed, path in enumerate(tokens, start=1):
        args = ["particles", str(config), "--tokens", "100", "--seed", str(seed), "-o", str(path)]
        assert main(args) == 0
    from matplotlib.figure import Figure

    drawn_to: list = []  # (drawing is most of a figure's cost: tests/test_figures.py draws)
    monkeypatch.setattr(Figure, "savefig", lambda self, name, *a, **k: drawn_to.append(name))
    picture = tmp_path / "compare.png"
    assert main(["compare", str(run), *map(str, tokens), "-o", str(picture)]) == 0
    assert drawn_to == [picture]
    fig = compare_figure(run, tokens)
    top, order, distance = fig.get_axes()[:3]  # (then the staircase row)
    assert top.collections and order.collections and distance.collections  # the bands
    grid = circle_grid(32)
    with xr.open_dataset(run) as r:
        ref = r["density"].values
    w = []
    for path in tokens:
        with xr.open_dataset(path) as one:
            w.append(
                [
                    wasserstein_circle(d, g, grid)
                    for d, g in zip(one["density"].values, ref, strict=True)
                ]
            )
    drawn = distance.get_lines()[-1].get_ydata()
    print(f"\nW_1 tokens - grid (median of 3 seeds): {np.round(drawn, 4).tolist()}")
    np.testing.assert_allclose(drawn, np.median(np.array(w), axis=0), rtol=1e-12)
    assert all(0.0 < x < 0.5 for x in drawn) and math.isfinite(float(np.sum(drawn)))
    capsys.readouterr()
    flat = tmp_path / "flat.toml"
    flat.write_text(
        dumps(
            {
                "grid": {"lower": [-6.0], "upper": [6.0], "cells": [16]},
                "attention": {"A": [[0.5]], "V": [[1.0]]},
                "run": {"t_end": 0.1, "snapshots": 2},
            }
        )
    )
    flat_run, a, b = tmp_path / "f.nc", tmp_path / "fa.nc", tmp_path / "fb.nc"
    assert main(["run", str(flat), "-o", str(flat_run), "--quiet"]) == 0
    for seed, path in ((1, a), (2, b)):
        assert (
            main(["particles", str(flat), "--tokens", "50", "--seed", str(seed), "-o", str(path)])
            == 0
        )
    capsys.readouterr()
    assert main(["compare", str(flat_run), str(a), str(b), "-o", str(tmp_path / "f.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "band on the circle and the sphere only" in err, err


def test_compare_on_the_sphere_draws_seeds_as_a_band(tmp_path, capsys, monkeypatch):
    """`tpde compare RUN t1 t2 t3` on the sphere writes its figure (exit 0); the order
    parameter's band and median are those of |mean of the tokens| recomputed from the
    token positions; W_2 to the run and the seeds' own noise are drawn; a flat file as a
    reference is refused in one line (exit 2)."""
    import xarray as xr
    from matplotlib.figure import Figure

    from tpde import io
    from tpde.sphere_plots import compare_figure

    raw = {
        "grid": {"geometry": "sphere", "cells": 6},
        "initial": {"kind": "noise", "amplitude": 0.05, "l_max": 3},
        "attention": {"beta": 4.0},
        "run": {"t_end": 0.2, "snapshots": 3},
    }
    config = tmp_path / "s2.toml"
    config.write_text(dumps(raw))
    run, tokens = tmp_path / "run.nc", [tmp_path / f"t{s}.nc" for s in (1, 2, 3)]
    assert main(["run", str(config), "-o", str(run), "--quiet"]) == 0
    for seed, path in enumerate(tokens, start=1):
        args = ["particles", str(config), "--tokens", "60", "--seed", str(seed), "-o", str(path)]
        assert main(args) == 0
    drawn_to: list = []  # (drawing is most of a figure's cost: tests/test_figures.py draws)
    monkeypatch.setattr(Figure, "savefig", lambda self, name, *a, **k: drawn_to.append(name))
    picture = tmp_path / "compare.png"
    assert main(["compare", str(run), *map(str, tokens), "-o", str(picture)]) == 0
    assert drawn_to == [picture]
    fig = compare_figure(io.read(run), [io.read(p) for p in tokens])
    order, _, _, distance = fig.get_axes()[:4]  # (then the staircase row)
    lengths = []
    for path in tokens:
        with xr.open_dataset(path) as one:
            lengths.append(np.linalg.norm(one["tokens"].values.mean(axis=1), axis=1))
    median = order.get_lines()[-1].get_ydata()
    print(f"\n|mean| of the tokens (median of 3 seeds): {np.round(median, 4).tolist()}")
    np.testing.assert_allclose(median, np.median(np.array(lengths), axis=0), rtol=1e-10)
    assert order.collections and distance.collections  # the seeds' bands
    labels = [line.get_label() for line in distance.get_lines()]
    assert "seeds - seeds (sampling noise)" in labels
    w2 = distance.get_lines()[0].get_ydata()
    print(f"W_2 tokens - grid (median): {np.round(w2, 4).tolist()}")
    assert np.all((w2 > 0) & (w2 < np.pi))
    capsys.readouterr()
    flat = tmp_path / "flat.nc"
    flat.write_text("")
    assert main(["compare", str(run), str(flat), "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a sphere file" in err, err
