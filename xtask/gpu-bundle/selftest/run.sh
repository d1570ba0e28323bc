#!/usr/bin/env bash
# Self-test of the GPU bundle without a GPU: runs the bundle's shim-only
# checks with a stand-in torch (selftest/torch) over the stand-in libcupti,
# through the real shim and gs-shim-listen. Needs `cargo xtask gpu-bundle`
# and `cargo build -p gs-fakecupti` first. Not part of the bundle.
#
#   xtask/gpu-bundle/selftest/run.sh [checks.py options]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
fake="${GS_FAKE_CUPTI:-$root/target/debug/libcupti_standin.so}"
[ -e "$fake" ] || { echo "selftest: no stand-in libcupti at $fake (cargo build -p gs-fakecupti)" >&2; exit 2; }
[ -e "$root/target/gpu-bundle/checks.py" ] || { echo "selftest: no bundle (cargo xtask gpu-bundle)" >&2; exit 2; }
out="${SELFTEST_OUT:-$root/target/gpu-bundle-selftest}"
rm -rf "$out"
GS_FAKE_CUPTI="$fake" PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" \
    exec python3 "$root/target/gpu-bundle/checks.py" --shim-only --out "$out" "$@"
