"""The ``tpde`` command line (console script).

    tpde run CONFIG.toml [-o OUT.nc|OUT.zarr] [--resume] [--overwrite] [--quiet] [--profile]
             [--threads N]
    tpde gaussian CONFIG.toml [-o OUT.nc] [--overwrite] [--threads N]
    tpde particles CONFIG.toml --tokens N [--seed S | --quantiles] [-o OUT.nc] [--overwrite]
             [--threads N]
    tpde info FILE.nc                       # a run, gaussian, particles or sweep summary file
    tpde plot FILE.nc [-o DIR] [--animate] [--times T ...] [--log] [--vmin V] [--vmax V]
              [--title TEXT]
    tpde compare RUN.nc [PARTICLES.nc ...] [GAUSSIAN.nc] [-o FIG.png] [--time T] [--log] ...
    tpde --version
    tpde validate [--suite quick|full] [-o DIR] [--threads N]
    tpde sweep SWEEP.toml [--scheduler ADDRESS] [--workers N] [--threads N] [-o DIR] [--quiet]
    tpde continue CONFIG.toml [-o OUT.nc] [--workers N]   # stationary branches / phase diagram

``--threads N``: the threads of the compiled loops (default: the cores that other processes
leave free, at least one; a sweep splits the cores between its workers; docs/user-guide.md,
'Threads'); it overrides ``TPDE_NUM_THREADS``.

Exit codes (docs/user-guide.md, 'The command line'): 0 success (a detected blow-up or mass
leaving the box is a result, stored in the file's ``status``), 2 bad input (one line on stderr
naming the key and the fix; existing output is never touched; also an output that another
tpde process is writing), 1 a failure during the run (one line: the exception, or a full
disk; the file records it as status ``error``), 128 + the signal number for SIGINT (130),
SIGTERM (143) and SIGHUP (129) (the file says ``interrupted`` and how to resume). No command
prints a traceback unless ``--debug`` is given. ``tpde sweep`` exits 0 when every run is
accounted for (failed runs are results, listed in the summary), 2 for a bad sweep file, 1 when
the sweep itself cannot go on (e.g. no scheduler at ADDRESS).
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import traceback
import warnings
from pathlib import Path


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints usage + message)
        self.exit(
            2,
            f"tpde: {message}; see tpde {self.prog.split()[-1]} --help\n"
            if " " in self.prog
            else f"tpde: {message}; see tpde --help\n",
        )


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,  # (a subcommand's default would hide `tpde --debug run`)
        help="print the traceback of a failure (else one line)",
    )
    parser = _Parser(prog="tpde", description="Transformer PDE on grids.", parents=[common])
    parser.add_argument("--version", action="version", version=f"tpde {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add = sub.add_parser

    def add_parser(name: str, **kwargs):  # every command takes --debug
        return _add(name, parents=[common], **kwargs)

    sub.add_parser = add_parser  # type: ignore[method-assign]
    run = sub.add_parser("run", help="run a TOML configuration, write NetCDF")
    run.add_argument("config", type=Path, help="TOML configuration (see docs/user-guide.md)")
    run.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="NetCDF output, or a Zarr store if it ends in .zarr (default: run.output)",
    )
    run.add_argument("--resume", action="store_true", help="continue an interrupted output")
    run.add_argument("--overwrite", action="store_true", help="replace an existing output")
    run.add_argument("--quiet", action="store_true", help="no progress output")
    run.add_argument(
        "--profile",
        action="store_true",
        help="time the phases (velocity tables, interpolation, fluxes, limiter, I/O) and "
        "print their table to stderr after the run",
    )
    _threads_option(run)
    for name, what in (
        ("gaussian", "the Gaussian mean/covariance ODEs of a configuration"),
        ("particles", "the token system of a configuration"),
    ):
        ref = sub.add_parser(name, help=f"{what}, written to NetCDF")
        ref.add_argument("config", type=Path, help="TOML configuration (as for tpde run)")
        ref.add_argument(
            "-o",
            "--output",
            type=Path,
            default=None,
            help=f"NetCDF output (default: run.output with _{name} appended)",
        )
        ref.add_argument("--overwrite", action="store_true", help="replace an existing output")
        if name == "particles":
            ref.add_argument("--tokens", type=int, required=True, help="number of tokens n")
            ref.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
            ref.add_argument(
                "--quantiles",
                action="store_true",
                help="1-D and the circle: the deterministic mid-quantile tokens of the initial "
                "density (the mean field without sampling noise) instead of i.i.d. samples",
            )
        _threads_option(ref)
    info = sub.add_parser(
        "info", help="summarise a tpde NetCDF file (run, gaussian, particles, sweep summary)"
    )
    info.add_argument("file", type=Path)
    plot = sub.add_parser(
        "plot", help="figures of a tpde NetCDF file (run, gaussian, particles, sweep summary)"
    )
    plot.add_argument("file", type=Path)
    plot.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="figure directory (default: next to the file, <name>_figures)",
    )
    plot.add_argument("--animate", action="store_true", help="also write an animation")
    _figure_options(plot, "--times")
    plot.add_argument(
        "--frame-space",
        action="store_true",
        help="a co-moving-frame run: draw the frame's grid instead of physical space",
    )
    compare = sub.add_parser(
        "compare",
        help="one configuration's grid run, tokens and Gaussian ODE side by side",
        description="Draw RUN.nc (tpde run) next to the outputs of tpde particles and tpde "
        "gaussian for the same config (either may be left out): densities, moments and "
        "their differences, W2 distances, energies.",
    )
    compare.add_argument("run", type=Path, help="the grid run (tpde run)")
    compare.add_argument(
        "references",
        type=Path,
        nargs="*",
        help="PARTICLES.nc (several on the circle and the sphere: seeds, drawn as a band) "
        "and/or GAUSSIAN.nc, any order",
    )
    compare.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="figure file (default: next to RUN, <name>_compare.png)",
    )
    _figure_options(compare, "--time")
    validate = sub.add_parser("validate", help="run the validation suite and write a report")
    validate.add_argument(
        "--suite",
        choices=("quick", "full"),
        default="quick",
        help="quick: 18 checks (11 min measured on 2 busy cores); full: 31 checks (22 min)",
    )
    validate.add_argument(
        "-o",
        "--output",
        default="validation-report",
        type=Path,
        help="report directory (report.md and figures; default ./validation-report)",
    )
    _threads_option(validate)
    cont = sub.add_parser(
        "continue", help="stationary branches by continuation in eps (or a phase diagram)"
    )
    cont.add_argument(
        "config", type=Path, help="TOML with a [continuation] table (docs/user-guide.md)"
    )
    cont.add_argument("-o", "--output", type=Path, default=None, help="NetCDF output")
    cont.add_argument("--workers", type=int, default=None, help="dask workers of a phase diagram")
    sweep = sub.add_parser("sweep", help="run a parameter grid of configurations on dask")
    sweep.add_argument(
        "sweep", type=Path, help="sweep TOML (see docs/user-guide.md, Parameter sweeps)"
    )
    sweep.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="an existing dask.distributed scheduler (tcp://host:8786); default: a local cluster",
    )
    sweep.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes of the local cluster (default: every core)",
    )
    _threads_option(
        sweep,
        "threads of each run (default: the cores split between the local cluster's workers; "
        "one on a --scheduler's workers unless they set TPDE_NUM_THREADS)",
    )
    sweep.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="output directory (default: output of the sweep file)",
    )
    sweep.add_argument(
        "--security",
        type=Path,
        default=None,
        metavar="FILE",
        help="TLS settings for --scheduler (TOML: ca_file, cert, key; docs/user-guide.md)",
    )
    sweep.add_argument(
        "--force",
        action="store_true",
        help="run a sweep of more runs than the limit (tpde.sweep.MAX_RUNS)",
    )
    sweep.add_argument("--quiet", action="store_true", help="no progress line")
    return parser


def _threads(text: str) -> int:
    from tpde.grid.threads import parse_threads

    try:
        return parse_threads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None


def _threads_option(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    parser.add_argument(
        "--threads",
        type=_threads,
        default=None,
        metavar="N",
        help=help
        or "threads of the compiled loops (default: the cores other processes leave free, "
        "at least one; overrides TPDE_NUM_THREADS)",
    )


def _fail(message: str) -> int:
    print(f"tpde: {message}", file=sys.stderr)
    return 2


def _build(path: Path):
    """tpde.config.build, its warnings shown as one line each once it succeeds (a config
    that fails gets its one error line only)."""
    from tpde.config import build

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = build(path)
    for warning in caught:
        _one_line_warning(warning.message, warning.category, "", 0)
    return config


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = " ".join(str(message).split())
    print(f"tpde: warning: {text}", file=sys.stderr)


def _kept(output: Path) -> str:
    """What a failed or interrupted run left, for its one-line message."""
    from tpde import io

    if io.is_zarr(output):  # not resumable: the run's NetCDF file is all there is
        staging = Path(io.zarr_staging(output))
        kept = f"its snapshots are in {staging}" if staging.is_file() else "nothing was written"
        return f"{kept} ({output} is not resumed: run again with --overwrite)"
    staged = Path(io.staged_name(output))
    if not Path(output).exists() and not staged.is_file():
        return f"nothing was written to {output}"
    if staged.is_file():
        return (
            f"{output} is unchanged; the new run is in {staged} (--resume continues it and "
            "replaces the old file when it completes)"
        )
    return f"{output} keeps every complete snapshot"


def cmd_run(args) -> int:
    from tpde import io
    from tpde.config import ConfigError
    from tpde.run import error_line, profiled, run_config

    output, started = args.output, False
    try:
        config = _build(args.config)
        output = args.output or (Path(config.output) if config.output else None)
        if output is None:
            return _fail("run.output: no output file; pass -o OUT.nc")
        if args.resume and args.overwrite:
            return _fail("run: --resume and --overwrite exclude each other; choose one")
        started = True
        with profiled(args.profile):
            path = run_config(
                config,
                output,
                overwrite=args.overwrite,
                resume=args.resume,
                quiet=args.quiet,
                history=" ".join(["tpde"] + sys.argv[1:]),
            )
    except (ConfigError, io.OutputError) as exc:
        return _fail(str(exc).splitlines()[0])
    except KeyboardInterrupt as exc:  # SIGINT, SIGTERM, SIGHUP (tpde.run.Interrupted)
        if getattr(args, "debug", False):
            traceback.print_exc()
        signum = int(getattr(exc, "signum", signal.SIGINT))
        if not started:
            print(f"tpde: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
            return 128 + signum
        resume = f"; continue with: tpde run {args.config} -o {output} --resume"
        print(
            f"tpde: interrupted by {signal.Signals(signum).name}; {_kept(output)}"
            + ("" if io.is_zarr(output) else resume),
            file=sys.stderr,
        )
        return 128 + signum
    except io.DiskFull as exc:
        if getattr(args, "debug", False):
            traceback.print_exc()
        kept = _kept(output)
        then = (
            "run it again"
            if kept.startswith("nothing") or io.is_zarr(output)
            else f"continue with: tpde run {args.config} -o {output} --resume"
        )
        print(f"tpde: {exc}; {kept}: free space, then {then}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - any failure: one line, recorded in the file
        if getattr(args, "debug", False):
            traceback.print_exc()
        staged = Path(io.staged_name(output)) if output is not None else None
        if staged is not None and staged.is_file():
            kept = f"{output} is unchanged; the failed run is in {staged} (status error)"
        elif output is not None and Path(output).exists() and started:
            kept = f"{output} records it (status error)"
        else:
            kept = "nothing was written"
        print(
            f"tpde: error: {error_line(exc)}; {kept}"
            + ("" if getattr(args, "debug", False) else "; --debug prints the traceback"),
            file=sys.stderr,
        )
        return 1
    if not args.quiet:
        print(f"{path}: status {io.outcome(path).status}", file=sys.stderr)
    # what the monitor recorded and let the run go on past (box_action or
    # resolution_action = "warn") is said here too, not only in the file: --quiet drops the
    # progress, never a warning
    for line in io.events(path):
        if line.split(" ", 1)[0] in WARNED_EVENTS:
            print(f"tpde: warning: {' '.join(line.split())[:600]}", file=sys.stderr)
    return 0


#: the events a run records and goes on past, said on stderr when it ends (--quiet too)
WARNED_EVENTS = ("box_limited", "under_resolved", "pinned")


def cmd_reference(args) -> int:
    from tpde.config import ConfigError
    from tpde.references import gaussian_reference, particle_reference, write_reference

    try:
        config = _build(args.config)
        output = args.output
        if output is None:
            base = Path(config.output or "out.nc")
            output = base.with_name(f"{base.stem}_{args.command}.nc")
        if output.exists() and not args.overwrite:
            return _fail(f"run.output: {output} exists; pass --overwrite to replace it")
        if args.command == "gaussian":  # (refused where the geometry has no closure)
            ds = gaussian_reference(config)
        else:  # a geometry's own tokens where it has them (config.particles)
            ds = particle_reference(config, args.tokens, args.seed, quantiles=args.quantiles)
        path = write_reference(ds, output, overwrite=args.overwrite)
    except ConfigError as exc:
        return _fail(str(exc))
    print(f"{path}: {ds.sizes['time']} times, status {ds.attrs['status']}")
    return 0


def _version() -> str:
    import tpde

    return tpde.__version__


def _figure_options(parser: argparse.ArgumentParser, times: str) -> None:
    """The density figure's options: times, colour scale, title."""
    if times == "--times":
        parser.add_argument(
            "--times",
            type=float,
            nargs="+",
            default=None,
            metavar="T",
            help="draw the snapshots nearest these times (default: 5 evenly spaced)",
        )
    else:
        parser.add_argument(
            "--time",
            type=float,
            default=None,
            metavar="T",
            help="the density panels' time (default: the run's last snapshot)",
        )
    parser.add_argument("--log", action="store_true", help="logarithmic colour scale")
    parser.add_argument("--vmin", type=float, default=None, help="lower colour limit")
    parser.add_argument("--vmax", type=float, default=None, help="upper colour limit")
    parser.add_argument("--title", default=None, help="figure title (default: the file's)")


def _summary_file(path: Path) -> bool:
    """Whether ``path`` is a sweep's summary.nc (its attributes say so)."""
    import netCDF4

    try:
        with netCDF4.Dataset(path) as nc:
            names = set(nc.ncattrs())
    except OSError:
        return False
    return {"sweep", "parameters"} <= names


def _geometry(path: Path):
    """The registration of ``path``'s geometry (tpde.geometries; flat for anything that is
    not a file with a ``geometry`` attribute)."""
    from tpde import geometries

    return geometries.of_file(path) if path.is_file() else geometries.FLAT


def _open(path: Path):
    """The Dataset of a tpde output (:func:`tpde.io.read`: every geometry's file)."""
    from tpde import io

    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return io.read(path)
    except (OSError, ValueError, RuntimeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{path}: not a readable tpde NetCDF output ({reason})") from None


def cmd_info(args) -> int:
    import numpy as np

    from tpde.io import Outcome, grid_from_dataset, staged_name

    if args.file.is_file() and _summary_file(args.file):
        return _info_summary(args.file)
    if args.file.is_file() and args.file.suffix == ".nc":
        from tpde.continuation import info

        lines = info(args.file)  # a file of `tpde continue`
        if lines is not None:
            print("\n".join(lines))
            return 0
    from tpde import geometries

    geometry = _geometry(args.file)  # what differs: its mesh and state lines (tpde.geometries)
    try:
        ds = _open(args.file)
        grid = geometries.load(geometry.mesh)(ds) if geometry.mesh else grid_from_dataset(ds)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        return _fail(str(exc))
    times = ds["time"].values
    what = {"particles": "token system", "gaussian": "Gaussian ODE", "run": "grid run"}
    print(f"{args.file}: {what[_kind(ds)]}, {grid.describe()}")
    if "s" in ds.dims:
        print(
            f"  masked attention: {ds.sizes['s'] - 1} positions in (0, 1] plus the sink "
            f"at s = 0 (mass {float(ds.attrs.get('sink_mass', float('nan'))):g})"
        )
    if times.size:
        print(f"  snapshots: {times.size}, t = {times[0]:.6g} .. {times[-1]:.6g}")
    else:
        print("  snapshots: none yet")
    if "tokens" in ds.variables:
        sampling = str(ds.attrs.get("sampling", "i.i.d."))[:40]
        drawn = "" if sampling == "mid-quantiles" else f", seed {ds.attrs.get('seed', '?')}"
        print(f"  tokens: {ds.sizes['token']} ({sampling}{drawn})")
    outcome = Outcome.from_attributes(ds.attrs)  # attributes are untrusted text
    print("  " + status_line(outcome, times))
    if Path(staged_name(args.file)).is_file():
        print(
            f"  a run replacing this file is pending in {staged_name(args.file)} "
            "(tpde run ... --resume continues it)"
        )
    if times.size:
        outflow = f", outflow {float(ds['outflow'][-1]):.3e}" if "outflow" in ds else ""
        print(f"  mass {float(ds['mass'][-1]):.12g}{outflow}")
    if geometry.info is not None:
        for line in geometries.load(geometry.info)(ds, grid):
            print(line)
    elif times.size and "s" not in ds.dims and _kind(ds) == "run":
        for line in grid.state_lines(np.asarray(ds["density"][-1].values, dtype=float)):
            print(line)
    energies = [str(n)[len("energy_") :] for n in ds.data_vars if str(n).startswith("energy_")]
    if energies:
        print(f"  energies: {', '.join(energies)}")
    if "frame_matrix" in ds and times.size:
        L = np.asarray(ds["frame_matrix"][-1].values, dtype=float)
        print(
            "  co-moving affine frame: x = m + L xi; at the last snapshot |det L| = "
            f"{abs(float(np.linalg.det(L))):.6g}, eigenvalues of the covariance "
            + ", ".join(f"{v:.4g}" for v in np.linalg.eigvalsh(ds["covariance"][-1].values))
        )
    if "largest_truncation" in ds.attrs:
        print(
            "  box: the largest share of the mass the box cut off (run.box_tolerance "
            "compares with it): " + _number_text(ds.attrs["largest_truncation"])
        )
    if "reconstruction_error" in ds.attrs:
        print(
            "  resolution: estimated relative error the cells' reconstruction made over the "
            "run, of the mass placement or of the covariance, whichever is larger "
            "(run.resolution_tolerance compares with it): "
            + _number_text(ds.attrs["reconstruction_error"])
        )
    from tpde.atoms_io import atom_lines

    for line in atom_lines(ds):  # the clusters held as atoms, their births and merges
        print(line)
    for line in str(ds.attrs.get("events", "")).splitlines()[:50]:  # untrusted text
        print(f"  event: {' '.join(line.split())[:300]}")
    print("  " + _provenance(ds.attrs))
    print("  config:\n    " + str(ds.attrs.get("config", "")).replace("\n", "\n    "))
    return 0


def _number_text(value) -> str:
    """A file attribute holding a number, shown to 2 significant digits (attributes are
    untrusted: anything else is shown as text, at most 40 characters)."""
    try:
        return f"{float(value):.2g}"
    except (TypeError, ValueError):
        return " ".join(str(value).split())[:40]


def status_line(outcome, times) -> str:
    """``status: ... at t = ...`` of a file, said as a user reads it: no dangling colon
    without a message, and a file whose writer never recorded an end (killed, or still
    running) says so and names its last complete snapshot instead of ``t = nan``."""
    message = " ".join(outcome.message.split())[:500]
    if outcome.status == "running" and not math.isfinite(outcome.time):
        last = f"t = {times[-1]:.6g}" if len(times) else "none yet"
        return (
            "status: running: no end recorded (the run was killed or is still running); "
            f"last complete snapshot: {last}; tpde run CONFIG -o FILE --resume continues it"
        )
    reason = f" ({outcome.reason})" if outcome.reason else ""  # an error's typed cause
    return f"status: {outcome.status}{reason} at t = {outcome.time:.6g}" + (
        f": {message}" if message else ""
    )


def _kind(ds) -> str:
    from tpde.plots import _kind as kind

    return kind(ds)


def _provenance(attrs) -> str:
    """tpde version, threads, steps, rejected steps and wall time, those the file records
    (attributes are untrusted: shown as text, at most 40 characters each)."""

    def show(name: str) -> str:
        return " ".join(str(attrs.get(name)).split())[:40]

    version = show("tpde_version") if "tpde_version" in attrs else show("source")
    parts = [f"written by tpde {version.removeprefix('tpde ')}"]
    if "threads" in attrs:
        parts.append(f"threads {show('threads')}")
    if "steps" in attrs:
        rejected = f" ({show('rejected_steps')} rejected)" if "rejected_steps" in attrs else ""
        parts.append(f"steps {show('steps')}{rejected}")
    if "wall_time" in attrs:
        try:
            parts.append(f"wall time {float(attrs['wall_time']):.3g} s")
        except (TypeError, ValueError):
            parts.append(f"wall time {show('wall_time')}")
    return ", ".join(parts)


def _info_summary(path: Path) -> int:
    from tpde.sweep import outcome_counts, read_summary

    try:
        ds = read_summary(path)
    except (OSError, ValueError, KeyError) as exc:
        return _fail(f"{path}: not a readable sweep summary ({str(exc).splitlines()[0]})")
    a = ds.attrs
    keys = json.loads(str(a.get("parameters", "[]")))
    print(f"{path}: sweep summary, {ds.sizes['run']} runs over {len(keys)} parameters")
    for key in keys:
        values = list(dict.fromkeys(str(v) for v in ds[key].values))
        shown = ", ".join(values[:8]) + (", ..." if len(values) > 8 else "")
        print(f"  {key}: {len(values)} values ({shown})")
    print(f"  outcomes: {outcome_counts(a)}; skipped {a.get('skipped', '?')}")
    print(f"  phase diagram axes: x {a.get('phase_x', '?')}, y {a.get('phase_y') or '-'}")
    print(f"  written by tpde {a.get('tpde_version', '?')}; runs in {a.get('output', '?')}")
    return 0


def cmd_plot(args) -> int:
    from tpde.plots import plot_all

    outdir = args.output or args.file.with_name(args.file.stem + "_figures")
    if outdir.exists() and not outdir.is_dir():
        return _fail(f"plot: -o {outdir} exists and is not a directory; choose another path")
    if args.file.is_file() and _summary_file(args.file):
        from tpde.sweep import plot_phase, read_summary

        outdir.mkdir(parents=True, exist_ok=True)
        print(plot_phase(read_summary(args.file), outdir / "phase.png"))
        return 0
    geometry = _geometry(args.file)
    if geometry.plot is not None:  # the geometry's own figure set (tpde.geometries)
        from tpde import geometries

        try:
            plot = geometries.load(geometry.plot)
            paths = plot(args.file, outdir, times=args.times, title=args.title)
        except ValueError as exc:
            return _fail(str(exc).splitlines()[0])
        for path in paths:
            print(path)
        return 0
    try:
        ds = _open(args.file)
    except (FileNotFoundError, ValueError) as exc:
        return _fail(str(exc))
    reference = gaussian_reference(ds)
    try:
        paths = plot_all(
            ds,
            outdir,
            reference=reference,
            animate_density=args.animate,
            times=args.times,
            log=args.log,
            vmin=args.vmin,
            vmax=args.vmax,
            title=args.title,
            frame_space=args.frame_space,
        )
    except ValueError as exc:  # a bad option (vmin >= vmax, ...) or an unusable file
        return _fail(str(exc).splitlines()[0])
    for path in paths:
        print(path)
    return 0


def cmd_compare(args) -> int:
    from tpde.geometries import FLAT
    from tpde.plots import compare_figure

    geometry = _geometry(args.run)
    own_files = geometry.layout is not FLAT.layout  # (references: files of its own layout)
    for path in args.references if own_files else ():
        if _geometry(path) is not geometry:
            return _fail(
                f"compare: {path} is not a {geometry.name} file; give token runs of the run's "
                f"config (tpde particles CONFIG --seed S), the {geometry.name} has no Gaussian "
                "closure"
            )
    try:
        run = _open(args.run)
        found: dict = {}  # kind -> Dataset
        tokens: list = []  # tpde particles files (several seeds: a band on the circle)
        for path in args.references:
            ds = _open(path)
            kind = "particles" if own_files else _kind(ds)  # (the geometry checks its own)
            if kind == "particles":
                tokens.append(ds)
                continue
            if kind == "run" or kind in found:
                return _fail(
                    f"compare: {path} is a {'grid run' if kind == 'run' else kind} output; "
                    "give tpde particles files and at most one tpde gaussian file after RUN"
                )
            found[kind] = ds
        target = args.output or args.run.with_name(args.run.stem + "_compare.png")
        fig = compare_figure(
            run,
            tokens or None,
            found.get("gaussian"),
            args.time,
            log=args.log,
            vmin=args.vmin,
            vmax=args.vmax,
            title=args.title,
        )
    except (FileNotFoundError, ValueError, KeyError) as exc:
        return _fail(str(exc).splitlines()[0])
    fig.savefig(target, dpi=110, bbox_inches="tight", pad_inches=0.05)
    print(target)
    return 0


def gaussian_reference(ds) -> dict | None:
    """The Gaussian-ODE solution for a run that started Gaussian with a closed-form variant
    (``tpde gaussian`` on the config stored in the file), or None."""
    from tpde.config import ConfigError, build
    from tpde.references import gaussian_reference as reference

    try:  # an attribute is untrusted text: build checks it (memory included) like any config
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ode = reference(build(str(ds.attrs.get("config", ""))))
    except (ConfigError, ValueError, ArithmeticError, MemoryError):
        return None
    return {
        "time": ode["time"].values,
        "mean": ode["mean_position"].values,
        "covariance": ode["covariance"].values,
    }


def cmd_validate(args) -> int:
    from tpde.validation.suite import run_suite

    if args.output.exists() and not args.output.is_dir():
        return _fail(
            f"validate: -o {args.output} exists and is not a directory; choose another path"
        )
    report = run_suite(
        args.suite, args.output, log=lambda text: print(f"  {text}", file=sys.stderr, flush=True)
    )
    failed = [c for c in report.checks if not c.passed]
    for check in report.checks:
        print(
            f"{'PASS' if check.passed else 'FAIL'}  {check.name}: {check.value:.3e} "
            f"({check.limit()})"
        )
    print(
        f"{len(report.checks) - len(failed)}/{len(report.checks)} checks passed; "
        f"report: {args.output / 'report.md'}"
    )
    return 1 if failed else 0


def cmd_continue(args) -> int:
    from tpde.config import ConfigError
    from tpde.continuation import run_file

    try:
        ds, (out, figure) = run_file(args.config, args.output, args.workers)
    except ConfigError as exc:
        return _fail(str(exc))
    a = ds.attrs
    if "eps_threshold" in a:
        print(
            f"{a['geometry']} beta = {a['beta']:g} ({a['model']}): threshold "
            f"{a['eps_threshold']:.10g} (closed form {a['eps_threshold_closed_form']:.10g}), "
            f"{a['transition']}, fold {a['eps_fold']:.10g}, first-order "
            f"{a['eps_first_order']:.10g}; branch ended: {a['status']} at eps = "
            f"{a['status_eps']:.6g}"
        )
    else:
        print(f"phase diagram over {ds.sizes['beta']} betas ({a['geometry']}, {a['model']})")
    print(f"output: {out}\nfigure: {figure}")
    return 0


def cmd_sweep(args) -> int:
    from collections import Counter

    from tpde.config import ConfigError
    from tpde.sweep import outcome_counts, run_sweep

    try:
        ds = run_sweep(
            args.sweep,
            scheduler=args.scheduler,
            workers=args.workers,
            progress=not args.quiet,
            output=args.output,
            force=args.force,
            security=args.security,
            threads=args.threads,
        )
    except ConfigError as exc:
        return _fail(str(exc))
    except (OSError, TimeoutError) as exc:  # no scheduler at --scheduler ADDRESS, ...
        print(f"tpde: sweep: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    a = ds.attrs
    ranks = Counter(
        int(r)
        for r, o in zip(ds["rank"].values, ds["outcome"].values, strict=True)
        if o == "converged"
    )
    by_rank = ", ".join(f"rank {r}: {n}" for r, n in sorted(ranks.items()))
    print(f"{a['runs']} runs: {outcome_counts(a, by_rank)}; {a['skipped']} skipped (done before)")
    out = Path(a["output"])
    print(f"runs: {out / 'runs'}\nsummary: {out / 'summary.nc'}\nfigure: {out / 'phase.png'}")
    return 0


COMMANDS = {
    "continue": cmd_continue,
    "run": cmd_run,
    "info": cmd_info,
    "plot": cmd_plot,
    "compare": cmd_compare,
    "validate": cmd_validate,
    "gaussian": cmd_reference,
    "particles": cmd_reference,
    "sweep": cmd_sweep,
}


def main(argv: list[str] | None = None) -> int:
    """Run one command. Whatever fails prints one line on stderr (``tpde: ...``) and no
    traceback unless ``--debug``: bad input exits 2, a failure 1, a signal 128 + its
    number; warnings are shown as one line each."""
    args = build_parser().parse_args(argv)
    debug = bool(getattr(args, "debug", False))
    show = warnings.showwarning
    if not debug:
        warnings.showwarning = _one_line_warning
    try:
        if getattr(args, "threads", None) is not None and args.command != "sweep":
            from tpde.grid.threads import set_num_threads

            set_num_threads(args.threads)  # (a sweep passes it to its runs)
        return COMMANDS[args.command](args)
    except BrokenPipeError:  # `tpde info out.nc | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as exc:
        if debug:
            traceback.print_exc()
        signum = int(getattr(exc, "signum", signal.SIGINT))
        print(f"tpde: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum
    except Exception as exc:  # noqa: BLE001 - one line, the traceback with --debug
        from tpde.config import ConfigError
        from tpde.io import OutputError
        from tpde.run import error_line

        if isinstance(exc, ConfigError | OutputError):
            return _fail(str(exc).splitlines()[0])
        if debug:
            traceback.print_exc()
        print(
            f"tpde: error: {error_line(exc)}"
            + ("" if debug else " (--debug prints the traceback)"),
            file=sys.stderr,
        )
        return 1
    finally:
        warnings.showwarning = show


if __name__ == "__main__":
    sys.exit(main())
