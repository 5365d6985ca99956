#!/usr/bin/env bash
# Installs the Debian packages Tessera builds with, and only those that are missing.
# Idempotent and fast when everything is present (one dpkg-query, no network).
# Works as root on a fresh Debian 12 machine; as another user it uses sudo when available.
#
#   scripts/install-deps.sh            # install what is missing
#   scripts/install-deps.sh --check    # exit 1 (and list them) if any are missing; install nothing
#   scripts/install-deps.sh --peers    # the same (make bench-peers asks for python3-venv, now in the default set)
#   scripts/install-deps.sh --format   # also clang-format, for CI's format check (scripts/check-format.sh)
set -euo pipefail

packages=(
  cmake ninja-build g++ make pkg-config   # toolchain
  libopenblas-dev                         # BLAS (sgemm/dgemm) for ops/linalg
  libdnnl-dev                             # oneDNN: sgemm for the larger f32 products (ops/sgemm.cpp)
  libgtest-dev                            # GoogleTest: compiled libs + GTestConfig.cmake
  libbenchmark-dev                        # Google Benchmark (make bench)
  nlohmann-json3-dev                      # JSON
  libisal-dev                             # CRC-32 of checkpoint chunks (ISA-L)
  libzstd-dev                             # zstd-compressed checkpoint chunks
  libcli11-dev                            # command lines
  libopenmpi-dev openmpi-bin              # MPI communicator backend and mpirun
  iproute2                                # ip netns: simulated hosts for make test-multihost
  python3 python3-venv                    # the docs' programs (extracted at configure time); make test's interop check (a venv from PyPI)
)

check_only=0
if [[ "${1:-}" == "--check" ]]; then
  check_only=1
elif [[ "${1:-}" == "--peers" ]]; then
  :  # python3 and python3-venv are in the default set
elif [[ "${1:-}" == "--format" ]]; then
  packages+=(clang-format)  # clang-format and git-clang-format (Debian 12: version 14)
elif [[ $# -gt 0 ]]; then
  echo "usage: $0 [--check | --peers | --format]" >&2
  exit 2
fi

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null || true)
  [[ "$status" == "installed" ]] || missing+=("$package")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

if [[ $check_only -eq 1 ]]; then
  echo "install-deps: missing: ${missing[*]}" >&2
  exit 1
fi

as_root=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
  else
    echo "install-deps: missing ${missing[*]}; run this script as root (no sudo found)" >&2
    exit 1
  fi
fi

# apt's output goes to a log that is shown only if it fails.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
run_apt() { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "$@" >>"$log" 2>&1; }
if ! run_apt update -q || ! run_apt install -y -q --no-install-recommends "${missing[@]}"; then
  cat "$log" >&2
  echo "install-deps: failed to install ${missing[*]}" >&2
  exit 1
fi
echo "install-deps: installed ${missing[*]}"
