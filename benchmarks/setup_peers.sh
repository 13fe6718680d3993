#!/usr/bin/env bash
# Install the peer solvers the benchmarks compare tpde with (idempotent).
#
#   bash benchmarks/setup_peers.sh
#
# Creates benchmarks/_peers/venv (git-ignored) with Clawpack (PyClaw / SharpClaw, Fortran
# kernels built from source: needs gfortran, installed with apt-get when missing; the build
# takes 2-3 minutes). Run again: it only checks that clawpack imports.
# It never fails the caller: when something cannot be installed it says so and exits 0, and
# the benchmarks then report the peer as unavailable (null) instead of failing.
# The peer row that runs in this venv, and the ADV2D problem it shares with tpde's rows, are
# in benchmarks/peers/ (README.md there).
#
# Environment: PEERS_PYTHON  interpreter for the venv (default: python3)
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
peers="$here/_peers"
venv="$peers/venv"
py="${PEERS_PYTHON:-python3}"

# import checks run in $peers: PyClaw's logging config creates ./pyclaw.log at import
check() { (cd "$peers" && "$venv/bin/python" -c "import clawpack.pyclaw, clawpack.riemann"); }
version() { (cd "$peers" && "$venv/bin/python" -c 'from importlib.metadata import version; print(version("clawpack"))'); }

say() { echo "setup_peers: $*" >&2; }
unavailable() {
    say "$*"
    say "the SharpClaw peer is UNAVAILABLE: benchmarks will report it as null"
    exit 0
}

if [ -x "$venv/bin/python" ] && check >/dev/null 2>&1; then
    say "clawpack $(version) already installed in $venv"
    exit 0
fi

# ---- gfortran ---------------------------------------------------------------------------------
if ! command -v gfortran >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        sudo=""
    elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
        sudo="sudo -n"
    else
        unavailable "gfortran is missing and apt-get needs root (install it: apt-get install -y gfortran)"
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        unavailable "gfortran is missing and there is no apt-get to install it"
    fi
    say "installing gfortran (apt-get)"
    if ! { $sudo apt-get update -qq && \
           DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq gfortran; } >&2; then
        unavailable "apt-get could not install gfortran"
    fi
    command -v gfortran >/dev/null 2>&1 || unavailable "gfortran still missing after apt-get"
fi
say "gfortran: $(gfortran --version | head -n 1)"

# ---- venv + clawpack -------------------------------------------------------------------------
command -v "$py" >/dev/null 2>&1 || unavailable "no interpreter '$py' (set PEERS_PYTHON)"
mkdir -p "$peers"
if [ ! -x "$venv/bin/python" ]; then
    say "creating $venv"
    "$py" -m venv "$venv" || { rm -rf "$venv"; unavailable "could not create the venv"; }
fi
say "pip install clawpack numpy (builds the Fortran kernels from source: 2-3 minutes)"
if ! { "$venv/bin/python" -m pip install --quiet --upgrade pip && \
       "$venv/bin/python" -m pip install --quiet clawpack numpy; } >&2; then
    rm -rf "$venv"
    unavailable "pip install clawpack numpy failed (see above); removed the partial venv"
fi
if ! check >&2; then
    rm -rf "$venv"
    unavailable "clawpack installed but does not import; removed the venv"
fi
say "clawpack $(version) installed in $venv"
exit 0
