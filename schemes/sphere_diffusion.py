"""Noise on the cubed sphere: the Laplace-Beltrami operator in finite-volume form and its
exact solve.

docs/theory.md, 'Noise on the cubed sphere'. In a panel's local angles ``(a, b)`` (metric
``g``, area element ``J = sqrt(det g)``) the Laplace-Beltrami operator is

    Delta f = (1 / J) [d_a (J g^aa d_a f + J g^ab d_b f) + d_b (J g^ab d_a f + J g^bb d_b f)],

and for the gnomonic equiangular map (``X = tan a``, ``Y = tan b``, ``r^2 = 1 + X^2 + Y^2``)
the flux coefficients have the closed form

    J g^aa = (1 + Y^2) / r,   J g^ab = X Y / r,   J g^bb = (1 + X^2) / r.

The flux of ``grad f`` through the face ``a = a_{i+1/2}`` (a ``b``-interval of width ``h``)
is ``int (J g^aa d_a f + J g^ab d_b f) db``: the coefficients averaged over the face (3-point
Gauss), ``d_a f`` the difference of the two cells across the face over ``h``, ``d_b f`` the
mean of the two cells' centred differences along the face (second order one-sided at a
panel's end). Cells beyond a panel edge are the panel's own coordinates extended: the halo
of :func:`tpde.grid.cubed_sphere.halo_matrix` (fifth order) of ``q = J rho`` divided by the
ghost cell's ``J`` average, each ghost row rescaled to sum 1 so that a constant has no flux.
Each panel edge carries the mean of its two panels' fluxes, so

    (L rho)_c = (1 / A_c) sum_{faces of c} F

is conservative: ``sum_c A_c (L rho)_c = 0`` exactly (a telescoping sum), and ``L 1 = 0``.
That is the second-order operator (``order = 2``). The default, fourth order
(:func:`_laplace_beltrami_4`), keeps the same flux form with three ghost rows: point values
from the averages (``(1 - h^2 (d_aa + d_bb) / 24)`` of ``q_bar``, divided by the same of the
metric's averages ``J_bar``, so constants stay exact), fourth-order face gradients and the
face average ``(1 + h^2 d_tt / 24)`` of the flux density. Orders measured on zonal
harmonics (Rayleigh quotients): 2.0 and 3.8 - 4.2 (tests/test_sphere_noise.py).

Time. The substep ``rho <- exp(tau eps L) rho`` is applied by scipy's ``expm_multiply``
(Taylor steps of the sparse operator, no ``h^2 / eps`` limit); the solver splits it around
the transport step (Strang: half, transport, half). ``L`` has negative off-diagonal entries
(the cross terms ``g^ab`` at the panels' corners), so ``exp(tau L)`` is not a positive map: a
substep whose result has negatives beyond round-off has them set to zero and its mass
restored by scaling (counted in :attr:`SphereDiffusion.clipped`).
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.polynomial.legendre import leggauss
from scipy import sparse
from scipy.sparse.linalg import expm_multiply

from tpde.grid.cubed_sphere import GHOSTS, SIDES, CubedSphere, connectivity, halo_matrix

from .diffusion import check_noise
from .operator import NEGLIGIBLE_NEGATIVE

__all__ = ["SphereDiffusion", "flux_coefficients", "laplace_beltrami"]


def flux_coefficients(a, b) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``J g^aa``, ``J g^ab``, ``J g^bb`` of the gnomonic map at local angles ``(a, b)``."""
    x, y = np.tan(a), np.tan(b)
    r = np.sqrt(1.0 + x * x + y * y)
    return (1.0 + y * y) / r, x * y / r, (1.0 + x * x) / r


def _ghost_areas(grid: CubedSphere) -> np.ndarray:
    """(4, n) the areas of the first ghost layer beyond each side (the panel's own
    coordinates extended; the closed form of the area holds beyond ``pi / 4``)."""
    h, e = grid.h, grid.edges
    t = np.tan(e)
    lo, hi = np.tan(e[0] - h), np.tan(e[-1] + h)

    def area(x0, x1, y0, y1):
        f = lambda u, v: np.arctan(u * v / np.sqrt(1 + u * u + v * v))  # noqa: E731
        return f(x1, y1) - f(x0, y1) - f(x1, y0) + f(x0, y0)

    along0, along1 = t[:-1], t[1:]
    return np.stack(
        [
            area(lo, t[0], along0, along1),  # side 0: a below -pi/4
            area(t[-1], hi, along0, along1),  # side 1: a above pi/4
            area(along0, along1, lo, t[0]),  # side 2: b below -pi/4
            area(along0, along1, t[-1], hi),  # side 3: b above pi/4
        ]
    )


def _padding(grid: CubedSphere) -> sparse.csr_matrix:
    """``(6 (n + 2)^2, 6 n^2)``: cell averages -> the panels with one ghost layer (corners 0)."""
    n, h = grid.n, grid.h
    m = n + 2
    halo = halo_matrix(n).tocsr()
    # rows of the first ghost layer: ((p * 4 + side) * 3 + 0) * n + k
    p, side, k = np.meshgrid(np.arange(6), np.arange(SIDES), np.arange(n), indexing="ij")
    rows = (((p * SIDES + side) * GHOSTS) * n + k).ravel()
    to_q = sparse.diags((grid.areas / (h * h)).ravel())
    ghost_j = (np.broadcast_to(_ghost_areas(grid), (6, SIDES, n)) / (h * h)).ravel()
    ghosts = sparse.diags(1.0 / ghost_j) @ halo[rows] @ to_q
    sums = np.asarray(ghosts.sum(axis=1)).ravel()
    ghosts = sparse.diags(1.0 / sums) @ ghosts  # constants exact (a change of O(h^5))
    ii = np.select([side == 0, side == 1], [0, m - 1], k + 1)
    jj = np.select([side == 2, side == 3], [0, m - 1], k + 1)
    ghost_rows = (p * m * m + ii * m + jj).ravel()
    pp, i, j = np.meshgrid(np.arange(6), np.arange(n), np.arange(n), indexing="ij")
    inner_rows = (pp * m * m + (i + 1) * m + (j + 1)).ravel()
    inner = sparse.csr_matrix(
        (np.ones(6 * n * n), (inner_rows, np.arange(6 * n * n))), shape=(6 * m * m, 6 * n * n)
    )
    ghosts = ghosts.tocoo()
    outer = sparse.csr_matrix(
        (ghosts.data, (ghost_rows[ghosts.row], ghosts.col)), shape=(6 * m * m, 6 * n * n)
    )
    return (inner + outer).tocsr()


def _face_coefficients(grid: CubedSphere) -> tuple[np.ndarray, np.ndarray]:
    """``(n + 1, n)`` the face averages of ``J g^aa`` and ``J g^ab`` on the faces
    ``a = a_{i}`` (edge ``i``, cell ``j`` along it), 3-point Gauss along the face. By the
    symmetry ``a <-> b`` the faces ``b = const`` have ``J g^bb`` and ``J g^ab`` transposed."""
    x, w = leggauss(3)
    e, c, h = grid.edges, grid.centres, grid.h
    b = c[None, :, None] + 0.5 * h * x[None, None, :]
    aa, ab, _ = flux_coefficients(e[:, None, None], b)
    return 0.5 * (aa @ w), 0.5 * (ab @ w)


#: the orders of :func:`laplace_beltrami`
ORDERS = (2, 4)


@functools.lru_cache(maxsize=8)
def laplace_beltrami(n: int, order: int = 4) -> sparse.csr_matrix:
    """``(6 n^2, 6 n^2)`` the finite-volume Laplace-Beltrami operator on cell averages of the
    cubed sphere with ``n`` cells a panel (module docstring), of ``order`` 2 or 4:
    conservative, ``L 1 = 0``."""
    if order not in ORDERS:
        raise ValueError(f"laplace_beltrami: order 2 or 4, got {order!r}")
    return _laplace_beltrami_4(n) if order == 4 else _laplace_beltrami_2(n)


def _laplace_beltrami_2(n: int) -> sparse.csr_matrix:
    """The second-order operator (module docstring)."""
    grid = CubedSphere(n)
    m = n + 2
    size = 6 * m * m
    index = np.arange(size).reshape(6, m, m)
    coef_n, coef_t = _face_coefficients(grid)  # (n + 1, n)

    rows, cols, vals = [], [], []
    face_index = np.zeros((2, 6, n + 1, n), int)

    def add(face, cell, weight):
        rows.append(np.broadcast_to(face, cell.shape).ravel())
        cols.append(cell.ravel())
        vals.append(np.broadcast_to(weight, cell.shape).ravel())

    j = np.arange(n)
    # h * (d_b f) at a cell from its line: centred, second-order one-sided at the line's ends
    # (the padded corners are never read)
    tangential = (
        (j[1:-1], (-1, 1), (-0.5, 0.5)),
        (j[:1], (0, 1, 2), (-1.5, 2.0, -0.5)),
        (j[-1:], (0, -1, -2), (1.5, -2.0, 0.5)),
    )
    for family in range(2):
        # family 0: faces a = const, [p, i (edge), j]; family 1: b = const, panel transposed
        idx = index if family == 0 else index.transpose(0, 2, 1)
        f = family * 6 * (n + 1) * n + np.arange(6 * (n + 1) * n).reshape(6, n + 1, n)
        face_index[family] = f
        # edge i lies between padded rows i (left) and i + 1 (right)
        add(f, idx[:, 1 : n + 2, 1 : n + 1], coef_n[None])
        add(f, idx[:, 0 : n + 1, 1 : n + 1], -coef_n[None])
        for shift in (0, 1):  # the mean of the two cells' tangential derivatives
            for sel, offsets, weights in tangential:
                for off, wt in zip(offsets, weights, strict=True):
                    target = idx[:, shift : shift + n + 1, sel + off + 1]
                    add(f[:, :, sel], target, 0.5 * wt * coef_t[None][:, :, sel])
    faces = 2 * 6 * (n + 1) * n
    flux = sparse.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(faces, size)
    )
    flux = _unify(flux, face_index, n)
    divergence = _divergence(face_index, n)
    operator = sparse.diags(1.0 / grid.areas.ravel()) @ divergence @ flux @ _padding(grid)
    return operator.tocsr()


def _unify(flux: sparse.csr_matrix, face_index: np.ndarray, n: int) -> sparse.csr_matrix:
    """Rows of the panel-edge faces replaced by the mean of the two panels' outward fluxes
    (:meth:`tpde.schemes.cubed_sphere.CubedSphereOperator._unify`, as a matrix)."""
    partner, _, _ = connectivity(n)
    fa, fb = face_index
    # outward face rows and signs per (panel, side, k)
    edge_rows = np.stack([fa[:, 0], fa[:, n], fb[:, 0], fb[:, n]], 1)  # (6, 4, n)
    sign = np.array([-1.0, 1.0, -1.0, 1.0])[None, :, None] * np.ones((6, SIDES, n))
    er, sg = edge_rows.ravel(), sign.ravel()
    pr = partner.ravel()
    # new outward(e) = (outward(e) - outward(partner)) / 2; row(e) = sign(e) * outward(e)
    # => row(e) = 0.5 (row(e) - sign(e) sign(partner) row(partner))
    total = flux.shape[0]
    keep = np.ones(total)
    keep[er] = 0.0
    mix = sparse.diags(keep).tocsr()  # the other faces as they are
    extra = sparse.csr_matrix(
        (
            np.concatenate([0.5 * np.ones(er.size), -0.5 * sg * sg[pr]]),
            (np.concatenate([er, er]), np.concatenate([er, er[pr]])),
        ),
        shape=(total, total),
    )
    return ((mix + extra) @ flux).tocsr()


class SphereDiffusion:
    """The substep ``rho <- exp(tau eps L) rho`` on a cubed sphere (module docstring).

    ``clipped``: substeps whose result had negatives beyond round-off (set to zero, mass
    restored by scaling)."""

    def __init__(self, grid: CubedSphere, eps: float, order: int = 4):
        self.grid = grid
        self.eps = check_noise(eps)
        self.matrix = laplace_beltrami(grid.n, order) if self.eps > 0.0 else None
        self.clipped = 0

    def step(self, density: np.ndarray, tau: float) -> np.ndarray:
        """The density (``(6, n, n)`` per unit area) diffused for a time ``tau`` (a new array)."""
        if self.matrix is None or tau <= 0.0:
            return np.asarray(density, float)
        flat = np.asarray(density, float).ravel()
        out = expm_multiply((tau * self.eps) * self.matrix, flat)
        areas = self.grid.areas.ravel()
        if out.min() < 0.0:
            negative = -float(areas[out < 0.0] @ out[out < 0.0])
            if negative > NEGLIGIBLE_NEGATIVE * float(areas[out > 0.0] @ out[out > 0.0]):
                self.clipped += 1
            before = float(areas @ out)
            out = np.maximum(out, 0.0)
            out *= before / float(areas @ out)
        return out.reshape(self.grid.shape)


# ---- fourth order ------------------------------------------------------------------------------
def _padded_areas(grid: CubedSphere) -> np.ndarray:
    """``(n + 6, n)`` cell areas along a panel's ``a`` with 3 ghost rows each side (the
    coordinates extended), ``b`` inside the panel; by the ``a <-> b`` symmetry also the
    transposed layout of the ``b`` faces."""
    h, n = grid.h, grid.n
    rows = -0.25 * np.pi + h * np.arange(-GHOSTS, n + GHOSTS + 1)
    t, s = np.tan(rows), np.tan(grid.edges)
    corner = np.arctan(t[:, None] * s[None, :] / np.sqrt(1 + t[:, None] ** 2 + s[None, :] ** 2))
    return corner[1:, 1:] - corner[:-1, 1:] - corner[1:, :-1] + corner[:-1, :-1]


def _line_padding(grid: CubedSphere, family: int) -> sparse.csr_matrix:
    """``(6 (n + 6) n, 6 n^2)``: rho averages -> ``q_bar`` on the panels with 3 ghost rows
    across the two sides normal to the family's faces (family 0: sides 0, 1 along ``a``;
    family 1: sides 2, 3, panel transposed). Each ghost row is rescaled so that the halo of
    the metric's averages is the ghost cell's own ``J_bar`` (constants exact)."""
    n, h = grid.n, grid.h
    m = n + 2 * GHOSTS
    jbar = grid.areas.ravel() / (h * h)
    halo = halo_matrix(n).tocsr()
    pj = _padded_areas(grid) / (h * h)
    rows_out, rows_in = [], []
    for side in (2 * family, 2 * family + 1):
        for depth in range(1, GHOSTS + 1):
            for p in range(6):
                k = np.arange(n)
                rows_in.append(((p * SIDES + side) * GHOSTS + depth - 1) * n + k)
                r = GHOSTS - depth if side % 2 == 0 else GHOSTS + n - 1 + depth
                rows_out.append(p * m * n + r * n + k)
    rin, rout = np.concatenate(rows_in), np.concatenate(rows_out)
    ghosts = halo[rin] @ sparse.diags(jbar)  # rho_bar -> q_bar of the ghosts
    target = pj.ravel()[rout % (m * n)]
    sums = np.asarray(ghosts.sum(axis=1)).ravel()
    ghosts = (sparse.diags(target / sums) @ ghosts).tocoo()
    pp, i, j = np.meshgrid(np.arange(6), np.arange(n), np.arange(n), indexing="ij")
    rr, cc = (i, j) if family == 0 else (j, i)
    inner_rows = (pp * m * n + (rr + GHOSTS) * n + cc).ravel()
    source = (pp * n * n + i * n + j).ravel()
    shape = (6 * m * n, 6 * n * n)
    inner = sparse.csr_matrix((jbar[source], (inner_rows, source)), shape=shape)
    outer = sparse.csr_matrix((ghosts.data, (rout[ghosts.row], ghosts.col)), shape=shape)
    return (inner + outer).tocsr()


def _stencil_matrix(size: int, stencils: dict[int, tuple[int, np.ndarray]], default) -> np.ndarray:
    """(size, size): row ``i`` is ``default = (first offset, weights)`` from ``i + offset``
    unless ``stencils[i]`` (index from the start, negative from the end) says otherwise."""
    out = np.zeros((size, size))
    for i in range(size):
        offset, weights = stencils.get(i, stencils.get(i - size, default))
        out[i, i + offset : i + offset + len(weights)] = weights
    return out


#: fourth-order first derivative of point values (times h): centred, one-sided at the ends
D1 = (-2, np.array([1.0, -8.0, 0.0, 8.0, -1.0]) / 12.0)
D1_ENDS = {
    0: (0, np.array([-25.0, 48.0, -36.0, 16.0, -3.0]) / 12.0),
    1: (-1, np.array([-3.0, -10.0, 18.0, -6.0, 1.0]) / 12.0),
    -2: (-3, np.array([-1.0, 6.0, -18.0, 10.0, 3.0]) / 12.0),
    -1: (-4, np.array([3.0, -16.0, 36.0, -48.0, 25.0]) / 12.0),
}
#: second difference (times h^2): centred, second-order one-sided at the ends (it only
#: enters as the h^2 / 24 correction, so second order keeps the whole fourth)
D2 = (-1, np.array([1.0, -2.0, 1.0]))
D2_ENDS = {0: (0, np.array([2.0, -5.0, 4.0, -1.0])), -1: (-3, np.array([-1.0, 4.0, -5.0, 2.0]))}


def _laplace_beltrami_4(n: int) -> sparse.csr_matrix:
    """The fourth-order operator (docs/theory.md, 'Noise on the cubed sphere'): per face
    family, ``q_bar`` with 3 ghost rows -> point values ``(1 - (d_aa + d_bb) h^2 / 24) q_bar``
    divided by the same of ``J_bar`` (constants exact) -> at the face centres ``d_n f``
    (``(1, -27, 27, -1) / 24 h``) and ``d_t f`` (the face interpolant ``(-1, 9, 9, -1) / 16``
    differentiated along the face, fourth order) -> the flux ``h (1 + h^2 d_tt / 24) (J g^nn d_n
    f + J g^nt d_t f)`` (the face average)."""
    grid = CubedSphere(n)
    h, m = grid.h, n + 2 * GHOSTS
    eye6, eye_m, eye_n = (sparse.identity(k, format="csr") for k in (6, m, n))
    rows_d2 = sparse.csr_matrix(_stencil_matrix(m, {0: (0, np.zeros(1)), -1: (0, np.zeros(1))}, D2))
    cols_d2 = sparse.csr_matrix(_stencil_matrix(n, D2_ENDS, D2))
    cols_d1 = sparse.csr_matrix(_stencil_matrix(n, D1_ENDS, D1))
    deconvolve = (
        sparse.kron(eye_m, eye_n)
        - (sparse.kron(rows_d2, eye_n) + sparse.kron(eye_m, cols_d2)) / 24.0
    )
    jbar = _padded_areas(grid).ravel() / (h * h)
    jpoint = deconvolve @ jbar
    face_d = np.zeros((n + 1, m))
    face_i = np.zeros((n + 1, m))
    for k in range(n + 1):  # face k lies between padded rows k + 2 and k + 3
        face_d[k, k + 1 : k + 5] = np.array([1.0, -27.0, 27.0, -1.0]) / 24.0
        face_i[k, k + 1 : k + 5] = np.array([-1.0, 9.0, 9.0, -1.0]) / 16.0
    coef_n, coef_t, _ = flux_coefficients(grid.edges[:, None], grid.centres[None, :])
    average = sparse.kron(sparse.identity(n + 1), eye_n + cols_d2 / 24.0)
    normal = sparse.kron(sparse.csr_matrix(face_d), eye_n)
    tangential = sparse.kron(sparse.csr_matrix(face_i), cols_d1)
    per_panel = (
        average
        @ (sparse.diags(coef_n.ravel()) @ normal + sparse.diags(coef_t.ravel()) @ tangential)
        @ sparse.diags(1.0 / jpoint)
        @ deconvolve
    )
    block = sparse.kron(eye6, per_panel).tocsr()  # (6 (n + 1) n, 6 m n)
    flux = sparse.vstack([block @ _line_padding(grid, f) for f in (0, 1)]).tocsr()
    face_index = np.arange(2 * 6 * (n + 1) * n).reshape(2, 6, n + 1, n)
    flux = _unify(flux, face_index, n)
    return (sparse.diags(1.0 / grid.areas.ravel()) @ _divergence(face_index, n) @ flux).tocsr()


def _divergence(face_index: np.ndarray, n: int) -> sparse.csr_matrix:
    """``(6 n^2, faces)``: cell ``(p, i, j)`` gets ``F(a-face i + 1) - F(a-face i) + F(b-face
    j + 1) - F(b-face j)``."""
    p, i, jj = np.meshgrid(np.arange(6), np.arange(n), np.arange(n), indexing="ij")
    cell = (p * n * n + i * n + jj).ravel()
    fa, fb = face_index
    cols = [fa[p, i + 1, jj], fa[p, i, jj], fb[p, jj + 1, i], fb[p, jj, i]]
    signs = np.repeat([1.0, -1.0, 1.0, -1.0], cell.size)
    return sparse.csr_matrix(
        (signs, (np.tile(cell, 4), np.concatenate([c.ravel() for c in cols]))),
        shape=(6 * n * n, face_index.size),
    )
