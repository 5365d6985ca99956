#include <tessera/comm/collective.hpp>

#include <sstream>

namespace tessera {

std::string_view name(CollectiveKind kind) {
  switch (kind) {
#define TESSERA_COLLECTIVE_NAME(name) \
  case CollectiveKind::name:          \
    return #name;
    TESSERA_FORALL_COLLECTIVES(TESSERA_COLLECTIVE_NAME)
#undef TESSERA_COLLECTIVE_NAME
  }
  return "?";
}

namespace {
bool has_reduce_op(CollectiveKind k) {
  return k == CollectiveKind::all_reduce || k == CollectiveKind::reduce_scatter ||
         k == CollectiveKind::reduce_scatter_v || k == CollectiveKind::reduce;
}
bool per_rank_count(CollectiveKind k) {
  return k == CollectiveKind::all_gather_v || k == CollectiveKind::reduce_scatter_v || k == CollectiveKind::all_to_all_v ||
         k == CollectiveKind::split || k == CollectiveKind::barrier;
}
bool has_root(CollectiveKind k) {
  return k == CollectiveKind::broadcast || k == CollectiveKind::reduce || k == CollectiveKind::gather ||
         k == CollectiveKind::scatter;
}
}  // namespace

bool CollectiveCall::matches(const CollectiveCall& other) const {
  if (kind != other.kind) return false;
  if (kind == CollectiveKind::barrier || kind == CollectiveKind::split) return true;
  if (dtype != other.dtype) return false;
  if (!per_rank_count(kind) && count != other.count) return false;
  if (has_reduce_op(kind) && op != other.op) return false;
  if (has_root(kind) && root != other.root) return false;
  return true;
}

uint64_t CollectiveCall::signature_hash() const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the compared fields
  const auto mix = [&h](int64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ static_cast<uint64_t>((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  mix(static_cast<int64_t>(kind));
  if (kind == CollectiveKind::barrier || kind == CollectiveKind::split) return h;
  mix(static_cast<int64_t>(dtype));
  if (!per_rank_count(kind)) mix(count);
  if (has_reduce_op(kind)) mix(static_cast<int64_t>(op));
  if (has_root(kind)) mix(root);
  return h;
}

std::string CollectiveCall::to_string() const {
  std::ostringstream out;
  out << name(kind) << '(';
  if (kind != CollectiveKind::barrier && kind != CollectiveKind::split) {
    out << tessera::name(dtype) << ", count=" << count;
    if (has_reduce_op(kind)) out << ", op=" << tessera::name(op);
    if (has_root(kind)) out << ", root=" << root;
    if (kind == CollectiveKind::send || kind == CollectiveKind::recv) out << ", peer=" << root;
  }
  out << ')';
  return out.str();
}

}  // namespace tessera
