#!/usr/bin/env python
"""The Clawpack peer row of the ADV2D benchmark (PyClaw with Fortran kernels).

Part of tpde's benchmarks: ``benchmarks/advection.py`` runs it in the Clawpack venv that
``benchmarks/setup_peers.sh`` creates (``benchmarks/_peers/venv``), beside the tpde rows;
problem, protocol and JSON line are those of ``benchmarks/peers/adv2d.py``.

    benchmarks/_peers/venv/bin/python benchmarks/peers/pyclaw_adv2d.py --n 256 --solver sharpclaw
    benchmarks/_peers/venv/bin/python benchmarks/peers/pyclaw_adv2d.py --n 256 --solver classic

sharpclaw: SharpClawSolver2D with the advection_2D Riemann solver, WENO reconstruction
           (lim_type 2, weno_order 5, no characteristic decomposition), time integrator
           SSP33 (the Shu-Osher SSP-RK3, as tpde's ssprk3), fixed dt: the same scheme
           family as tpde's WENO5-JS + SSP-RK3 rows.
classic:   ClawSolver2D, second order (Lax-Wendroff with limited corrections, MC limiter),
           unsplit with transverse waves (CTU) by default, --split for dimensional splitting.

Only ``solver.evolve_to_time(solution, T)`` is timed: no Controller and no output files
(``--controller`` times ``claw.run()`` of a Controller without output, for comparison).
"""

import adv2d  # noqa: F401, I001  (first: fixes the thread counts before numpy / Fortran)

import logging
import os
import tempfile
import time

import numpy as np
from adv2d import Problem, emit, make_parser, measure, report


def build(prob, q0, args):
    """The PyClaw solver and solution for ``prob`` starting from ``q0``."""
    # PyClaw's logging configuration creates ./pyclaw.log at import: import it elsewhere
    tmp = tempfile.TemporaryDirectory(prefix="pyclaw_adv2d_")
    cwd = os.getcwd()
    os.chdir(tmp.name)
    try:
        from clawpack import pyclaw, riemann
    finally:
        os.chdir(cwd)
    args._tmpdir = tmp  # removed at exit

    if args.solver == "sharpclaw":
        solver = pyclaw.SharpClawSolver2D(riemann.advection_2D)
        solver.lim_type = 2
        solver.weno_order = 5
        solver.char_decomp = 0
        solver.time_integrator = args.integrator
    else:
        solver = pyclaw.ClawSolver2D(riemann.advection_2D)
        solver.order = 2
        solver.limiters = pyclaw.limiters.tvd.MC
        solver.dimensional_split = bool(args.split)
        solver.transverse_waves = 0 if args.split else 2
    solver.cfl_max = 1.0
    solver.cfl_desired = 0.9
    solver.kernel_language = "Fortran"
    solver.dt_variable = False
    solver.dt_initial = prob.dt
    solver.max_steps = prob.nsteps + 10
    for axis in (0, 1):
        solver.bc_lower[axis] = pyclaw.BC.periodic
        solver.bc_upper[axis] = pyclaw.BC.periodic

    x = pyclaw.Dimension(0.0, 1.0, prob.n, name="x")
    y = pyclaw.Dimension(0.0, 1.0, prob.n, name="y")
    domain = pyclaw.Domain([x, y])
    state = pyclaw.State(domain, 1)
    state.problem_data["u"] = prob.ux  # advection_2D: u along x (axis 0 of q[0])
    state.problem_data["v"] = prob.uy
    state.q[0, :, :] = q0
    return pyclaw, solver, pyclaw.Solution(state, domain)


def main():
    p = make_parser(__doc__)
    p.add_argument("--solver", choices=["sharpclaw", "classic"], default="sharpclaw")
    p.add_argument("--integrator", default="SSP33", help="SharpClaw time_integrator (SSP33, ...)")
    p.add_argument("--split", action="store_true", help="classic: dimensional splitting")
    p.add_argument(
        "--controller",
        action="store_true",
        help="time claw.run() of a Controller (no output) instead of evolve_to_time",
    )
    args = p.parse_args()
    logging.getLogger("pyclaw").setLevel(logging.WARNING)
    prob = Problem(args.n, args.tfinal, args.cfl, args.profile)
    q0 = prob.field(0.0, "avg")
    pyclaw, solver, solution = build(prob, q0, args)
    solver.setup(solution)
    st = {}

    def reset():
        solution.t = 0.0
        # a fresh Fortran-ordered copy: the classic solver leaves q non-contiguous, which
        # Controller.check_validity rejects
        solution.state.q = np.asfortranarray(q0[np.newaxis, :, :])
        solver.dt = prob.dt
        solver.status["numsteps"] = 0
        if args.solver == "sharpclaw":
            solver.accept_step = True
            solver.dt_old = prob.dt
        if args.controller:
            claw = pyclaw.Controller()
            claw.solution = solution
            claw.solver = solver
            claw.tfinal = prob.tfinal
            claw.num_output_times = 1
            claw.output_format = None
            claw.keep_copy = False
            claw.verbosity = 0
            st["claw"] = claw

    def run():
        t0 = time.perf_counter()
        if args.controller:
            st["claw"].run()
        else:
            solver.evolve_to_time(solution, prob.tfinal)
        elapsed = time.perf_counter() - t0
        assert solver.status["numsteps"] == prob.nsteps, solver.status
        assert abs(solution.t - prob.tfinal) < 1e-12, solution.t
        return elapsed, np.array(solution.state.q[0])

    def warmup():  # a few untimed steps touch every work array
        reset()
        solver.evolve_to_time(solution, 2 * prob.dt)

    times, ref_times, q = measure(prob, reset, run, args.repeat, not args.no_ref, warmup)
    if args.solver == "sharpclaw":
        peer = "pyclaw-sharpclaw"
        scheme = (
            f"FV WENO5 (Shu's weno5, eps=1e-36, component-wise) + {args.integrator}, "
            "advection_2D Riemann solver (upwind), Fortran"
        )
    else:
        peer = "pyclaw-classic" + ("-split" if args.split else "")
        splitting = "Godunov dimensional splitting" if args.split else "unsplit CTU"
        scheme = f"Lax-Wendroff wave-propagation, MC limiter, {splitting}, Fortran"
    if args.controller:
        peer += "-controller"
    extra = {"ic": "cell_avg", "cflmax_seen": float(solver.status.get("cflmax", float("nan")))}
    res = report(
        prob, peer, scheme, times, ref_times, prob.errors(q, "avg"), extra, dists=("clawpack",)
    )
    emit(res)


if __name__ == "__main__":
    main()
