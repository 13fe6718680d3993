"""Every kernel-sum engine implements the one interface (variants/engines/protocol.py) and
agrees with the dense sums to its own stated tolerance; the config takes one engine
vocabulary per geometry (variants/engines/registry.py).

The references are independent: plain numpy log-sum-exp and weighted averages over the
measure (for sigmoid, the plain sigmoid sums), not the engines' own dense code.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tpde.cli import main
from tpde.config import build
from tpde.grid import Grid
from tpde.grid.circle import circle_grid
from tpde.schema import GEOMETRIES
from tpde.variants import kernel_sums as ks
from tpde.variants.cubed_sphere import CubedSphereAttention
from tpde.variants.engines.direct import DirectSums, lattice_tilts, support_box
from tpde.variants.engines.policy import tilt_bounds
from tpde.variants.engines.protocol import KernelSums
from tpde.variants.engines.registry import (
    CONFIG_ENGINES,
    ENGINES,
    canonical,
    check_engine,
    engine_names,
)
from tpde.variants.engines.separable import SeparableSums, table_nodes

ROOT = Path(__file__).resolve().parent.parent


def reference(c, sources, weights, kernel="exp", bias=0.0):
    """log Z and m by numpy over every source (exponentials shifted per row)."""
    z = c @ sources.T
    if kernel == "exp":
        shift = z.max(axis=1, keepdims=True)
        terms = weights * np.exp(z - shift)
        total = terms.sum(axis=1)
        return np.log(total) + shift[:, 0], (terms @ sources) / total[:, None]
    terms = weights / (1.0 + np.exp(-(z + bias)))
    total = terms.sum(axis=1)
    return np.log(total), (terms @ sources) / total[:, None]


def check(engine, c, sources, weights, rows, **kernel):
    """Assert the protocol and the stated tolerance against :func:`reference`; one row."""
    assert isinstance(engine, KernelSums), type(engine).__name__
    assert engine.name in ENGINES
    log_ref, mean_ref = reference(c, sources, weights, **kernel)
    radius = float(np.sqrt((sources**2).sum(axis=1)).max())
    log_err = float(np.abs(engine.log_partition(c) - log_ref).max())
    mean_err = float(np.abs(engine.means(c) - mean_ref).max()) / radius
    estimate = engine.error()
    rows.append((type(engine).__name__, engine.name, engine.tolerance, log_err, mean_err, estimate))
    assert log_err <= engine.tolerance and mean_err <= engine.tolerance, rows[-1]
    assert math.isnan(estimate) or estimate >= 0.0


def table(rows):
    print(f"\n{'class':20s} {'name':10s} {'tolerance':>9s} {'|dlogZ|':>9s} {'|dm|/R':>9s} estimate")
    for name, engine, tol, dlog, dm, est in rows:
        print(f"{name:20s} {engine:10s} {tol:9.1e} {dlog:9.1e} {dm:9.1e} {est:.1e}")


def flat_case():
    grid = Grid([-3.0, -3.0], [3.0, 3.0], [24, 20])
    x, y = grid.mesh(sparse=False)
    density = np.exp(-((x - 0.8) ** 2 + y**2)) + 0.5 * np.exp(-((x + 1) ** 2 + (y - 1) ** 2) / 0.5)
    A = 0.4 * np.array([[1.0, 0.3], [0.3, 0.8]])
    sources = np.stack([x.reshape(-1), y.reshape(-1)], axis=1)
    return grid, density, A, sources, density.reshape(-1)


def test_flat_engines_conform():
    grid, density, A, sources, weights = flat_case()
    rows: list = []
    for offset in [(0.0, 0.0), (0.5, 0.0)]:
        coords = grid.lattice(offset)
        c = lattice_tilts(coords, A)
        check(DirectSums(density, grid), c, sources, weights, rows)
        low, high = support_box(density, grid)
        bounds = tilt_bounds([coords], A)
        nodes = table_nodes(bounds, high - low)
        check(SeparableSums(density, grid, bounds, nodes, "both"), c, sources, weights, rows)
        check(ks.ShearedSums(density, grid, coords, A), c, sources, weights, rows)
        check(ks.FFTSums(density, grid, A, offset), c, sources, weights, rows)
        sig = {"kernel": "sigmoid", "bias": 0.3}
        check(ks.SigmoidSums(density, grid, 0.3), c, sources, weights, rows, **sig)
        lattice = ks.SigmoidSums(density, grid, 0.3, "lattice", (coords, A))
        check(lattice, c, sources, weights, rows, **sig)
    table(rows)
    with pytest.raises(ValueError, match="serves the tilts"):
        ks.FFTSums(density, grid, A, (0.0, 0.0)).means(c[:3])


def test_circle_engines_conform():
    grid = circle_grid(64)
    theta = grid.centres(0)
    weights = (1.0 + 0.6 * np.cos(theta - 0.4) + 0.2 * np.sin(2 * theta)) * grid.spacing[0]
    sources = np.stack([np.cos(theta), np.sin(theta)], axis=1)
    conformal = np.array([[1.5, -0.5], [0.5, 1.5]])  # 1.5 I + 0.5 J
    general = np.array([[2.0, 0.5], [-0.3, 1.0]])
    rows: list = []
    for shift in (0.0, -0.5):
        targets = grid.lower[0] + (np.arange(64) + 0.5 + shift) * grid.spacing[0]
        x = np.stack([np.cos(targets), np.sin(targets)], axis=1)
        for A in (conformal, general):
            c = x @ A.T
            check(ks.CircleDirectSums(theta, weights), c, sources, weights, rows)
            check(ks.BesselSums(theta, weights), c, sources, weights, rows)
        check(
            ks.CircleFFTSums(weights, grid, conformal, shift),
            x @ conformal.T,
            sources,
            weights,
            rows,
        )
    table(rows)
    with pytest.raises(ValueError, match="a I \\+ b J"):
        ks.CircleFFTSums(weights, grid, general)


def test_sphere_engines_conform():
    rng = np.random.default_rng(3)
    k = np.arange(1500) + 0.5  # Fibonacci points: a near-uniform node set
    z = 1 - 2 * k / 1500
    phi = math.pi * (1 + 5**0.5) * k
    sources = np.stack([np.sqrt(1 - z**2) * np.cos(phi), np.sqrt(1 - z**2) * np.sin(phi), z], 1)
    masses = (1.0 + 0.5 * sources[:, 2] + 0.3 * sources[:, 0] * sources[:, 1]) / 1500
    x = rng.normal(size=(40, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    rows: list = []
    for A in (3.0 * np.eye(3), np.array([[2.0, 0.5, 0.0], [0.0, 1.5, 0.3], [0.2, 0.0, 2.5]])):
        c = x @ A.T
        check(ks.SphereDirectSums(sources, masses), c, sources, masses, rows)
        check(ks.SphereHarmonicSums(sources, masses), c, sources, masses, rows)
    table(rows)


def test_every_engine_has_an_adapter():
    names = {
        cls.name
        for g in ("flat", "circle", "sphere")
        for cls in ks.engines_of(g)
        if hasattr(cls, "name")
    }
    assert names | {"lattice"} >= set(ENGINES), set(ENGINES) - names
    for geometry, variants in CONFIG_ENGINES.items():
        for variant, allowed in variants.items():
            assert allowed[0] == "auto" and set(allowed[1:]) <= set(ENGINES), (geometry, variant)


@pytest.mark.parametrize(
    ("geometry", "variant", "name", "expected"),
    [
        ("flat", "softmax", "fft", "fft"),
        ("flat", "l2", "dense", "direct"),
        ("circle", "softmax", "series", "bessel"),
        ("sphere", "softmax", "harmonics", "harmonic"),
    ],
)
def test_aliases(geometry, variant, name, expected):
    assert check_engine(name, geometry, variant) == expected


@pytest.mark.parametrize(
    ("geometry", "variant", "name"),
    [
        ("flat", "softmax", "harmonic"),
        ("flat", "l2", "fft"),
        ("flat", "sigmoid", "separable"),
        ("circle", "softmax", "separable"),
        ("sphere", "softmax", "fft"),
    ],
)
def test_wrong_engine_one_line(geometry, variant, name):
    with pytest.raises(ValueError) as info:
        check_engine(name, geometry, variant)
    message = str(info.value)
    print(message)
    assert "\n" not in message and message.startswith("attention.engine:")
    assert ", ".join(engine_names(geometry, variant)) in message


EXAMPLES = {
    "flat": ("examples/softmax.toml", "harmonic"),
    "circle": ("examples/sphere/clusters.toml", "separable"),
    "sphere": ("examples/sphere/clusters_s2.toml", "fft"),
}


@pytest.mark.parametrize("geometry", sorted(EXAMPLES))
def test_config_refuses_engine_of_another_geometry(geometry, tmp_path, capsys):
    """`tpde run` exits 2 with one line naming the geometry's engines."""
    path, wrong = EXAMPLES[geometry]
    text = (ROOT / path).read_text().replace("[attention]", f'[attention]\nengine = "{wrong}"', 1)
    config = tmp_path / "wrong.toml"
    config.write_text(text)
    code = main(["run", str(config), "-o", str(tmp_path / "out.nc")])
    err = capsys.readouterr().err
    print(err)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert ", ".join(engine_names(geometry)) in lines[0] and f"{wrong!r}" in lines[0]
    assert not (tmp_path / "out.nc").exists()


@pytest.mark.parametrize("geometry", ["flat", "circle"])
def test_config_reads_an_alias(geometry):
    """An alias reads as its name: the field gets the canonical engine (the sphere's field
    checks its own, the config's build of the example being slow)."""
    path = ROOT / EXAMPLES[geometry][0]
    alias = {"flat": "dense", "circle": "series"}[geometry]
    text = path.read_text().replace("[attention]", f'[attention]\nengine = "{alias}"', 1)
    assert build(text).problem.velocity.engine == canonical(alias)
    sphere = CubedSphereAttention(beta=2.0, engine="harmonics")
    assert (sphere.engine, sphere.serving) == ("harmonic", "harmonic")


def test_schema_names_every_engine():
    """tpde/schema.py's engine entries (no import of the registry there) list its names."""
    for geometry, variants in CONFIG_ENGINES.items():
        description = GEOMETRIES[geometry][1]["attention"]["engine"][1]
        for names in variants.values():
            for name in names:
                assert f"`{name}`" in description, (geometry, name)


def test_circle_bessel_engine_matches_the_convolution():
    """engine = "bessel" takes the series at a head a I + b J too: the velocity agrees with
    the convolution's to the series' tail bound; an m-fold grid still needs "fft"."""
    from tpde.grid.circle import von_mises
    from tpde.variants.parameters import Head
    from tpde.variants.spherical import CircleAttention

    grid = circle_grid(96)
    density = von_mises(grid, 0.7, 2.0) + 0.3 * von_mises(grid, -2.0, 4.0)
    head = Head(np.array([[2.0, -0.5], [0.5, 2.0]]), np.eye(2))
    fields = {name: CircleAttention(head, engine=name) for name in ("fft", "bessel")}
    for offset in (0.0, 0.5):
        fft, bessel = (f.at(density, grid, 0.0, [offset]) for f in fields.values())
        gap = float(np.abs(fft - bessel).max())
        print(
            f"offset {offset}: |bessel - fft| = {gap:.1e}, engines {fields['bessel'].last_engine}"
        )
        assert fields["bessel"].last_engine == "bessel" and gap <= 1e-13
    with pytest.raises(ValueError, match='needs engine = "fft"'):
        fields["bessel"].at(density, circle_grid(48, copies=2), 0.0, [0.0])
