#!/usr/bin/env bash
# The house format (.clang-format) on the lines changed since formatting became a check: prints
# what clang-format would change there and fails if anything. Lines nobody touched since keep
# their form; each change brings the lines it touches into the format.
#
#   scripts/check-format.sh              # lines changed since .ci/format-base (committed or not)
#   scripts/check-format.sh REV          # lines changed since REV
#   scripts/check-format.sh --fix [REV]  # format those lines in the working tree
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fix=0
if [[ "${1:-}" == "--fix" ]]; then
  fix=1
  shift
fi
base=${1:-$(cat .ci/format-base)}
extensions=cpp,hpp,h,cu,cuh

if ! command -v git-clang-format >/dev/null 2>&1; then
  echo "check-format: git-clang-format is missing; scripts/install-deps.sh --format installs it" >&2
  exit 1
fi
if ! git rev-parse --verify -q "${base}^{commit}" >/dev/null; then
  echo "check-format: ${base} is not in this clone's history (a shallow clone?); fetch it or name a REV" >&2
  exit 1
fi
if ((fix)); then
  # --force: format files with changes not yet staged too (the working tree is what is checked).
  exec git clang-format --force --extensions "$extensions" "$base"
fi
# git clang-format --diff prints a diff, or one of these lines when there is nothing to change.
out=$(git clang-format --diff --extensions "$extensions" "$base" 2>&1)
case "$out" in
  "" | "no modified files to format" | "clang-format did not modify any files")
    echo "check-format: the lines changed since ${base:0:12} are in the house format"
    exit 0
    ;;
esac
printf '%s\n' "$out"
echo "check-format: the lines above are not in the house format; scripts/check-format.sh --fix formats them" >&2
exit 1
