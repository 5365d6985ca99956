#include <tessera/sharding/layout_words.hpp>

#include <map>

#include <tessera/core/error.hpp>

namespace tessera {

namespace {
enum Kind : int64_t { kShard = 0, kReplicate = 1, kPartial = 2 };
}  // namespace

void append_placement_words(const Placements& placements, std::vector<int64_t>& words) {
  words.push_back(static_cast<int64_t>(placements.size()));
  for (const Placement& p : placements) {
    if (const auto* s = std::get_if<Shard>(&p)) words.insert(words.end(), {kShard, s->dim});
    else if (const auto* partial = std::get_if<Partial>(&p)) words.insert(words.end(), {kPartial, static_cast<int64_t>(partial->op)});
    else words.insert(words.end(), {kReplicate, 0});
  }
}

void append_layout_words(const Layout& layout, std::vector<int64_t>& words) {
  words.insert(words.end(), {static_cast<int64_t>(layout.dtype()), layout.ndim()});
  for (int64_t d = 0; d < layout.ndim(); ++d) words.push_back(layout.global_shape()[d]);
  append_placement_words(layout.placements(), words);
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    const auto& order = layout.shard_order(d);
    words.push_back(static_cast<int64_t>(order.size()));
    words.insert(words.end(), order.begin(), order.end());
  }
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    if (!layout.has_explicit_sizes(d)) {
      words.push_back(0);
      continue;
    }
    const std::vector<int64_t> sizes = layout.piece_sizes(d);
    words.push_back(static_cast<int64_t>(sizes.size()));
    words.insert(words.end(), sizes.begin(), sizes.end());
  }
}

std::vector<int64_t> layout_words(const Layout& layout) {
  std::vector<int64_t> words;
  append_layout_words(layout, words);
  return words;
}

int64_t WordReader::next() {
  TESSERA_CHECK(at_ < words_.size(), CommError, call_, "a truncated message (", words_.size(), " words)");
  return words_[at_++];
}

Placements WordReader::placements() {
  const int64_t count = next();
  TESSERA_CHECK(count >= 0 && static_cast<size_t>(count) <= left() / 2, CommError, call_,
                "a truncated message (", count, " placements in ", left(), " words)");
  Placements out;
  for (int64_t m = 0; m < count; ++m) {
    const int64_t kind = next(), argument = next();
    if (kind == kShard) out.push_back(Shard{argument});
    else if (kind == kPartial) out.push_back(Partial{static_cast<ReduceOp>(argument)});
    else out.push_back(Replicate{});
  }
  return out;
}

Layout WordReader::layout(const MeshSpec& mesh) {
  const auto dtype = static_cast<DType>(next());
  const int64_t ndim = next();
  TESSERA_CHECK(ndim >= 0 && static_cast<size_t>(ndim) <= left(), CommError, call_, "a truncated message (a layout of ",
                ndim, " dims in ", left(), " words)");
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < ndim; ++d) shape.push_back(next());
  Placements placements = this->placements();
  TESSERA_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), ShardingError, call_, "a layout of ",
                placements.size(), " mesh dims arrived for ", mesh.to_string());
  // A count and as many words, per tensor dim; empty lists are left out of the map.
  const auto per_dim_lists = [&] {
    std::map<int64_t, std::vector<int64_t>> lists;
    for (int64_t d = 0; d < ndim; ++d) {
      const int64_t count = next();
      TESSERA_CHECK(count >= 0 && static_cast<size_t>(count) <= left(), CommError, call_, "a truncated message (",
                    count, " words of a layout in ", left(), ")");
      std::vector<int64_t> list;
      for (int64_t i = 0; i < count; ++i) list.push_back(next());
      if (!list.empty()) lists[d] = std::move(list);
    }
    return lists;
  };
  ShardOrder orders = per_dim_lists();
  ShardSizes sizes = per_dim_lists();
  return Layout(Shape(shape), dtype, mesh, std::move(placements), std::move(orders), std::move(sizes));
}

}  // namespace tessera
