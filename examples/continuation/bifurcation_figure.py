"""docs/figures/bifurcation.png: the bifurcation diagrams of beta = 5 on S^1 and S^2.

.venv/bin/python examples/continuation/bifurcation_figure.py
"""

from pathlib import Path

from tpde.continuation import continuation, diagram_dataset, plot_diagram

ROOT = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    circle = diagram_dataset(continuation("circle", 5.0, 192))
    sphere = diagram_dataset(continuation("sphere", 5.0, 128))
    path = plot_diagram(
        [circle, sphere],
        ROOT / "docs" / "figures" / "bifurcation.png",
        titles=["S^1, beta = 5 (192 cells)", "S^2 zonal, beta = 5 (128 latitudes)"],
    )
    print(path)
