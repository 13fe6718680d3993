"""FFT convolution engine for softmax with a symmetric A, and its transforms.

docs/theory.md, 'Other engines' (the convolution form and why "auto" never picks it).

For A = A^T, <A x, y> = 1/2 x^T A x + 1/2 y^T A y - 1/2 (x - y)^T A (x - y); the x factor
cancels between numerator and denominator, so the softmax sums are convolutions:

    sum_s rho_s e^{<A x, y_s>} (1, y_s)  ~  (g * (w rho (1, y)))(x),
    g(z) = exp(-1/2 z^T A z),   w(y) = exp(1/2 y^T A y),

evaluated on every shifted lattice by a kernel sampled at the shifted differences
``(i - j) h + offset h`` (zero-padded linear convolution, size 2N - 1 per axis; the kernel
spectrum of every offset is cached). The sums are the same discrete sums the direct engine
forms, so the cell-average correction of softmax applies unchanged.

Accuracy is only absolute: an FFT returns each sum to about eps * max|terms| * N, so where the
true sum is many orders below the largest term (the tails of the density, large |A| R^2, an
indefinite A whose g grows) the relative accuracy is lost. The engine is kept
for what it shows: ``tests/test_engines.py`` measures it against the dense sums (1e-15 for
A = s [[1, .3], [.3, .8]] with s <= 0.5 on two bumps at 48^2; O(1) errors for s = 2 or a
negative-definite A, and a ValueError when a sum comes out <= 0), whereas the separable
engine keeps relative accuracy for any A at a comparable cost and is therefore what
``engine="auto"`` picks. Transforms are
pyfftw plans (FFTW_ESTIMATE, one thread: see FFT_THREADS) with scipy.fft as the fallback.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from types import ModuleType

import numpy as np

from tpde.grid import Grid, profile


@functools.cache
def fftw() -> ModuleType | None:
    """pyfftw, imported on the first plan (None where it is missing: scipy.fft then).

    Not at import: pyfftw loads its dask interface and with it dask.array, which every
    ``tpde`` process that plans no transform (most runs, every refused input) would load
    for nothing (tests/test_standalone.py)."""
    try:
        import pyfftw
    except ImportError:  # pragma: no cover - pyfftw is a dependency; scipy.fft is the fallback
        return None
    return pyfftw


#: threads of the engine's transforms. One: inside a solver step the transforms run between
#: numba's parallel loops, whose OpenMP workers spin after each loop and take the cores
#: from FFTW's own threads, so a step with 2-thread transforms was slower than with one,
#: although one evaluation alone is faster with two (benchmarks/step.py, softmax-fft case)
FFT_THREADS = 1


class PlannedFFT:
    """Real forward / inverse transforms of one padded shape, planned once and reused.

    The input buffer is zeroed once: each forward transform writes its data window only (an
    out-of-place real-to-complex transform leaves its input intact, so the padding stays
    zero); each inverse multiplies the kernel spectrum straight into the transform's input.
    """

    def __init__(self, shape: Sequence[int]):
        self.shape = tuple(int(n) for n in shape)
        self.backend = "scipy"
        pyfftw = fftw()
        if pyfftw is not None:
            threads = FFT_THREADS
            self._in = pyfftw.zeros_aligned(self.shape, dtype="float64")
            self._forward = pyfftw.builders.rfftn(
                self._in, threads=threads, planner_effort="FFTW_ESTIMATE", avoid_copy=True
            )
            spectrum = self._forward.output_array
            self._spectrum = pyfftw.empty_aligned(spectrum.shape, dtype=spectrum.dtype)
            self._inverse = pyfftw.builders.irfftn(
                self._spectrum,
                s=self.shape,
                threads=threads,
                planner_effort="FFTW_ESTIMATE",
                avoid_copy=True,
            )
            self.backend = "pyfftw"
        self._window: tuple | None = None

    def forward(self, values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """rfftn of ``values`` zero-padded to ``shape``: into ``out`` (from
        :meth:`spectrum_buffer`) or a new array."""
        if self.backend == "scipy":
            import scipy.fft

            return scipy.fft.rfftn(values, s=self.shape, workers=FFT_THREADS)
        window = tuple(slice(0, n) for n in values.shape)
        if window != self._window:
            self._in[...] = 0.0
            self._window = window
        self._in[window] = values
        if out is None:
            out = self.spectrum_buffer()
            assert out is not None  # (None for the scipy backend only)
        self._forward(output_array=out)  # (rebinds the plan's output: always pass one)
        return out

    def spectrum_buffer(self) -> np.ndarray | None:
        """An aligned array the forward transform can write into (None for scipy)."""
        if self.backend == "scipy":
            return None
        pyfftw = fftw()
        assert pyfftw is not None  # (the pyfftw backend)
        return pyfftw.empty_aligned(self._spectrum.shape, dtype=self._spectrum.dtype)

    def convolve(
        self, kernel: np.ndarray, spectrum: np.ndarray, window: tuple[slice, ...]
    ) -> np.ndarray:
        """irfftn(kernel * spectrum)[window] (a new array)."""
        if self.backend == "scipy":
            import scipy.fft

            return scipy.fft.irfftn(kernel * spectrum, s=self.shape, workers=FFT_THREADS)[window]
        np.multiply(kernel, spectrum, out=self._spectrum)
        return self._inverse()[window].copy()


class FFTSoftmaxSums:
    """Softmax kernel sums by FFT convolution (symmetric A only).

    ``convolve(fields, grid, requests)``: the discrete sums sum_s e^{<A x, y_s>} f_s /
    e^{<A x, .>}-normalised as in the module docstring, for each source field f (already
    multiplied by ``weights(density, grid)``) on each requested lattice.
    """

    def __init__(self, A: np.ndarray):
        if not np.allclose(A, A.T, rtol=0.0, atol=1e-14 * max(1.0, np.abs(A).max())):
            raise ValueError(
                "attention.engine: 'fft' needs a symmetric A (A = A^T); use "
                "'separable' or 'direct' for a general A"
            )
        self.A = np.asarray(A, float)
        self._plans: dict = {}
        self._kernels: dict = {}
        self._quad: dict = {}
        self._buffers: dict = {}

    def _plan(self, shape: tuple[int, ...]) -> PlannedFFT:
        padded = tuple(2 * n for n in shape)
        if padded not in self._plans:
            self._plans[padded] = PlannedFFT(padded)
        return self._plans[padded]

    def _kernel(self, grid: Grid, offset: tuple[float, ...], plan: PlannedFFT) -> np.ndarray:
        """Spectrum of g at the target-minus-source differences, laid out for a circular
        convolution of size 2N per axis: slot l holds lag l (l = 0..N) or l - 2N (negative
        lags), in units of h, plus the lattice offset. The face lattice (offset 1/2, N + 1
        points starting at the lower edge) is offset -1/2 with one more target."""
        key = (grid.shape, tuple(grid.spacing), offset)
        if key not in self._kernels:
            axes = []
            for a, (n, h) in enumerate(zip(grid.shape, grid.spacing, strict=True)):
                shift = -0.5 if offset[a] == 0.5 else offset[a]
                lag = np.concatenate([np.arange(0, n + 1), np.arange(-(n - 1), 0)])
                axes.append((lag + shift) * h)
            z = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1)
            exponent = -0.5 * np.einsum("...i,ij,...j->...", z, self.A, z)
            self._kernels[key] = plan.forward(np.exp(exponent - exponent.max()))
        return self._kernels[key]

    def weights(self, density: np.ndarray, grid: Grid) -> np.ndarray:
        """w = density e^{y^T A y / 2} (shifted by its maximum over the mass), (*grid.shape)."""
        key = (grid.shape, tuple(grid.lower), tuple(grid.spacing))
        if key not in self._quad:
            y = np.stack(grid.mesh(sparse=False), axis=-1)
            self._quad[key] = 0.5 * np.einsum("...i,ij,...j->...", y, self.A, y)
        quad = self._quad[key]
        mass = density > 0
        return np.where(mass, density * np.exp(quad - quad[mass].max()), 0.0)

    @profile.timed("velocity.fft")
    def convolve(
        self,
        fields: list[np.ndarray],
        grid: Grid,
        requests: list[tuple[Sequence[float], list[int]]],
    ) -> list[list[np.ndarray]]:
        """For each request (offset, field indices): the sums of those fields on the lattice
        ``grid.lattice(offset)``, each flattened to (P,). One forward transform per field
        that some request uses, one inverse per requested field and lattice."""
        plan = self._plan(grid.shape)
        used = sorted({k for _, indices in requests for k in indices})
        buffers = self._buffers.setdefault(plan.shape, [])
        while len(buffers) < len(used):
            buffers.append(plan.spectrum_buffer())
        spectra = {
            k: plan.forward(fields[k], buf)
            for k, buf in zip(used, buffers[: len(used)], strict=True)
        }
        out = []
        for offset, indices in requests:
            offset = tuple(float(o) for o in offset)
            kernel = self._kernel(grid, offset, plan)
            window = tuple(slice(0, len(v)) for v in grid.lattice(offset))
            out.append([plan.convolve(kernel, spectra[k], window).reshape(-1) for k in indices])
        return out


def checked_total(total: np.ndarray) -> np.ndarray:
    """The denominators of an FFT evaluation; raises when round-off ate some of them."""
    if not np.all(total > 0):
        bad = int(np.count_nonzero(~(total > 0)))
        raise ValueError(
            f"attention.engine: the FFT lost {bad} kernel sums to round-off (the "
            f"kernel's dynamic range is too large for an FFT); use "
            f"engine='separable'"
        )
    return total
