#pragma once
// Tessera's point-to-point algorithms for the MPI backend: the pipelined ring reduce-scatter and
// all-gather (bandwidth-optimal: each rank sends and receives (n-1)/n of the buffer per phase)
// and the direct pairwise exchange. Counts are elements of dtype; messages are pipelined in
// chunks of at most `chunk` elements (<= the largest MPI count).
#include <cstdint>
#include <vector>

#include <tessera/comm/mpi/detail/mpi_impl.hpp>

namespace tessera::mpi::detail {

/// How a ring moves its blocks: in messages of `chunk` elements, `window` receives ahead.
struct Pipeline {
  int64_t chunk;
  int64_t window;
};

/// Elements of `scratch` that ring_reduce_scatter needs: window * chunk, where out of place on
/// more than two ranks the window must exceed the chunks of every block (see ring.cpp).
int64_t ring_reduce_scatter_scratch(const std::vector<int64_t>& counts, bool in_place, const Pipeline& pipeline);

/// Ring reduce-scatter of `input` (blocks of counts[b] elements, packed in rank order): this
/// rank's block of the reduction (op: sum/product/max/min; avg is a sum the caller scales)
/// lands in `output`. In place (all_reduce: output == input + this rank's block, input
/// written) the partial sums are kept in input; otherwise input is only read and they wait in
/// `scratch` (ring_reduce_scatter_scratch elements) until forwarded. Each block is reduced at
/// one rank, in ring order.
void ring_reduce_scatter(Op& op, void* input, void* output, const std::vector<int64_t>& counts, DType dtype,
                         ReduceOp reduce_op, bool in_place, void* scratch, const Pipeline& pipeline);

/// Ring all-gather: block b (counts[b] elements) of `output` (packed in rank order) comes from
/// rank b; this rank's block is read from `own` (may be inside output).
void ring_all_gather(Op& op, const void* own, void* output, const std::vector<int64_t>& counts, DType dtype,
                     const Pipeline& pipeline);

/// Recursive-doubling all-reduce (the small-message path): ceil(log2 n) exchanges of the whole
/// buffer, two more when n is not a power of two. Every combination takes the lower rank's
/// operand first on both partners, so every rank ends with the same bits. `scratch` holds
/// `count` elements.
void doubling_all_reduce(Op& op, void* data, int64_t count, DType dtype, ReduceOp reduce_op, void* scratch,
                         int64_t max_message);

/// Binomial-tree broadcast of `count` elements from `root`: ceil(log2 n) rounds.
void tree_broadcast(Op& op, void* data, int64_t count, DType dtype, int root, int64_t max_message);

/// Dissemination barrier: ceil(log2 n) rounds of empty messages.
void dissemination_barrier(Op& op);

/// One message of a pairwise exchange.
struct Transfer {
  int peer;
  void* data;  ///< const for sends
  int64_t count;
};
/// Posts every send and receive at once (each split into pieces of at most max_message
/// elements) and waits for all; on timeout names the peers that did not deliver, or, with
/// name_peers false (a step of a multi-round algorithm, whose peer may be waiting itself), lets
/// the side channel name the ranks that never came. A receive that brought fewer or more
/// elements than expected fails the call ("counts disagree").
void exchange(Op& op, const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs, DType dtype,
              int64_t max_message, int tag, bool name_peers = true);

}  // namespace tessera::mpi::detail
