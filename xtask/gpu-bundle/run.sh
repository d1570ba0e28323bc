#!/usr/bin/env bash
# gapscope GPU proof: run on a machine with an NVIDIA GPU and PyTorch.
#
#   ./run.sh [--python PY] [--out DIR] [--shim-only] [--only NAMES] [--budget SECS]
#
# PY (or $PYTHON; default python3) is the Python that has torch: sudo drops
# venvs and conda from PATH, so name it (or run as root without sudo).
# Runs the CUPTI checks through gs-shim-listen first (no eBPF needed), then,
# where eBPF works (root or CAP_BPF+CAP_PERFMON, BTF), under `gapscope run`.
# Prints the environment, then one row per check; writes results.json into
# DIR (default ./out beside this script). Exit 0 only if no check FAILs;
# 2 at once, with one line, on a machine without a usable GPU.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-python3}"
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --python) py="${2:?--python needs a path}"; shift 2 ;;
        --python=*) py="${1#--python=}"; shift ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) args+=("$1"); shift ;;
    esac
done

no_gpu() {
    echo "gapscope GPU check: $1" >&2
    exit 2
}
[ -e /dev/nvidia0 ] || no_gpu "no NVIDIA GPU here (/dev/nvidia0 missing)"
command -v nvidia-smi >/dev/null 2>&1 || no_gpu "no NVIDIA GPU here (nvidia-smi not found)"
command -v "$py" >/dev/null 2>&1 || no_gpu "no Python '$py' (pass --python PY, the one with torch)"
rc=0
"$py" -c 'import sys
try:
    import torch
except Exception:
    sys.exit(3)
sys.exit(0 if torch.cuda.is_available() else 4)' >/dev/null 2>&1 || rc=$?
case "$rc" in
    0) ;;
    3) no_gpu "'$py' has no PyTorch (pass --python PY, the one with torch; under sudo: --python \"\$(command -v python)\")" ;;
    *) no_gpu "no NVIDIA GPU usable here (torch.cuda.is_available() is false in '$py')" ;;
esac
for f in gapscope gs-shim-listen libgapscope_cupti.so; do
    [ -e "$here/$f" ] || { echo "gapscope GPU check: $f missing from the bundle" >&2; exit 2; }
done
echo "python: $(command -v "$py") (--python / PYTHON)"
exec "$py" "$here/checks.py" ${args[@]+"${args[@]}"}
