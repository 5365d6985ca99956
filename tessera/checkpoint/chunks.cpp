#include <tessera/checkpoint/detail/chunks.hpp>

#include <algorithm>

#include <tessera/core/error.hpp>
#include <tessera/comm/communicator.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::checkpoint::detail {

ChunkPlan chunk_plan(const Layout& layout) {
  Placements placements = layout.placements();
  for (Placement& p : placements)
    if (is_partial(p)) p = Replicate{};
  for (int64_t d = 0; d < layout.ndim(); ++d)
    if (layout.shard_order(d).size() > 1 || layout.has_explicit_sizes(d))
      for (int64_t m : layout.shard_order(d)) placements[static_cast<size_t>(m)] = Replicate{};
  ChunkPlan plan{Layout(layout.global_shape(), layout.dtype(), layout.mesh(), placements), Shape(),
                 std::vector<int64_t>(static_cast<size_t>(layout.ndim()), -1)};
  DimVector chunks;
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    const int64_t extent = layout.global_shape()[d];
    const std::vector<int64_t>& order = plan.layout.shard_order(d);
    int64_t chunk = extent;
    if (order.size() == 1) {
      const int64_t pieces = layout.mesh().shape()[static_cast<size_t>(order.front())];
      chunk = (extent + pieces - 1) / pieces;
      plan.cut_by[static_cast<size_t>(d)] = order.front();
    }
    chunks.push_back(std::max<int64_t>(chunk, 1));  // Zarr chunk sizes are positive
  }
  plan.chunks = Shape(chunks);
  return plan;
}

std::optional<std::vector<int64_t>> chunk_index(const ChunkPlan& plan, const std::vector<int64_t>& coordinate) {
  for (size_t m = 0; m < coordinate.size(); ++m)
    if (coordinate[m] != 0 && std::find(plan.cut_by.begin(), plan.cut_by.end(), static_cast<int64_t>(m)) == plan.cut_by.end())
      return std::nullopt;
  if (plan.layout.block(coordinate).numel() == 0) return std::nullopt;
  std::vector<int64_t> index;
  for (int64_t m : plan.cut_by) index.push_back(m < 0 ? 0 : coordinate[static_cast<size_t>(m)]);
  return index;
}

Tensor padded_chunk(const Tensor& block, const Shape& chunks) {
  if (block.shape() == chunks) return block.contiguous();
  Tensor chunk = zeros(chunks, block.dtype());
  Tensor region = chunk;
  for (int64_t d = 0; d < block.ndim(); ++d) region = region.narrow(d, 0, block.shape()[d]);
  region.copy_(block);
  return chunk;
}

void check_key(const std::string& key, const char* op) {
  TESSERA_CHECK(!key.empty() && key != "." && key != ".." && key.find('/') == std::string::npos &&
                    key.find('\t') == std::string::npos && key.find('\n') == std::string::npos && key != "zarr.json",
                ValueError, op, "key '", key, "' cannot name a Zarr array (empty, '.', '..', 'zarr.json', or with '/', a tab or a newline)");
}

std::string all_gather_text(const std::string& mine) {
  Communicator& comm = world();
  int64_t size = static_cast<int64_t>(mine.size());
  std::vector<int64_t> sizes(static_cast<size_t>(comm.size()));
  comm.all_gather(&size, sizes.data(), 1, DType::i64);
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  std::string all(static_cast<size_t>(total), '\0');
  comm.all_gather_v(mine.data(), all.data(), sizes, DType::u8);
  return all;
}

namespace {
int64_t& fault_countdown() {
  thread_local int64_t countdown = -1;
  return countdown;
}
}  // namespace

void set_save_fault(int64_t chunks) { fault_countdown() = chunks; }

void save_fault_point() {
  int64_t& countdown = fault_countdown();
  if (countdown < 0) return;
  if (countdown-- == 0) {
    countdown = -1;
    TESSERA_CHECK(false, Error, "checkpoint::save", "fault injected by the test on rank ", rank());
  }
}

}  // namespace tessera::checkpoint::detail
