// The ring algorithms: every block of the buffer travels around the ring in chunks, so each
// link carries (n-1)/n of the buffer per phase and a rank reduces one chunk while the next
// ones are already posted. Messages of one call between two ranks use one tag and are matched
// in posting order (MPI's non-overtaking rule), so both sides only need the same chunking.
#include <tessera/comm/mpi/detail/ring.hpp>

#include <algorithm>
#include <cstring>
#include <sstream>

#include <tessera/comm/detail/reduce_kernels.hpp>
#include <tessera/core/error.hpp>

namespace tessera::mpi::detail {

namespace {

// One message of a ring: chunk of `block` at element `offset`, sent or received at `step`.
struct Chunk {
  int step;
  int block;
  int64_t offset;
  int64_t count;
};

std::vector<int64_t> displacements(const std::vector<int64_t>& counts) {
  std::vector<int64_t> d(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) d[i + 1] = d[i] + counts[i];
  return d;
}

// The chunks moved at each step: block_at(step) for steps [0, steps); start[s] is the index of
// step s's first chunk (start has steps + 1 entries).
template <class BlockAt>
std::vector<Chunk> schedule(int steps, BlockAt block_at, const std::vector<int64_t>& counts, int64_t chunk,
                            std::vector<int64_t>& start) {
  std::vector<Chunk> items;
  start.assign(static_cast<size_t>(steps) + 1, 0);
  for (int s = 0; s < steps; ++s) {
    start[static_cast<size_t>(s)] = static_cast<int64_t>(items.size());
    const int b = block_at(s);
    const int64_t count = counts[static_cast<size_t>(b)];
    for (int64_t offset = 0; offset < count; offset += chunk) items.push_back({s, b, offset, std::min(chunk, count - offset)});
  }
  start[static_cast<size_t>(steps)] = static_cast<int64_t>(items.size());
  return items;
}

// Receives posted ahead. Out of place, a received chunk's slot also holds its partial sum until
// the send forwarding it completed, i.e. until the right neighbour posted the matching receive,
// which may wait for a slot of its own: my forward of receive j is the right's receive j + K
// (K: chunks of my step-0 block), which needs the right's slot of receive j + K - window free.
// A window above the chunks of every block makes that index smaller than j, so each wait goes
// back in the ring's history and the chain ends; a smaller one can close a cycle of waits around
// the ring (every rank's slots full of partial sums nobody can take).
int64_t receive_window(const std::vector<int64_t>& counts, bool in_place, const Pipeline& pipeline) {
  if (in_place || counts.size() <= 2) return pipeline.window;  // slots free once reduced
  int64_t most = 0;
  for (int64_t c : counts) most = std::max(most, (c + pipeline.chunk - 1) / pipeline.chunk);
  return std::max(pipeline.window, most + 1);
}

std::string describe_peer(const Op& op, int peer) {
  return tessera::detail::concat("group rank ", peer, " (world rank ", op.world_rank(peer), ")");
}

}  // namespace

int64_t ring_reduce_scatter_scratch(const std::vector<int64_t>& counts, bool in_place, const Pipeline& pipeline) {
  return receive_window(counts, in_place, pipeline) * pipeline.chunk;
}

void ring_reduce_scatter(Op& op, void* input, void* output, const std::vector<int64_t>& counts, DType dtype,
                         ReduceOp reduce_op, bool in_place, void* scratch, const Pipeline& pipeline) {
  const int n = op.size(), r = op.rank();
  TESSERA_ASSERT(n >= 2 && pipeline.chunk >= 1 && pipeline.window >= 1);
  const int left = (r + n - 1) % n, right = (r + 1) % n;
  const auto mod = [n](int x) { return ((x % n) + n) % n; };
  const int64_t item = itemsize(dtype);
  const MPI_Datatype type = transfer_type(dtype);
  const int tag = op.tag();
  const auto displ = displacements(counts);
  auto* base = static_cast<std::byte*>(input);
  const auto own = [&](const Chunk& c) { return base + (displ[static_cast<size_t>(c.block)] + c.offset) * item; };
  const int64_t window = receive_window(counts, in_place, pipeline);
  const auto slot = [&](int64_t j) { return static_cast<std::byte*>(scratch) + (j % window) * pipeline.chunk * item; };

  // Step s: send the partial sum of block r-s-1 (at step 0 this rank's own contribution) to the
  // right; receive block r-s-2 from the left and add this rank's contribution. After n-1
  // steps block r holds all n contributions.
  const int steps = n - 1;
  std::vector<int64_t> recv_start, send_start;
  const auto recvs = schedule(steps, [&](int s) { return mod(r - s - 2); }, counts, pipeline.chunk, recv_start);
  const auto sends = schedule(steps, [&](int s) { return mod(r - s - 1); }, counts, pipeline.chunk, send_start);
  const auto total_recvs = static_cast<int64_t>(recvs.size());
  // The send that forwards received chunk j (the same chunk of the same block, one step later).
  const auto forwarded_by = [&](int64_t j) -> int64_t {
    const Chunk& c = recvs[static_cast<size_t>(j)];
    if (c.step == steps - 1) return -1;
    return send_start[static_cast<size_t>(c.step) + 1] + (j - recv_start[static_cast<size_t>(c.step)]);
  };

  std::vector<MPI_Request> send_requests(sends.size(), MPI_REQUEST_NULL);
  std::vector<MPI_Request> recv_requests(static_cast<size_t>(window), MPI_REQUEST_NULL);
  const auto from_left = [&](const std::vector<int>&) {
    return tessera::detail::concat("no data from ", describe_peer(op, left), " in the ring reduce-scatter");
  };
  const auto to_right = [&](const std::vector<int>&) {
    return tessera::detail::concat(describe_peer(op, right), " did not take its data in the ring reduce-scatter");
  };

  for (int64_t i = 0; i < send_start[1]; ++i) {
    const Chunk& c = sends[static_cast<size_t>(i)];
    op.isend(own(c), c.count, type, right, tag, send_requests[static_cast<size_t>(i)]);
  }
  int64_t posted = 0;
  // Receives go into `window` rotating slots; out of place a slot also holds the partial sum
  // until the send forwarding it completed.
  const auto slot_free = [&](int64_t j) {
    if (j < window || in_place) return true;
    const int64_t s = forwarded_by(j - window);
    return s < 0 || op.test(send_requests[static_cast<size_t>(s)]);
  };
  const auto post_receives = [&](int64_t processed) {
    while (posted < total_recvs && posted < processed + window && slot_free(posted)) {
      const Chunk& c = recvs[static_cast<size_t>(posted)];
      op.irecv(slot(posted), c.count, type, left, tag, recv_requests[static_cast<size_t>(posted % window)]);
      ++posted;
    }
  };
  for (int64_t j = 0; j < total_recvs; ++j) {
    post_receives(j);
    while (posted <= j) {  // the slot's partial sum is still being sent
      op.wait(send_requests[static_cast<size_t>(forwarded_by(posted - window))], to_right);
      post_receives(j);
    }
    op.wait(recv_requests[static_cast<size_t>(j % window)], from_left);
    const Chunk& c = recvs[static_cast<size_t>(j)];
    std::byte* received = slot(j);
    std::byte* mine = own(c);
    const bool last = c.step == steps - 1;  // then c.block == r
    std::byte* out = in_place ? mine : last ? static_cast<std::byte*>(output) + c.offset * item : received;
    const void* sources[2] = {received, mine};
    tessera::detail::reduce_buffers(out, sources, 2, c.count, dtype, reduce_op);
    if (const int64_t s = forwarded_by(j); s >= 0)
      op.isend(out, c.count, type, right, tag, send_requests[static_cast<size_t>(s)]);
  }
  op.wait(send_requests.data(), static_cast<int>(send_requests.size()), to_right);
}

void ring_all_gather(Op& op, const void* own, void* output, const std::vector<int64_t>& counts, DType dtype,
                     const Pipeline& pipeline) {
  const int n = op.size(), r = op.rank();
  TESSERA_ASSERT(n >= 2 && pipeline.chunk >= 1 && pipeline.window >= 1);
  const int left = (r + n - 1) % n, right = (r + 1) % n;
  const auto mod = [n](int x) { return ((x % n) + n) % n; };
  const int64_t item = itemsize(dtype);
  const MPI_Datatype type = transfer_type(dtype);
  const int tag = op.tag();
  const auto displ = displacements(counts);
  auto* out = static_cast<std::byte*>(output);
  const auto place = [&](const Chunk& c) { return out + (displ[static_cast<size_t>(c.block)] + c.offset) * item; };
  const int64_t window = pipeline.window;

  // Step s: send block r-s to the right (at step 0 this rank's own), receive block r-s-1 from
  // the left straight into its place, forward it at the next step.
  const int steps = n - 1;
  std::vector<int64_t> recv_start, send_start;
  const auto recvs = schedule(steps, [&](int s) { return mod(r - s - 1); }, counts, pipeline.chunk, recv_start);
  const auto sends = schedule(steps, [&](int s) { return mod(r - s); }, counts, pipeline.chunk, send_start);
  const auto total_recvs = static_cast<int64_t>(recvs.size());
  std::vector<MPI_Request> send_requests(sends.size(), MPI_REQUEST_NULL);
  std::vector<MPI_Request> recv_requests(static_cast<size_t>(window), MPI_REQUEST_NULL);
  const auto from_left = [&](const std::vector<int>&) {
    return tessera::detail::concat("no data from ", describe_peer(op, left), " in the ring all-gather");
  };
  const auto to_right = [&](const std::vector<int>&) {
    return tessera::detail::concat(describe_peer(op, right), " did not take its data in the ring all-gather");
  };

  int64_t posted = 0;
  const auto post_receives = [&](int64_t processed) {
    for (; posted < total_recvs && posted < processed + window; ++posted) {
      const Chunk& c = recvs[static_cast<size_t>(posted)];
      op.irecv(place(c), c.count, type, left, tag, recv_requests[static_cast<size_t>(posted % window)]);
    }
  };
  post_receives(0);
  const auto* mine = static_cast<const std::byte*>(own);
  for (int64_t i = 0; i < send_start[1]; ++i) {
    const Chunk& c = sends[static_cast<size_t>(i)];
    op.isend(mine + c.offset * item, c.count, type, right, tag, send_requests[static_cast<size_t>(i)]);
  }
  // This rank's own block, copied while the first chunks are in flight.
  std::byte* own_place = out + displ[static_cast<size_t>(r)] * item;
  if (own_place != mine && counts[static_cast<size_t>(r)] > 0)
    std::memcpy(own_place, mine, static_cast<size_t>(counts[static_cast<size_t>(r)] * item));

  for (int64_t j = 0; j < total_recvs; ++j) {
    post_receives(j);
    op.wait(recv_requests[static_cast<size_t>(j % window)], from_left);
    const Chunk& c = recvs[static_cast<size_t>(j)];
    if (c.step < steps - 1) {
      const int64_t s = send_start[static_cast<size_t>(c.step) + 1] + (j - recv_start[static_cast<size_t>(c.step)]);
      op.isend(place(c), c.count, type, right, tag, send_requests[static_cast<size_t>(s)]);
    }
  }
  op.wait(send_requests.data(), static_cast<int>(send_requests.size()), to_right);
}

void exchange(Op& op, const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs, DType dtype,
              int64_t max_message, int tag, bool name_peers) {
  const int64_t item = itemsize(dtype);
  const MPI_Datatype type = transfer_type(dtype);
  std::vector<MPI_Request> requests;
  std::vector<std::pair<int, bool>> owner;  // (peer, is_receive) of each request
  for (const Transfer& t : recvs)
    for (int64_t offset = 0; offset < t.count; offset += max_message) {
      requests.push_back(MPI_REQUEST_NULL);
      owner.emplace_back(t.peer, true);
      op.irecv(static_cast<std::byte*>(t.data) + offset * item, std::min(max_message, t.count - offset), type, t.peer,
               tag, requests.back());
    }
  for (const Transfer& t : sends)
    for (int64_t offset = 0; offset < t.count; offset += max_message) {
      requests.push_back(MPI_REQUEST_NULL);
      owner.emplace_back(t.peer, false);
      op.isend(static_cast<const std::byte*>(t.data) + offset * item, std::min(max_message, t.count - offset), type,
               t.peer, tag, requests.back());
    }
  std::vector<MPI_Status> statuses(requests.size());
  op.wait(requests.data(), static_cast<int>(requests.size()), [&](const std::vector<int>& unfinished) {
    if (!name_peers) return std::string();
    std::vector<int> silent, deaf;
    for (int i : unfinished) {
      const auto [peer, receive] = owner[static_cast<size_t>(i)];
      auto& list = receive ? silent : deaf;
      if (std::find(list.begin(), list.end(), peer) == list.end()) list.push_back(peer);
    }
    std::ostringstream text;
    const auto ranks = [&](const std::vector<int>& peers) {
      text << "world ranks [";  // what the user's program knows; group indices would mislead
      for (size_t i = 0; i < peers.size(); ++i) text << (i ? ", " : "") << op.world_rank(peers[i]);
      text << "]";
    };
    if (!silent.empty()) {
      ranks(silent);
      text << " did not arrive (no data from them)";
    }
    if (!deaf.empty()) {
      if (!silent.empty()) text << "; ";
      ranks(deaf);
      text << " did not take their data";
    }
    return text.str();
  }, statuses.data());
  // A sender that sent less than this rank expects (more would have been truncated above):
  // the ranks disagree on the counts (all_to_all_v's are per rank, so not in the tag).
  size_t i = 0;
  for (const Transfer& t : recvs)
    for (int64_t offset = 0; offset < t.count; offset += max_message, ++i) {
      int received = 0;
      MPI_Get_count(&statuses[i], type, &received);
      const int64_t expected = std::min(max_message, t.count - offset);
      if (received != expected)
        op.fail(tessera::detail::concat("counts disagree: world rank ", op.world_rank(t.peer), " sent ",
                                        offset + received, " elements to world rank ", op.world_rank(op.rank()),
                                        ", which expects ", t.count));
    }
}

// --- log-depth algorithms for small messages ---------------------------------------------------------

namespace {

// Sends `send` to `to` and receives into `recv` from `from` (either may be -1: none).
void swap_with(Op& op, int to, const void* send, int from, void* recv, int64_t count, DType dtype,
               int64_t max_message) {
  std::vector<Transfer> sends, recvs;
  if (to >= 0) sends.push_back({to, const_cast<void*>(send), count});
  if (from >= 0) recvs.push_back({from, recv, count});
  exchange(op, sends, recvs, dtype, max_message, op.tag(), /*name_peers=*/false);
}

}  // namespace

void doubling_all_reduce(Op& op, void* data, int64_t count, DType dtype, ReduceOp reduce_op, void* scratch,
                         int64_t max_message) {
  const int n = op.size(), r = op.rank();
  if (n == 1 || count == 0) return;
  const auto bytes = static_cast<size_t>(count * itemsize(dtype));
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;  // ranks [0, 2 extra) pair up first: the odd one of each pair goes on
  // data := lower ⊕ higher, whichever of (data, scratch) is the lower rank's.
  const auto combine = [&](bool mine_is_lower) {
    if (mine_is_lower) {
      ::tessera::detail::reduce_pair(data, scratch, count, dtype, reduce_op);
    } else {
      ::tessera::detail::reduce_pair(scratch, data, count, dtype, reduce_op);
      std::memcpy(data, scratch, bytes);
    }
  };
  int folded = -1;  // this rank's new rank among the p that go on, or -1
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      swap_with(op, r + 1, data, -1, nullptr, count, dtype, max_message);
    } else {
      swap_with(op, -1, nullptr, r - 1, scratch, count, dtype, max_message);
      combine(false);
      folded = r / 2;
    }
  } else {
    folded = r - extra;
  }
  const auto actual = [&](int f) { return f < extra ? 2 * f + 1 : f + extra; };
  if (folded >= 0) {
    for (int mask = 1; mask < p; mask *= 2) {
      const int partner = folded ^ mask;
      swap_with(op, actual(partner), data, actual(partner), scratch, count, dtype, max_message);
      combine(folded < partner);
    }
  }
  if (r < 2 * extra) {
    if (r % 2 == 1) swap_with(op, r - 1, data, -1, nullptr, count, dtype, max_message);
    else swap_with(op, -1, nullptr, r + 1, data, count, dtype, max_message);
  }
}

void tree_broadcast(Op& op, void* data, int64_t count, DType dtype, int root, int64_t max_message) {
  const int n = op.size();
  if (n == 1 || count == 0) return;
  const int relative = (op.rank() - root + n) % n;
  int mask = 1;
  while (mask < n) {
    if (relative & mask) {
      exchange(op, {}, {{(relative - mask + root) % n, data, count}}, dtype, max_message, op.tag());
      break;
    }
    mask *= 2;
  }
  std::vector<Transfer> children;
  for (mask /= 2; mask > 0; mask /= 2)
    if (relative + mask < n) children.push_back({(relative + mask + root) % n, data, count});
  if (!children.empty()) exchange(op, children, {}, dtype, max_message, op.tag());
}

void dissemination_barrier(Op& op) {
  const int n = op.size(), r = op.rank();
  for (int k = 1; k < n; k *= 2) {
    static char token = 0;  // some MPIs reject a null buffer even for no elements
    MPI_Request requests[2];
    op.irecv(&token, 0, MPI_BYTE, (r - k + n) % n, op.tag(), requests[0]);
    op.isend(&token, 0, MPI_BYTE, (r + k) % n, op.tag(), requests[1]);
    // The peer of a round may itself wait for another: the side channel names who never came.
    op.wait(requests, 2, [](const std::vector<int>&) { return std::string(); });
  }
}

}  // namespace tessera::mpi::detail
