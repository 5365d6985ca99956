// MPI backend (TESSERA_WITH_MPI=ON): one rank per process, OpenMPI underneath. This file is the
// communicator; the process's lifecycle (init, finalize, abort) is lifecycle.cpp, its state and
// the job's hosts detail/process.hpp.
//
// - Every wait is a poll (MPI's non-blocking calls + MPI_Test), so every call can time out
//   (comm_timeout_seconds(): no progress for that long -> CommError naming the call, its
//   sequence number, the group and, where MPI lets us know, the ranks that did not arrive).
//   After a timeout the group is unusable and the runtime aborts the job.
// - Per call, Tessera's point-to-point algorithm (detail/ring.hpp: ring, pairwise, recursive
//   doubling, binomial tree, dissemination), every message tagged with the call's sequence
//   number and signature hash: calls that cannot meet (another kind, dtype, count, op, root or
//   _v counts) never match each other's messages, so no rank takes wrong data; they wait, and
//   past the grace period the group's side channel (Op::wait, detail::SideChannel) names the
//   mismatch. With Tuning::library_collectives MPI's own collectives serve where measured faster
//   (detail/tuning.cpp), matched by call order only, as in MPI.
// - A rank's end of program (end_of_program: a barrier on a communicator of its own) is told
//   on the world's side channel, so a call still waiting for that rank fails at once.
// - Reductions: builtin MPI ops where their semantics equal Tessera's (integer ops, float
//   sum/product, b8 as MPI_C_BOOL with MPI_LOR/MPI_LAND); commutative user ops over
//   detail::reduce_pair for float max/min (NaN propagates, as on the threads backend), f16/bf16
//   included (max/min are exact, so 16-bit data moves as is). f16/bf16 sum/avg/product are
//   staged in f32: widened, reduced as f32, rounded once at the end (the Communicator
//   contract; a pairwise 16-bit op would round at every step). avg is a sum scaled once at the
//   end (by the owner of each block in the ring).
// - Counts beyond MPI's int: every message and library call moves at most
//   Tuning::max_message_elements (2^30) elements; library collectives whose counts or
//   displacements would exceed it use the point-to-point algorithms.
// - Threads: MPI_THREAD_MULTIPLE is requested. Async calls run on a worker thread per
//   communicator, never concurrently with the rank's own calls on that communicator, but two
//   communicators' workers can call MPI at once; with only MPI_THREAD_SERIALIZED Tessera takes a
//   process lock around each MPI call (detail::locked). Less than SERIALIZED is a CommError.
#include <tessera/comm/mpi/mpi.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <tessera/comm/detail/reduce_kernels.hpp>
#include <tessera/comm/mpi/detail/mpi_impl.hpp>
#include <tessera/comm/mpi/detail/p2p.hpp>
#include <tessera/comm/mpi/detail/process.hpp>
#include <tessera/comm/mpi/detail/ring.hpp>
#include <tessera/comm/mpi/detail/tuning.hpp>
#include <tessera/core/error.hpp>
#include <tessera/core/shape.hpp>

namespace tessera::mpi {

namespace {

using detail::Algorithm;
using detail::kNumReduceOps;
using detail::Op;
using detail::reduction;
using detail::set_errors_return;
using detail::Tuning;
using tessera::detail::concat;
// Receives a ring rank keeps posted ahead of the one it waits for.
constexpr int64_t kPipelineWindow = 4;

// --- small helpers ---------------------------------------------------------------------------------

std::byte* at(void* p, int64_t elements, DType dtype) { return static_cast<std::byte*>(p) + elements * itemsize(dtype); }
const std::byte* at(const void* p, int64_t elements, DType dtype) {
  return static_cast<const std::byte*>(p) + elements * itemsize(dtype);
}

void copy(void* dst, const void* src, int64_t count, DType dtype) {
  if (count > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(count * itemsize(dtype)));
}

std::vector<int64_t> displacements(const std::vector<int64_t>& counts) {
  std::vector<int64_t> d(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) d[i + 1] = d[i] + counts[i];
  return d;
}

std::vector<int> to_int(const std::vector<int64_t>& values) {
  std::vector<int> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    TESSERA_ASSERT(values[i] <= INT_MAX, "count ", values[i], " does not fit an MPI int");
    out[i] = static_cast<int>(values[i]);
  }
  return out;
}

// A non-null address for zero-length buffers (some MPI paths reject null even for count 0).
void* nonnull(void* p) {
  static std::byte dummy[8];
  return p ? p : dummy;
}
const void* nonnull(const void* p) { return p ? p : nonnull(static_cast<void*>(nullptr)); }

// f16/bf16 sum/avg/product reduce in f32 and round once: their data is widened first.
bool staged(DType dtype, ReduceOp op) {
  return (dtype == DType::f16 || dtype == DType::bf16) && op != ReduceOp::max && op != ReduceOp::min;
}

void widen(const void* src, float* dst, int64_t count, DType dtype) {
  visit(dtype, [&]<class T>(TypeTag<T>) {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      const T* s = static_cast<const T*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(s[i]);
    }
  });
}

void narrow(const float* src, void* dst, int64_t count, DType dtype) {
  visit(dtype, [&]<class T>(TypeTag<T>) {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      T* d = static_cast<T*>(dst);
      for (int64_t i = 0; i < count; ++i) d[i] = T(src[i]);
    }
  });
}

detail::Pipeline pipeline_for(DType dtype, const Tuning& t) {
  const int64_t chunk = std::clamp<int64_t>(t.pipeline_bytes / itemsize(dtype), 1, t.max_message_elements);
  return {chunk, kPipelineWindow};
}

// Splits [0, count) into near-equal blocks, one per rank (the ring's unit of ownership).
std::vector<int64_t> even_blocks(int64_t count, int n) {
  std::vector<int64_t> counts(static_cast<size_t>(n));
  for (int b = 0; b < n; ++b) counts[static_cast<size_t>(b)] = count * (b + 1) / n - count * b / n;
  return counts;
}

// --- the communicator -----------------------------------------------------------------------------

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of comm (collectives and the ring), p2p (send/recv) and side (the side
  // channel's reports; MPI_COMM_NULL for a group of one).
  MpiCommunicator(MPI_Comm comm, MPI_Comm p2p, MPI_Comm side, int rank, std::vector<int> world_ranks)
      : Communicator(rank, std::move(world_ranks)), comm_(comm), p2p_(p2p) {
    group_.description = to_string();
    group_.side.open(side, this->rank(), size());
    p2p_engine_ = std::make_shared<detail::P2pEngine>(p2p_, this->rank(), this->world_ranks(), group_);
  }

  ~MpiCommunicator() override {
    synchronize();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;  // a handle that outlived MPI: nothing left to free
    const bool broken = group_.broken.load();
    if (broken) {
      // A timed-out call may have left receives posted into the scratch: let it leak.
      new std::vector<std::byte>(std::move(scratch_));
    }
    p2p_engine_.reset();  // fails what is still pending; MPI may still write into its requests
    // A failed group (aborted, timed out) may hold transfers MPI can never complete. Freeing its
    // communicators then breaks later communicator creation on the parent (OpenMPI 4.1: the next
    // MPI_Comm_split of the world hangs with every rank inside it), so they stay allocated.
    if (broken) return;
    group_.side.close();
    detail::locked([&] { return MPI_Comm_free(&p2p_); });
    detail::locked([&] { return MPI_Comm_free(&comm_); });
  }

  std::string_view backend() const override { return "mpi"; }

  // mpi::end_of_program on the world: an Ibarrier on the process's end-of-program communicator,
  // polled like every wait (a PollBackoff that never sees progress: it rests between tries);
  // past the grace period this rank says on the world's side channel that it ended, once.
  void end_of_program(MPI_Comm end) {
    synchronize();
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = detail::locked([&] { return MPI_Ibarrier(end, &request); });
    if (rc != MPI_SUCCESS) throw CommError("[end_of_program] MPI_Ibarrier failed: " + detail::error_string(rc));
    detail::PollBackoff backoff;
    const double timeout = comm_timeout_seconds();
    const double grace = std::min(detail::tuning().desync_grace_seconds, timeout / 2);
    bool told = false;
    for (;;) {
      int done = 0;
      detail::locked([&] { return MPI_Test(&request, &done, MPI_STATUS_IGNORE); });
      if (done) return;
      const double waited = std::chrono::duration<double>(backoff.idle()).count();
      if (waited >= grace && !told) group_.side.post(detail::Report::end_of_program()), told = true;
      if (waited >= timeout) {
        group_.side.drain();
        std::vector<int> running;
        for (int r = 0; r < size(); ++r) {
          const detail::Report* report = group_.side.latest(r);
          if (r != rank() && !(report && report->ended)) running.push_back(world_ranks()[static_cast<size_t>(r)]);
        }
        throw CommError(concat("[end_of_program] world rank ", world_ranks()[static_cast<size_t>(rank())],
                               " ended its program, but world ranks ", detail::join_ranks(running),
                               " did not end theirs within ", timeout, " s (a rank still waits in a call, or the",
                               " ranks made different numbers of calls)"));
      }
      backoff.rest();
    }
  }

 protected:
  void do_all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op, const CollectiveCall& call) override {
    const Tuning t = detail::tuning();
    Op o = begin(call, t);
    const int64_t bytes = count * itemsize(dtype);
    const Algorithm algorithm = detail::choose_algorithm(call.kind, bytes, count, size(), t);
    detail::note_algorithm(algorithm);
    if (algorithm == Algorithm::local) return;  // avg over one rank is the value
    if (count == 0) return meet_without_data(o);
    const ReduceOp fold = op == ReduceOp::avg ? ReduceOp::sum : op;
    // The reduction runs on `data` in dtype `wire`: the caller's buffer, or its f32 copy.
    const DType wire = staged(dtype, op) ? DType::f32 : dtype;
    std::vector<float> wide;
    void* data = buf;
    if (wire != dtype) {
      wide.resize(static_cast<size_t>(count));
      widen(buf, wide.data(), count, dtype);
      data = wide.data();
    }
    if (algorithm == Algorithm::ring) {
      // Reduce-scatter in place, each block scaled (and rounded to 16 bits) by its owner, then
      // all-gather in place in the caller's dtype.
      const auto counts = even_blocks(count, size());
      const int64_t first = displacements(counts)[static_cast<size_t>(rank())];
      const int64_t own = counts[static_cast<size_t>(rank())];
      const auto pipe = pipeline_for(wire, t);
      std::byte* mine = at(data, first, wire);
      void* slots = scratch(detail::ring_reduce_scatter_scratch(counts, /*in_place=*/true, pipe), wire);
      detail::ring_reduce_scatter(o, data, mine, counts, wire, fold, /*in_place=*/true, slots, pipe);
      if (op == ReduceOp::avg && own > 0) ::tessera::detail::scale_for_avg(mine, own, wire, size());
      if (wire != dtype) narrow(reinterpret_cast<const float*>(mine), at(buf, first, dtype), own, dtype);
      detail::ring_all_gather(o, at(buf, first, dtype), buf, counts, dtype, pipeline_for(dtype, t));
      return;
    }
    if (algorithm == Algorithm::tree) {
      detail::doubling_all_reduce(o, data, count, wire, fold, scratch(count, wire), t.max_message_elements);
    } else {
      const MPI_Datatype type = detail::transfer_type(wire);
      const MPI_Op mop = reduction(wire, op);
      for (int64_t offset = 0; offset < count; offset += t.max_message_elements) {
        const int n = static_cast<int>(std::min(t.max_message_elements, count - offset));
        MPI_Request request;
        o.check(detail::locked([&] {
                  return MPI_Iallreduce(MPI_IN_PLACE, at(data, offset, wire), n, type, mop, comm_, &request);
                }),
                "MPI_Iallreduce");
        o.wait(request, detail::library_pending);
      }
    }
    if (op == ReduceOp::avg) ::tessera::detail::scale_for_avg(data, count, wire, size());
    if (wire != dtype) narrow(wide.data(), buf, count, dtype);
  }

  void do_all_gather_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dtype,
                       const CollectiveCall& call) override {
    const Tuning t = detail::tuning();
    Op o = begin(call, t, &counts);
    const auto displ = displacements(counts);
    const int64_t total = displ.back();
    const Algorithm algorithm = detail::choose_algorithm(call.kind, total * itemsize(dtype), total, size(), t);
    detail::note_algorithm(algorithm);
    std::byte* own_place = at(recv, displ[static_cast<size_t>(rank())], dtype);
    if (algorithm == Algorithm::local) return copy(own_place, send, counts[0], dtype);
    if (total == 0) return;
    if (algorithm == Algorithm::ring) return detail::ring_all_gather(o, send, recv, counts, dtype, pipeline_for(dtype, t));
    if (algorithm == Algorithm::pairwise) {  // small: every block straight to every rank, one round
      std::vector<detail::Transfer> sends, recvs;
      for (int p = 0; p < size(); ++p) {
        if (p == rank()) continue;
        if (counts[static_cast<size_t>(rank())] > 0) sends.push_back({p, const_cast<void*>(send), counts[static_cast<size_t>(rank())]});
        if (counts[static_cast<size_t>(p)] > 0)
          recvs.push_back({p, at(recv, displ[static_cast<size_t>(p)], dtype), counts[static_cast<size_t>(p)]});
      }
      copy(own_place, send, counts[static_cast<size_t>(rank())], dtype);
      return detail::exchange(o, sends, recvs, dtype, t.max_message_elements, o.tag());
    }
    const MPI_Datatype type = detail::transfer_type(dtype);
    const auto int_counts = to_int(counts);
    const auto int_displ = to_int(displ);
    const bool in_place = send == own_place;
    MPI_Request request;
    o.check(detail::locked([&] {
              return MPI_Iallgatherv(in_place ? MPI_IN_PLACE : nonnull(send), int_counts[static_cast<size_t>(rank())],
                                     type, recv, int_counts.data(), int_displ.data(), type, comm_, &request);
            }),
            "MPI_Iallgatherv");
    o.wait(request, detail::library_pending);
  }

  void do_all_gather(const void* send, void* recv, int64_t count, DType dtype, const CollectiveCall& call) override {
    do_all_gather_v(send, recv, std::vector<int64_t>(static_cast<size_t>(size()), count), dtype, call);
  }

  void do_reduce_scatter_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dtype, ReduceOp op,
                           const CollectiveCall& call) override {
    const Tuning t = detail::tuning();
    Op o = begin(call, t, &counts);
    const auto displ = displacements(counts);
    const int64_t total = displ.back(), own = counts[static_cast<size_t>(rank())];
    const Algorithm algorithm = detail::choose_algorithm(call.kind, total * itemsize(dtype), total, size(), t);
    detail::note_algorithm(algorithm);
    if (algorithm == Algorithm::local) return copy(recv, send, own, dtype);
    if (total == 0) return;
    const ReduceOp fold = op == ReduceOp::avg ? ReduceOp::sum : op;
    const DType wire = staged(dtype, op) ? DType::f32 : dtype;
    std::vector<float> wide_send, wide_recv;
    const void* in = send;
    void* out = recv;
    if (wire != dtype) {
      wide_send.resize(static_cast<size_t>(total));
      wide_recv.resize(static_cast<size_t>(own));
      widen(send, wide_send.data(), total, dtype);
      in = wide_send.data();
      out = wide_recv.data();
    }
    if (algorithm == Algorithm::ring) {
      const auto pipe = pipeline_for(wire, t);
      // Out of place the ring only reads its input.
      void* slots = scratch(detail::ring_reduce_scatter_scratch(counts, /*in_place=*/false, pipe), wire);
      detail::ring_reduce_scatter(o, const_cast<void*>(in), out, counts, wire, fold, /*in_place=*/false, slots, pipe);
    } else if (algorithm == Algorithm::pairwise) {
      // Small: block p goes straight to rank p, which folds its block's contributions.
      std::vector<detail::Transfer> sends;
      for (int p = 0; p < size(); ++p)
        if (p != rank() && counts[static_cast<size_t>(p)] > 0)
          sends.push_back({p, const_cast<std::byte*>(at(in, displ[static_cast<size_t>(p)], wire)), counts[static_cast<size_t>(p)]});
      fold_from_every_rank(o, sends, at(in, displ[static_cast<size_t>(rank())], wire), out, own, wire, fold, t);
    } else {
      const auto int_counts = to_int(counts);
      MPI_Request request;
      o.check(detail::locked([&] {
                return MPI_Ireduce_scatter(nonnull(in), nonnull(out), int_counts.data(), detail::transfer_type(wire),
                                           reduction(wire, op), comm_, &request);
              }),
              "MPI_Ireduce_scatter");
      o.wait(request, detail::library_pending);
    }
    if (op == ReduceOp::avg && own > 0) ::tessera::detail::scale_for_avg(out, own, wire, size());
    if (wire != dtype) narrow(wide_recv.data(), recv, own, dtype);
  }

  void do_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                         const CollectiveCall& call) override {
    do_reduce_scatter_v(send, recv, std::vector<int64_t>(static_cast<size_t>(size()), count), dtype, op, call);
  }

  void do_all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                       const std::vector<int64_t>& recv_counts, DType dtype, const CollectiveCall& call) override {
    const Tuning t = detail::tuning();
    Op o = begin(call, t, &send_counts, &recv_counts);
    detail::note_algorithm(size() == 1 ? Algorithm::local : Algorithm::pairwise);
    pairwise_all_to_all(o, send, send_counts, recv, recv_counts, dtype, t);
  }

  void do_all_to_all(const void* send, void* recv, int64_t count, DType dtype, const CollectiveCall& call) override {
    const Tuning t = detail::tuning();
    const std::vector<int64_t> counts(static_cast<size_t>(size()), count);
    Op o = begin(call, t, &counts, &counts);
    const int64_t total = count * size();
    const Algorithm algorithm = detail::choose_algorithm(call.kind, total * itemsize(dtype), total, size(), t);
    detail::note_algorithm(algorithm);
    if (algorithm != Algorithm::library) return pairwise_all_to_all(o, send, counts, recv, counts, dtype, t);
    if (count == 0) return meet_without_data(o);
    const MPI_Datatype type = detail::transfer_type(dtype);
    MPI_Request request;
    o.check(detail::locked([&] {
              return MPI_Ialltoall(send, static_cast<int>(count), type, recv, static_cast<int>(count), type, comm_,
                                   &request);
            }),
            "MPI_Ialltoall");
    o.wait(request, detail::library_pending);
  }

  void do_broadcast(void* buf, int64_t count, DType dtype, int root, const CollectiveCall& call) override {
    const Tuning t = detail::tuning();
    Op o = begin(call, t);
    const Algorithm algorithm = detail::choose_algorithm(call.kind, count * itemsize(dtype), count, size(), t);
    detail::note_algorithm(algorithm);
    if (algorithm == Algorithm::local) return;
    if (algorithm == Algorithm::tree) return detail::tree_broadcast(o, buf, count, dtype, root, t.max_message_elements);
    const MPI_Datatype type = detail::transfer_type(dtype);
    for (int64_t offset = 0; offset < count; offset += t.max_message_elements) {
      const int n = static_cast<int>(std::min(t.max_message_elements, count - offset));
      MPI_Request request;
      o.check(detail::locked([&] { return MPI_Ibcast(at(buf, offset, dtype), n, type, root, comm_, &request); }),
              "MPI_Ibcast");
      o.wait(request, detail::library_pending);
    }
  }

  void do_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root,
                 const CollectiveCall& call) override {
    const Tuning t = detail::tuning();
    Op o = begin(call, t);
    const Algorithm algorithm = detail::choose_algorithm(call.kind, count * itemsize(dtype), count, size(), t);
    detail::note_algorithm(algorithm);
    const bool is_root = rank() == root;
    if (algorithm == Algorithm::local) return copy(recv, send, count, dtype);
    if (count == 0) return meet_without_data(o);
    const DType wire = staged(dtype, op) ? DType::f32 : dtype;
    std::vector<float> wide_send, wide_recv;
    const void* in = send;
    void* out = recv;
    if (wire != dtype) {
      wide_send.resize(static_cast<size_t>(count));
      widen(send, wide_send.data(), count, dtype);
      in = wide_send.data();
      if (is_root) {
        wide_recv.resize(static_cast<size_t>(count));
        out = wide_recv.data();
      }
    }
    if (algorithm == Algorithm::pairwise) {
      // Every rank sends its buffer to the root, which folds them in rank order.
      if (!is_root) return detail::exchange(o, {{root, const_cast<void*>(in), count}}, {}, wire, t.max_message_elements, o.tag());
      fold_from_every_rank(o, {}, in, out, count, wire, op == ReduceOp::avg ? ReduceOp::sum : op, t);
    } else {
      reduce_with_library(o, in, out, count, wire, op, root, t);
    }
    if (!is_root) return;
    if (op == ReduceOp::avg) ::tessera::detail::scale_for_avg(out, count, wire, size());
    if (wire != dtype) narrow(wide_recv.data(), recv, count, dtype);
  }

  void reduce_with_library(Op& o, const void* in, void* out, int64_t count, DType wire, ReduceOp op, int root,
                           const Tuning& t) {
    const bool is_root = rank() == root;
    const MPI_Datatype type = detail::transfer_type(wire);
    const MPI_Op mop = reduction(wire, op);
    const bool in_place = is_root && in == out;
    for (int64_t offset = 0; offset < count; offset += t.max_message_elements) {
      const int n = static_cast<int>(std::min(t.max_message_elements, count - offset));
      const void* s = in_place ? MPI_IN_PLACE : at(in, offset, wire);
      void* r = is_root ? at(out, offset, wire) : nullptr;
      MPI_Request request;
      o.check(detail::locked([&] { return MPI_Ireduce(s, r, n, type, mop, root, comm_, &request); }), "MPI_Ireduce");
      o.wait(request, detail::library_pending);
    }
  }

  void do_gather(const void* send, void* recv, int64_t count, DType dtype, int root,
                 const CollectiveCall& call) override {
    const Tuning t = detail::tuning();
    Op o = begin(call, t);
    const int64_t total = count * size();
    const Algorithm algorithm = detail::choose_algorithm(call.kind, total * itemsize(dtype), total, size(), t);
    detail::note_algorithm(algorithm);
    const bool is_root = rank() == root;
    if (algorithm == Algorithm::local) return copy(recv, send, count, dtype);
    if (count == 0) return meet_without_data(o);
    if (algorithm == Algorithm::pairwise) {
      std::vector<detail::Transfer> sends, recvs;
      if (is_root) {
        copy(at(recv, count * root, dtype), send, count, dtype);
        for (int p = 0; p < size(); ++p)
          if (p != root) recvs.push_back({p, at(recv, count * p, dtype), count});
      } else {
        sends.push_back({root, const_cast<void*>(send), count});
      }
      return detail::exchange(o, sends, recvs, dtype, t.max_message_elements, o.tag());
    }
    const MPI_Datatype type = detail::transfer_type(dtype);
    const bool in_place = is_root && send == at(recv, count * root, dtype);
    MPI_Request request;
    o.check(detail::locked([&] {
              return MPI_Igather(in_place ? MPI_IN_PLACE : send, static_cast<int>(count), type, recv,
                                 static_cast<int>(count), type, root, comm_, &request);
            }),
            "MPI_Igather");
    o.wait(request, detail::library_pending);
  }

  void do_scatter(const void* send, void* recv, int64_t count, DType dtype, int root,
                  const CollectiveCall& call) override {
    const Tuning t = detail::tuning();
    Op o = begin(call, t);
    const int64_t total = count * size();
    const Algorithm algorithm = detail::choose_algorithm(call.kind, total * itemsize(dtype), total, size(), t);
    detail::note_algorithm(algorithm);
    const bool is_root = rank() == root;
    if (algorithm == Algorithm::local) return copy(recv, send, count, dtype);
    if (count == 0) return meet_without_data(o);
    if (algorithm == Algorithm::pairwise) {
      std::vector<detail::Transfer> sends, recvs;
      if (is_root) {
        copy(recv, at(send, count * root, dtype), count, dtype);
        for (int p = 0; p < size(); ++p)
          if (p != root) sends.push_back({p, const_cast<std::byte*>(at(send, count * p, dtype)), count});
      } else {
        recvs.push_back({root, recv, count});
      }
      return detail::exchange(o, sends, recvs, dtype, t.max_message_elements, o.tag());
    }
    const MPI_Datatype type = detail::transfer_type(dtype);
    const bool in_place = is_root && recv == at(send, count * root, dtype);
    MPI_Request request;
    o.check(detail::locked([&] {
              return MPI_Iscatter(send, static_cast<int>(count), type, in_place ? MPI_IN_PLACE : recv,
                                  static_cast<int>(count), type, root, comm_, &request);
            }),
            "MPI_Iscatter");
    o.wait(request, detail::library_pending);
  }

  // Peers waiting on this group read the failure on its side channel (after the grace period).
  void do_abort(const std::string& reason) override { group_.fail(reason, CollectiveCall{}); }

  void do_barrier(const CollectiveCall& call) override {
    const Tuning t = detail::tuning();
    Op o = begin(call, t);
    const Algorithm algorithm = detail::choose_algorithm(call.kind, 0, 0, size(), t);
    detail::note_algorithm(algorithm);
    if (algorithm == Algorithm::local) return;
    if (algorithm == Algorithm::tree) return detail::dissemination_barrier(o);
    MPI_Request request;
    o.check(detail::locked([&] { return MPI_Ibarrier(comm_, &request); }), "MPI_Ibarrier");
    o.wait(request, detail::library_pending);
  }

  std::shared_ptr<Communicator> do_split(int color, int key, const CollectiveCall& call) override {
    const Tuning t = detail::tuning();
    Op o = begin(call, t);
    // Everyone's (color, key) first, with the timeout: MPI_Comm_split itself blocks, so it runs
    // only once every rank is known to have arrived. The same table gives the world ranks.
    const int n = size();
    const int mine[2] = {color, key};
    std::vector<int> table(2 * static_cast<size_t>(n));
    if (n > 1) {
      MPI_Request request;
      o.check(detail::locked([&] { return MPI_Iallgather(mine, 2, MPI_INT, table.data(), 2, MPI_INT, comm_, &request); }),
              "MPI_Iallgather");
      o.wait(request, detail::library_pending);
    } else {
      table = {color, key};
    }
    MPI_Comm comm = MPI_COMM_NULL;
    o.check(detail::locked([&] { return MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &comm); }),
            "MPI_Comm_split");
    if (color < 0) return nullptr;
    std::vector<std::pair<std::pair<int, int>, int>> members;  // ((key, rank), rank), MPI's order
    for (int r = 0; r < n; ++r)
      if (table[2 * static_cast<size_t>(r)] == color) members.push_back({{table[2 * static_cast<size_t>(r) + 1], r}, r});
    std::sort(members.begin(), members.end());
    std::vector<int> world;
    int my_index = -1;
    for (const auto& m : members) {
      if (m.second == rank()) my_index = static_cast<int>(world.size());
      world.push_back(world_ranks()[static_cast<size_t>(m.second)]);
    }
    int new_rank = -1;
    MPI_Comm_rank(comm, &new_rank);
    TESSERA_ASSERT(new_rank == my_index, "MPI_Comm_split gave rank ", new_rank, ", expected ", my_index);
    return make_communicator(o, comm, my_index, std::move(world));
  }

  std::shared_ptr<tessera::detail::WorkState> do_isend(const void* buf, int64_t count, DType dtype, int peer, int tag,
                                                      const CollectiveCall& call) override {
    check_tag(call, tag);
    return p2p_engine_->post(true, const_cast<void*>(buf), count, dtype, peer, tag, call);
  }

  std::shared_ptr<tessera::detail::WorkState> do_irecv(void* buf, int64_t count, DType dtype, int peer, int tag,
                                                      const CollectiveCall& call) override {
    check_tag(call, tag);
    return p2p_engine_->post(false, buf, count, dtype, peer, tag, call);
  }

 private:
  // An empty call still meets its peers, through a barrier whose messages carry the call's
  // signature: a rank that passes 0 elements where its peers pass more must not return at once
  // and leave them waiting out the timeout; it waits with them, and after the grace period both
  // sides' reports name the mismatch (different counts). Ranks that all pass 0 just meet.
  static void meet_without_data(Op& o) { detail::dissemination_barrier(o); }

  // The start of every collective: a failed group is not reused; in debug mode every rank's
  // signature (and the counts of the _v forms) is compared before any data moves.
  Op begin(const CollectiveCall& call, const Tuning& t, const std::vector<int64_t>* counts = nullptr,
           const std::vector<int64_t>* recv_counts = nullptr) {
    group_.check_usable(call);
    // Every rank passes the same counts to all_gather_v / reduce_scatter_v: they join the tag.
    uint64_t counts_hash = 0;
    if (counts && !recv_counts)
      for (int64_t c : *counts) counts_hash = (counts_hash ^ static_cast<uint64_t>(c)) * 1099511628211ull + 1;
    Op o(comm_, rank(), world_ranks(), call, group_, counts_hash);
    if (t.debug_collectives && size() > 1) check_signatures(o, counts, recv_counts);
    return o;
  }

  // An MPI whose MPI_TAG_UB is small carries fewer user tags (each takes three of its tags).
  void check_tag(const CollectiveCall& call, int tag) const {
    const int max_tag = detail::P2pEngine::max_tag();
    TESSERA_CHECK(tag <= max_tag, ValueError, name(call.kind), "tag ", tag, " out of range on ", group_.description,
                  "; this MPI carries tags [0, ", max_tag, "]");
  }

  // Debug mode: one MPI_Iallgather of a fixed-size signature (kind, dtype, count, op, root,
  // sequence, then the _v forms' counts), compared by every rank alike, so all ranks of a
  // desynchronised group throw the same kind of error (texts as on the threads backend).
  void check_signatures(Op& o, const std::vector<int64_t>* counts, const std::vector<int64_t>* recv_counts) {
    const int n = size();
    const CollectiveCall& call = o.call();
    const size_t width = 8 + 2 * static_cast<size_t>(n);
    std::vector<int64_t> mine(width, 0), all(width * static_cast<size_t>(n), 0);
    mine[0] = static_cast<int64_t>(call.kind);
    mine[1] = static_cast<int64_t>(call.dtype);
    mine[2] = call.count;
    mine[3] = static_cast<int64_t>(call.op);
    mine[4] = call.root;
    mine[5] = static_cast<int64_t>(call.sequence);
    if (counts) std::copy(counts->begin(), counts->end(), mine.begin() + 8);
    if (recv_counts) std::copy(recv_counts->begin(), recv_counts->end(), mine.begin() + 8 + n);
    MPI_Request request;
    o.check(detail::locked([&] {
              return MPI_Iallgather(mine.data(), static_cast<int>(width), MPI_INT64_T, all.data(), static_cast<int>(width),
                                    MPI_INT64_T, comm_, &request);
            }),
            "MPI_Iallgather");
    o.wait(request, detail::library_pending);
    const auto row = [&](int r) { return all.data() + width * static_cast<size_t>(r); };
    const auto call_of = [&](int r) {
      const int64_t* s = row(r);
      CollectiveCall c;
      c.kind = static_cast<CollectiveKind>(std::clamp<int64_t>(s[0], 0, kNumCollectiveKinds - 1));
      c.dtype = static_cast<DType>(std::clamp<int64_t>(s[1], 0, kNumDTypes - 1));
      c.count = s[2];
      c.op = static_cast<ReduceOp>(std::clamp<int64_t>(s[3], 0, kNumReduceOps - 1));
      c.root = static_cast<int>(s[4]);
      c.sequence = static_cast<uint64_t>(s[5]);
      return c;
    };
    const CollectiveCall first = call_of(0);
    for (int r = 1; r < n; ++r) {
      const CollectiveCall other = call_of(r);
      if (other.matches(first) && other.sequence == first.sequence) continue;
      fail_exactly(o, concat("collective mismatch on ", group_.description, ": world rank ", o.world_rank(0), " called ",
                             first.to_string(), " #", first.sequence, ", world rank ", o.world_rank(r), " called ",
                             other.to_string(), " #", other.sequence));
    }
    if (counts && !recv_counts) {  // all_gather_v, reduce_scatter_v: one counts vector, equal everywhere
      for (int r = 0; r < n; ++r) {
        const std::vector<int64_t> theirs(row(r) + 8, row(r) + 8 + n);
        if (theirs != *counts)
          o.fail(concat("counts differ between ranks: rank ", rank(), " passed ", Shape(*counts).to_string(), ", rank ",
                        r, " passed ", Shape(theirs).to_string()));
      }
    }
    if (counts && recv_counts) {  // all_to_all(_v): what r sends to p is what p expects from r
      for (int r = 0; r < n; ++r)
        for (int p = 0; p < n; ++p) {
          const int64_t sent = row(r)[8 + p], expected = row(p)[8 + n + r];
          if (sent != expected)
            o.fail(concat("all_to_all_v counts disagree: rank ", r, " sends ", sent, " elements to rank ", p,
                          ", which expects ", expected));
        }
    }
  }

  [[noreturn]] void fail_exactly(const Op& o, const std::string& reason) {
    group_.fail(reason, o.call());
    throw CommError(concat("[", name(o.call().kind), "] ", reason));
  }

  void pairwise_all_to_all(Op& o, const void* send, const std::vector<int64_t>& send_counts, void* recv,
                           const std::vector<int64_t>& recv_counts, DType dtype, const Tuning& t) {
    const int n = size(), r = rank();
    const auto send_displ = displacements(send_counts), recv_displ = displacements(recv_counts);
    const auto self = static_cast<size_t>(r);
    if (send_counts[self] != recv_counts[self])
      o.fail(concat("all_to_all_v counts disagree: rank ", r, " sends ", send_counts[self], " elements to rank ", r,
                    ", which expects ", recv_counts[self]));
    std::vector<detail::Transfer> sends, recvs;
    for (int i = 1; i < n; ++i) {  // staggered so that not every rank talks to rank 0 first
      const auto to = static_cast<size_t>((r + i) % n), from = static_cast<size_t>((r + n - i) % n);
      if (recv_counts[from] > 0)
        recvs.push_back({static_cast<int>(from), at(recv, recv_displ[from], dtype), recv_counts[from]});
      if (send_counts[to] > 0)
        sends.push_back({static_cast<int>(to), const_cast<std::byte*>(at(send, send_displ[to], dtype)), send_counts[to]});
    }
    copy(at(recv, recv_displ[self], dtype), at(send, send_displ[self], dtype), recv_counts[self], dtype);
    if (!sends.empty() || !recvs.empty()) detail::exchange(o, sends, recvs, dtype, t.max_message_elements, o.tag());
  }

  // The direct reductions (reduce's root, small reduce_scatter): sends `sends` while `count`
  // elements come from every other rank into a slot of its own, `own` takes this rank's slot,
  // and `out` gets the slots folded in rank order (one order, whichever rank folds).
  void fold_from_every_rank(Op& o, const std::vector<detail::Transfer>& sends, const void* own, void* out,
                            int64_t count, DType wire, ReduceOp fold, const Tuning& t) {
    const int n = size();
    const auto slots = static_cast<std::byte*>(scratch(count * n, wire));
    std::vector<detail::Transfer> recvs;
    for (int p = 0; p < n && count > 0; ++p)
      if (p != rank()) recvs.push_back({p, at(slots, count * p, wire), count});
    copy(at(slots, count * rank(), wire), own, count, wire);
    detail::exchange(o, sends, recvs, wire, t.max_message_elements, o.tag());
    for (int p = 1; p < n && count > 0; ++p)
      ::tessera::detail::reduce_pair(slots, at(slots, count * p, wire), count, wire, fold);
    copy(out, slots, count, wire);
  }

  static std::string_view dtype_name(int64_t index) {
    return index >= 0 && index < kNumDTypes ? name(static_cast<DType>(index)) : std::string_view("?");
  }

  // Scratch for the ring's received chunks, kept between calls (a communicator runs one call at
  // a time).
  void* scratch(int64_t elements, DType dtype) {
    const auto bytes = static_cast<size_t>(elements * itemsize(dtype));
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }

  std::shared_ptr<Communicator> make_communicator(Op& o, MPI_Comm comm, int rank, std::vector<int> world);

  MPI_Comm comm_;  // collectives and the ring's point-to-point messages
  MPI_Comm p2p_;   // the user's send/recv
  std::shared_ptr<detail::P2pEngine> p2p_engine_;
  detail::GroupState group_;
  std::vector<std::byte> scratch_;
};

// A communicator over comm (owned from here on): its send/recv twin comes from MPI_Comm_idup,
// waited for with the timeout of the call that creates it.
std::shared_ptr<Communicator> MpiCommunicator::make_communicator(Op& o, MPI_Comm comm, int rank, std::vector<int> world) {
  set_errors_return(comm);
  MPI_Comm twins[2] = {MPI_COMM_NULL, MPI_COMM_NULL};  // send/recv, side channel (none for one rank)
  const int count = world.size() == 1 ? 1 : 2;
  for (int i = 0; i < count; ++i) {
    MPI_Request request;
    o.check(detail::locked([&] { return MPI_Comm_idup(comm, &twins[i], &request); }), "MPI_Comm_idup");
    o.wait(request, detail::library_pending);
    set_errors_return(twins[i]);
  }
  return std::make_shared<MpiCommunicator>(comm, twins[0], twins[1], rank, std::move(world));
}

}  // namespace

// The world's communicator over comm (owned from here on): its send/recv and side-channel twins
// come from MPI_Comm_dup, at init, where every rank makes them together.
std::shared_ptr<Communicator> detail::make_world_communicator(MPI_Comm comm, int rank, std::vector<int> world) {
  set_errors_return(comm);
  MPI_Comm twins[2] = {MPI_COMM_NULL, MPI_COMM_NULL};  // send/recv, side channel
  for (MPI_Comm& twin : twins) {
    const int rc = detail::locked([&] { return MPI_Comm_dup(comm, &twin); });
    if (rc != MPI_SUCCESS) throw CommError("[mpi::init] MPI_Comm_dup failed: " + detail::error_string(rc));
    set_errors_return(twin);
  }
  const bool alone = world.size() == 1;
  if (alone) MPI_Comm_free(&twins[1]);
  return std::make_shared<MpiCommunicator>(comm, twins[0], alone ? MPI_COMM_NULL : twins[1], rank, std::move(world));
}

void end_of_program(Communicator& world) {
  auto* mpi_world = dynamic_cast<MpiCommunicator*>(&world);
  if (!mpi_world || world.size() == 1) return;
  MPI_Comm end = MPI_COMM_NULL;
  {
    std::lock_guard lock(detail::process().mutex);
    end = detail::process().end_of_program;
  }
  if (end != MPI_COMM_NULL) mpi_world->end_of_program(end);
}

}  // namespace tessera::mpi
