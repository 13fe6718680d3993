"""Grid geometry, exact cell-average initial data and moments (``tpde.grid``)."""

from .grid import BOUNDARY_MODES, Grid
from .initial import (
    from_array,
    from_tokens,
    gaussian,
    gaussian_mixture,
    uniform_ball,
    uniform_box,
)
from .moments import covariance, mass, mean, moments, raw_moment
from .positions import SINK_MASS, Positions

__all__ = [
    "BOUNDARY_MODES",
    "Grid",
    "Positions",
    "SINK_MASS",
    "covariance",
    "from_array",
    "from_tokens",
    "gaussian",
    "gaussian_mixture",
    "mass",
    "mean",
    "moments",
    "raw_moment",
    "uniform_ball",
    "uniform_box",
]
