#!/usr/bin/env bash
# Layering (docs/architecture.md, The layers), checked two ways:
#  1. includes: a header or source of a layer includes only its own layer and the layers above it;
#     the sharding layer is pure (no comm, runtime, dtensor or DeviceMesh); no public header
#     includes a detail/ or internal/ header; no layer includes another layer's detail/ headers (what
#     later layers need beyond a layer's public headers is in its internal/ folder);
#  2. definitions: a layer's object files use no symbol that only a later layer defines (a
#     declaration in core defined in ops passes the include check but not this one).
# Usage: scripts/check-layering.sh              includes only
#        scripts/check-layering.sh BUILD_DIR    both (BUILD_DIR must hold the library's objects)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-}
order=(core grad ops comm runtime mesh sharding dtensor autograd nn checkpoint spec domain mpmd controller debug)
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
  echo "tessera/sharding must stay pure (docs/architecture.md, The layers):" >&2
  echo "$hits" >&2
  status=1
fi

# Installed headers are the public ones: none may include an internal/ or detail/ header (those
# folders are not installed; make consumer would fail to compile).
if hits=$(grep -rnE '#include *[<"]tessera/([a-z_]+/)+(detail|internal)/' tessera --include='*.hpp' |
          grep -vE '/(detail|internal)/[^:]*:'); then
  echo "public headers include detail/ or internal/ headers (not installed):" >&2
  echo "$hits" >&2
  status=1
fi

# A layer's detail/ headers are its own. What a later layer of the library needs from it beyond
# its public headers is declared in its internal/ folder (not installed either), so that
# changing a detail/ header touches one layer only.
for layer in "${order[@]}"; do
  if hits=$(grep -rnE '#include *[<"]tessera/[a-z_]+/([a-z_]+/)*detail/' "tessera/$layer" |
            grep -vE "#include *[<\"]tessera/$layer/"); then
    echo "layer $layer includes another layer's detail/ headers (move what it needs to internal/):" >&2
    echo "$hits" >&2
    status=1
  fi
done

objects="$build/CMakeFiles/tessera.dir/tessera"
# The object files of the current sources only (a removed source leaves its stale object behind).
layer_objects() {
  local dir=$objects/$1 object
  [[ -d $dir ]] || return 0
  find "$dir" -name '*.cpp.o' | while read -r object; do
    [[ -f tessera/${object#"$objects"/} ]] || [[ -f tessera/$(dirname "${object#"$objects"/}")/$(basename "$object" .o) ]] && echo "$object"
  done
}
if [[ -n $build ]]; then
  if [[ ! -d $objects/core ]]; then
    echo "no object files under $objects: build first (make build)" >&2
    exit 1
  fi
  defined_before=$(mktemp)
  trap 'rm -f "$defined_before"' EXIT
  for i in "${!order[@]}"; do
    layer=${order[$i]}
    [[ -d $objects/$layer ]] || continue
    # Symbols this layer and the ones above it define.
    layer_objects "$layer" | xargs -r nm --defined-only -P | awk '{print $1}' >> "$defined_before"
    sort -u -o "$defined_before" "$defined_before"
    for j in "${!order[@]}"; do
      ((j > i)) || continue
      used=$(layer_objects "$layer" | xargs -r nm -u -P | awk '{print $1}' | sort -u)
      defined_later=$(layer_objects "${order[$j]}" | xargs -r nm --defined-only -P | awk '$2 ~ /^[TWVDRB]$/ {print $1}' | sort -u)
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
