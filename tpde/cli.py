"""The ``tpde`` command line (console script). Subcommands: ``validate``.

Bad arguments exit with status 2 and a one-line message; ``validate`` exits with 1 when a
check fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tpde", description="Transformer PDE on grids.")
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", help="run the validation suite and write a report")
    validate.add_argument("--suite", choices=("quick", "full"), default="quick",
                          help="quick: about a minute on 2 cores; full: about 15 minutes")
    validate.add_argument("-o", "--output", default="validation-report", type=Path,
                          help="report directory (report.md and figures; default "
                               "./validation-report)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "validate":
        from tpde.validate import run_suite

        if args.output.exists() and not args.output.is_dir():
            print(f"tpde validate: -o {args.output} exists and is not a directory; choose "
                  f"another path", file=sys.stderr)
            return 2
        report = run_suite(args.suite, args.output,
                           log=lambda text: print(f"  {text}", file=sys.stderr, flush=True))
        failed = [c for c in report.checks if not c.passed]
        for check in report.checks:
            print(f"{'PASS' if check.passed else 'FAIL'}  {check.name}: {check.value:.3e} "
                  f"({check.limit()})")
        print(f"{len(report.checks) - len(failed)}/{len(report.checks)} checks passed; "
              f"report: {args.output / 'report.md'}")
        return 1 if failed else 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
