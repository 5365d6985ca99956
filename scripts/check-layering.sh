#!/usr/bin/env bash
# Layering (DESIGN.md §1), checked two ways:
#  1. includes: a header or source of a layer includes only its own layer and the layers above it;
#     the sharding layer is pure (no comm, runtime, dtensor or DeviceMesh);
#  2. definitions: a layer's object files use no symbol that only a later layer defines (a
#     declaration in core defined in ops passes the include check but not this one).
# Usage: scripts/check-layering.sh [BUILD_DIR]   (step 2 runs when BUILD_DIR holds the objects)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build}
order=(core ops comm runtime mesh sharding dtensor autograd nn debug)
status=0

for i in "${!order[@]}"; do
  for j in "${!order[@]}"; do
    ((j > i)) || continue
    if hits=$(grep -rnE "#include *[<\"]tessera/${order[$j]}/" "tessera/${order[$i]}"); then
      echo "layer ${order[$i]} includes the later layer ${order[$j]}:" >&2
      echo "$hits" >&2
      status=1
    fi
  done
done
if hits=$(grep -rnE '#include *[<"]tessera/(comm|runtime|dtensor|autograd|nn)/|#include *[<"]tessera/mesh/device_mesh' tessera/sharding); then
  echo "tessera/sharding must stay pure (DESIGN.md §1):" >&2
  echo "$hits" >&2
  status=1
fi

objects="$build/CMakeFiles/tessera.dir/tessera"
if [[ -d $objects ]]; then
  defined_before=$(mktemp)
  trap 'rm -f "$defined_before"' EXIT
  for i in "${!order[@]}"; do
    layer=${order[$i]}
    [[ -d $objects/$layer ]] || continue
    # Symbols this layer and the ones above it define.
    find "$objects/$layer" -name '*.o' -print0 | xargs -0 -r nm --defined-only -P | awk '{print $1}' >> "$defined_before"
    sort -u -o "$defined_before" "$defined_before"
    for j in "${!order[@]}"; do
      ((j > i)) || continue
      later=$objects/${order[$j]}
      [[ -d $later ]] || continue
      used=$(find "$objects/$layer" -name '*.o' -print0 | xargs -0 -r nm -u -P | awk '{print $1}' | sort -u)
      defined_later=$(find "$later" -name '*.o' -print0 | xargs -0 -r nm --defined-only -P | awk '$2 ~ /^[TWVDRB]$/ {print $1}' | sort -u)
      upward=$(comm -12 <(echo "$used") <(echo "$defined_later") | comm -23 - "$defined_before" || true)
      if [[ -n $upward ]]; then
        echo "layer $layer uses symbols that only the later layer ${order[$j]} defines:" >&2
        echo "$upward" | c++filt | sed 's/^/  /' >&2
        status=1
      fi
    done
  done
fi
exit $status
