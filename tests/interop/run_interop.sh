#!/usr/bin/env bash
# The interoperability test (ctest: checkpoint.interop_zarr_safetensors): runs
# tessera_checkpoint_writer, then check_checkpoint.py, which reads the writer's Zarr group with
# zarr-python and its safetensors exports with the safetensors package and compares every value
# with numpy's. Those readers come from PyPI into a venv of the test's own, created on first use
# and reused after (python3 and python3-venv: scripts/install-deps.sh).
#
#   run_interop.sh <tessera_checkpoint_writer> <venv dir> <scratch dir>
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 <tessera_checkpoint_writer> <venv dir> <scratch dir>" >&2
  exit 2
fi
writer=$1
venv=$2
scratch=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [[ ! -x "$venv/bin/pip" ]]; then
  rm -rf "$venv"  # a venv that python3-venv's absence left half made
  if ! python3 -m venv "$venv"; then
    rm -rf "$venv"
    echo "run_interop: cannot create a venv at $venv (run scripts/install-deps.sh for python3-venv)" >&2
    exit 1
  fi
fi
readers_present() {
  "$venv/bin/python" -c 'import numpy, safetensors, zarr; assert zarr.__version__.startswith("3.")' 2>/dev/null
}
# ctest reports exit status 77 as skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt): the
# readers come from PyPI, and a machine that cannot reach it cannot run this test, which is not
# a failure of Tessera's. Any other install failure fails the test.
pip=("$venv/bin/pip" --disable-pip-version-check)
if ! readers_present; then
  if ! "${pip[@]}" index versions zarr --retries 1 --timeout 15 >/dev/null 2>&1; then
    echo "run_interop: SKIPPED: PyPI (or the index pip is configured with) cannot be reached from this machine;" \
      "the test needs zarr-python, numpy and safetensors from it in $venv" >&2
    exit 77
  fi
  if ! "${pip[@]}" install --quiet 'zarr>=3,<4' numpy safetensors; then
    echo "run_interop: cannot install zarr-python, numpy and safetensors from PyPI into $venv" >&2
    exit 1
  fi
fi

rm -rf "$scratch"
mkdir -p "$scratch"
"$writer" "$scratch"
"$venv/bin/python" "$here/check_checkpoint.py" "$scratch"
