#!/usr/bin/env bash
# gapscope GPU check: needs root (eBPF), an NVIDIA GPU with its driver, and
# Python with PyTorch (CUDA). Prints a table of checks and figures.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gapscope GPU check: needs Python with PyTorch and a CUDA GPU visible to it" >&2
    exit 2
fi
exec python3 "$here/checks.py" "${1:-$here/out}"
