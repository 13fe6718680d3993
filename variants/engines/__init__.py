"""Kernel-sum engines: how the sums over the density behind the attention variants are
computed, independent of which variant asks.

Every engine answers one question for a weight field ``w`` on the grid and tilts ``c``:
the log-partition ``log sum_s w_s e^{c.y_s}`` and the tilted mean ``m(c)``
(:class:`~tpde.variants.engines.direct.DirectSums`,
:class:`~tpde.variants.engines.separable.SeparableSums`); the FFT engine answers the same
sums for symmetric matrices by convolution. What every engine (flat, circle, sphere,
sigmoid's) provides is one interface, :class:`~.protocol.KernelSums` (adapters:
:mod:`tpde.variants.kernel_sums`), and their names one vocabulary (:mod:`.registry`).
Modules:

* :mod:`.protocol` -- the KernelSums Protocol (name, tolerance, log_partition, means,
  error).
* :mod:`.registry` -- every engine's name, the names each geometry's ``engine`` takes,
  aliases, :func:`~.registry.check_engine`.
* :mod:`.direct` -- dense reference sums, blocked over targets.
* :mod:`.separable` -- tensor tables of the moment-generating function, one matrix product
  per axis, interpolated to the tilts; :func:`~.separable.resolved_sums` sizes them a
  posteriori.
* :mod:`.sheared`, :mod:`.sheared3d` -- a 2-D / 3-D table taken to a lattice by sheared
  1-D interpolation passes.
* :mod:`.lagrange` -- the compiled 12-point Lagrange kernels (one source file: numba's
  cache is per file).
* :mod:`.fft` -- convolutions for symmetric matrices.
* :mod:`.bessel` -- the circle's Jacobi-Anger series for any 2 x 2 matrix.
* :mod:`.products` -- table products split over numba's workers.
* :mod:`.cache` -- a bounded cache for what is fixed while parameters and grid are.
* :mod:`.sphere_harmonics` -- the sphere's sums by spherical harmonics (the plane-wave
  expansion, non-uniform transforms).
"""
