#!/usr/bin/env python
"""tpde as a row of the ADV2D benchmark (problem and protocol: benchmarks/peers/adv2d.py).

    .venv/bin/python benchmarks/adv2d_tpde.py --n 256 --repeat 3 [--reconstruction weno5]
    NUMBA_NUM_THREADS=2 .venv/bin/python benchmarks/adv2d_tpde.py ...   # 2 numba threads
    (TPDE_NUM_THREADS, tpde's own knob, defaults here to NUMBA_NUM_THREADS; the JSON records
    numba.get_num_threads() as numba_num_threads.)

tpde: FluxOperator with the chosen reconstruction (weno5 = WENO5-JS, the scheme SharpClaw
uses; weno5z = WENO5-Z), upwind face fluxes, positivity limiter on, SSP-RK3 (Shu-Osher),
fixed dt = prob.dt, prob.nsteps calls of Solver.step. ``--always-limit``: the limiter on
every stage with a negative value, as before round-off negatives were set to zero
(tpde.schemes.operator.NEGLIGIBLE_NEGATIVE = 0; the row before/after that change). The
constant velocity is evaluated on the faces once (steady field, cached) outside the timing,
as Solver.advance_to does.

The problem module (benchmarks/peers/adv2d.py) is imported before numpy / numba: it pins
NUMBA_NUM_THREADS=1 unless the caller set it.
"""

import os
import sys
from pathlib import Path

PEERS_DIR = Path(__file__).resolve().parent / "peers"
sys.path.insert(0, str(PEERS_DIR))

import adv2d  # noqa: E402, F401, I001  (must come first: pins thread counts)

# tpde sets numba's thread count itself (TPDE_NUM_THREADS, default 1): follow
# NUMBA_NUM_THREADS (pinned by adv2d) unless TPDE_NUM_THREADS is given explicitly.
os.environ.setdefault("TPDE_NUM_THREADS", os.environ["NUMBA_NUM_THREADS"])

import time  # noqa: E402

import numpy as np  # noqa: E402
from adv2d import Problem, emit, make_parser, measure, report  # noqa: E402

from tpde.grid import Grid  # noqa: E402
from tpde.schemes.solver import Problem as TpdeProblem  # noqa: E402
from tpde.schemes.solver import Scheme, Solver  # noqa: E402
from tpde.variants import ConstantVelocity  # noqa: E402

SCHEMES = {
    "weno5": "WENO5-JS (eps=1e-40)",
    "weno5z": "WENO5-Z (p=2, eps=1e-40)",
}


def main():
    p = make_parser(__doc__)
    p.add_argument(
        "--reconstruction",
        default="weno5",
        help="tpde reconstruction (weno5 = WENO5-JS as SharpClaw; weno5z, muscl, ...)",
    )
    p.add_argument(
        "--no-positivity",
        action="store_true",
        help="switch tpde's positivity limiter off (SharpClaw has none)",
    )
    p.add_argument(
        "--always-limit",
        action="store_true",
        help="limit every stage with a negative value (no round-off clip)",
    )
    args = p.parse_args()
    if args.always_limit:
        from tpde.schemes import operator

        operator.NEGLIGIBLE_NEGATIVE = 0.0
    prob = Problem(args.n, args.tfinal, args.cfl, args.profile)
    q0 = prob.field(0.0, "avg")

    # ---- (1) build the solver once, outside the timing -------------------------------------
    n = prob.n
    grid = Grid([0.0, 0.0], [1.0, 1.0], [n, n], "periodic")
    scheme = Scheme(
        reconstruction=args.reconstruction,
        integrator="ssprk3",
        dt=prob.dt,
        positivity=not args.no_positivity,
    )
    solver = Solver(
        TpdeProblem(grid, q0, ConstantVelocity([prob.ux, prob.uy]), prob.tfinal, scheme=scheme)
    )
    vel = solver.face_velocity(solver.density, 0.0)  # steady: evaluated once, cached
    bound = solver.stable_dt(vel)
    if prob.dt > bound * (1 + 1e-12):
        raise SystemExit(f"dt = {prob.dt:.4g} exceeds tpde's positivity bound {bound:.4g}")

    def reset():  # ---- (2) reset the state to q0 (untimed)
        solver.density[...] = q0
        solver.t = 0.0
        solver.steps = 0
        solver.outflow = 0.0

    st = {}

    def run():  # ---- (3) exactly prob.nsteps steps of prob.dt
        dt, nsteps, step = prob.dt, prob.nsteps, solver.step
        limited0 = getattr(solver.operator, "limited_steps", None)  # absent in newer tpde
        clipped0 = getattr(solver.operator, "clipped_steps", None)
        t0 = time.perf_counter()
        for _ in range(nsteps):
            step(dt, vel)
        el = time.perf_counter() - t0
        st["limited_stages"] = (
            None if limited0 is None else solver.operator.limited_steps - limited0
        )
        st["clipped_stages"] = (
            None if clipped0 is None else solver.operator.clipped_steps - clipped0
        )
        assert solver.steps == nsteps, solver.steps
        assert abs(solver.t - prob.tfinal) < 1e-12, solver.t
        return el, np.array(solver.density)

    def warmup():  # JIT compile (or load the numba cache) and first touch of the work arrays
        reset()
        for _ in range(3):
            solver.step(prob.dt, vel)

    times, ref_times, q = measure(prob, reset, run, args.repeat, not args.no_ref, warmup)
    recon = SCHEMES.get(args.reconstruction, args.reconstruction)
    scheme_desc = (
        f"FV {recon} component-wise, upwind face flux, positivity limiter "
        f"{'on' if scheme.positivity else 'off'}, "
        "SSP-RK3 (Shu-Osher), fixed dt, numba kernels "
        f"(NUMBA_NUM_THREADS={os.environ.get('NUMBA_NUM_THREADS')})"
    )
    extra = {
        "ic": "cell_avg",
        "reconstruction": args.reconstruction,
        "positivity": scheme.positivity,
        "limited_stages_last_run": st["limited_stages"],
        "clipped_stages_last_run": st["clipped_stages"],
        "always_limit": args.always_limit,
        "stages_last_run": 3 * prob.nsteps,
        "peers_dir": str(PEERS_DIR),
    }
    try:
        import numba

        extra["numba_threading_layer"] = numba.threading_layer()
        extra["numba_num_threads"] = numba.get_num_threads()
        extra["tpde_num_threads_env"] = os.environ.get("TPDE_NUM_THREADS")
    except (ImportError, ValueError):
        pass
    res = report(
        prob,
        "tpde",
        scheme_desc,
        times,
        ref_times,
        prob.errors(q, "avg"),
        extra=extra,
        dists=("tpde", "numba"),
    )
    emit(res)


if __name__ == "__main__":
    main()
