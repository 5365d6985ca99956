// Every collective x every dtype x group shape (the world, rows and columns of a 2-d layout,
// the dims of a 2x2x2 layout, reversed orders from split keys), with uneven and zero-length
// contributions, against values the test computes itself. Threads backend: worlds of 1, 2, 3,
// 4 and 8 ranks; under mpirun the same tests run once on the MPI world.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <tessera/comm/communicator.hpp>
#include <tessera/runtime/runtime.hpp>

#include "comm_test_util.hpp"

using namespace tessera;
using namespace tessera::testing;

namespace {

std::string label(const GroupCase& g, const char* op, DType dtype, int64_t count) {
  return g.describe() + " " + op + " " + std::string(name(dtype)) + " count " + std::to_string(count);
}

std::string label(const GroupCase& g, const char* op, DType dtype, ReduceOp rop, int64_t count) {
  return label(g, op, dtype, count) + " " + std::string(name(rop));
}

// how_many of values for the k-th case of a test, rotating through them: over the cases every
// value meets every value of the other parameters' loops without the full product of calls
// (each call is a rendezvous; 8 ranks on 2 loaded cores make those the cost of the suite).
template <class T>
std::vector<T> picks(const std::vector<T>& values, size_t k, size_t how_many) {
  std::vector<T> out;
  for (size_t j = 0; j < how_many; ++j) out.push_back(values[(k + j) % values.size()]);
  return out;
}

// The reduce op of the k-th case that is defined for dtype.
ReduceOp op_for(DType dtype, size_t k) {
  const auto& ops = all_reduce_ops();
  ReduceOp op = ops[k % ops.size()];
  return defined(dtype, op) ? op : ReduceOp::sum;
}

// Distinct roots worth testing: first, last, middle.
std::vector<int> roots_of(int size) {
  std::set<int> roots = {0, size - 1, size / 2};
  return {roots.begin(), roots.end()};
}

// Per-rank counts of the _v forms, zeros included.
std::vector<std::vector<int64_t>> count_variants(int size) {
  std::vector<std::vector<int64_t>> variants(4, std::vector<int64_t>(static_cast<size_t>(size)));
  for (int k = 0; k < size; ++k) {
    const auto i = static_cast<size_t>(k);
    variants[0][i] = k % 3;                 // rank 0 (and every third) contributes nothing
    variants[1][i] = k == size - 1 ? 5 : 0;  // only the last rank contributes
    variants[2][i] = 0;                     // nobody contributes
    variants[3][i] = 2 * k + 1;             // every rank, unevenly
  }
  return variants;
}

std::vector<int64_t> displacements(const std::vector<int64_t>& counts) {
  std::vector<int64_t> d(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) d[i + 1] = d[i] + counts[i];
  return d;
}

// FNV-1a of the bytes: results are bit-identical on every rank iff the hashes are.
int64_t hash_of(const Buffer& b) {
  uint64_t h = 1469598103934665603ull;
  for (std::byte x : b.bytes) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
  return std::bit_cast<int64_t>(h);
}

void expect_identical_across(Communicator& comm, const Buffer& b, const std::string& what) {
  const int64_t mine = hash_of(b);
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&mine, all.data(), 1, DType::i64);
  for (int k = 0; k < comm.size(); ++k)
    EXPECT_EQ(all[static_cast<size_t>(k)], mine) << what << ": group rank " << k << " holds different bits";
}

// --- all_reduce ------------------------------------------------------------------------------

void check_all_reduce(const GroupCase& g, DType dtype, ReduceOp op, int64_t count) {
  const int me = rank();
  Buffer buf = filled(dtype, count, [&](int64_t i) { return contribution(dtype, op, me, i); });
  g.comm->all_reduce(count ? buf.data() : nullptr, count, dtype, op);
  const auto value = [&](int who, int64_t i) { return contribution(dtype, op, who, i); };
  const Buffer want = filled(dtype, count, [&](int64_t i) { return reduce_expected(dtype, op, g.members, i, value); });
  EXPECT_TRUE(same_bits(buf, want, label(g, "all_reduce", dtype, op, count)));
}

TEST(Collectives, AllReduceEveryOpDtypeAndGroup) {
  for_each_world(world_sizes(), [] {
    for (const GroupCase& g : group_cases()) {
      if (!g.comm) continue;
      size_t k = 0;
      for (DType dtype : all_dtypes())
        for (ReduceOp op : all_reduce_ops())
          if (defined(dtype, op))
            for (int64_t count : picks<int64_t>({0, 1, 7, 35}, k++, 1)) check_all_reduce(g, dtype, op, count);
    }
  });
}

// Above 64 KiB the threads backend splits the reduction (every rank reduces one slice, then
// the slices are gathered). Counts are not multiples of the group size. Each rank checks every
// size-th element (and the ends); equal hashes on every rank then cover the whole buffer.
TEST(Collectives, AllReduceLargeTakesTheSplitPath) {
  for_each_world(world_sizes(), [] {
    const int me = rank(), n = world_size();
    auto cases = group_cases();
    for (GroupCase& g : cases) {
      const bool wanted = g.label == "world" || g.label.rfind("rows", 0) == 0 || g.label == "even ranks reversed";
      if (!g.comm || !wanted) continue;
      size_t k = 0;
      for (DType dtype : all_dtypes()) {
        ++k;
        for (ReduceOp op : all_reduce_ops()) {
          // two ops per dtype on the world, one on the sub-groups, rotating through the ops
          const bool chosen = op == op_for(dtype, k) || (g.label == "world" && op == op_for(dtype, k + 2));
          if (!defined(dtype, op) || !chosen) continue;
          const int64_t count = 64 * 1024 / itemsize(dtype) + 3 + n;
          Buffer buf = filled(dtype, count, [&](int64_t i) { return contribution(dtype, op, me, i); });
          g.comm->all_reduce(buf.data(), count, dtype, op);
          const auto value = [&](int who, int64_t i) { return contribution(dtype, op, who, i); };
          const std::string what = label(g, "all_reduce", dtype, op, count);
          const int r = g.comm->rank(), m = g.size();
          int bad = 0;
          for (int64_t i = 0; i < count && bad < 3; ++i) {
            if (i % m != r && i >= 16 && i < count - 16) continue;
            const double want = reduce_expected(dtype, op, g.members, i, value);
            Buffer expected(dtype, 1), got(dtype, 1);
            expected.set(0, want);
            std::memcpy(got.data(), buf.bytes.data() + i * itemsize(dtype), static_cast<size_t>(itemsize(dtype)));
            const auto same = same_bits(got, expected, what + " element " + std::to_string(i));
            if (!same) ++bad;
            EXPECT_TRUE(same);
          }
          expect_identical_across(*g.comm, buf, what);
        }
      }
    }
  });
}

// f16/bf16 reduce with f32 accumulation and round once: 256 + 1 + 1 + ... is 256 if every step
// rounded to bf16 (257 is a tie that rounds to even), but the exact sum rounded once otherwise.
TEST(Collectives, HalfPrecisionAccumulatesInFloatAndRoundsOnce) {
  for_each_world(world_sizes(), [] {
    const int me = rank(), n = world_size();
    for (DType dtype : {DType::bf16, DType::f16}) {
      const double big = dtype == DType::bf16 ? 256 : 2048;
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        const int64_t small = 5, large = 64 * 1024 / 2 + 1;  // both reduction paths
        for (int64_t count : {small, large}) {
          Buffer buf = filled(dtype, count, [&](int64_t) { return me == 0 ? big : 1.0; });
          world().all_reduce(buf.data(), count, dtype, op);
          float exact = static_cast<float>(big) + static_cast<float>(n - 1);
          if (op == ReduceOp::avg) exact /= static_cast<float>(n);
          const double want = dtype == DType::bf16 ? to_double(BFloat16(exact)) : to_double(Half(exact));
          EXPECT_TRUE(same_bits(buf, filled(dtype, count, [&](int64_t) { return want; }),
                                std::string(name(dtype)) + " " + std::string(name(op)) + " of " +
                                    std::to_string(count) + " on " + std::to_string(n) + " ranks"));
        }
      }
      // reduce_scatter and reduce accumulate the same way.
      Buffer send = filled(dtype, 2 * n, [&](int64_t) { return me == 0 ? big : 1.0; });
      Buffer recv(dtype, 2), root_recv(dtype, 2 * n);
      world().reduce_scatter(send.data(), recv.data(), 2, dtype, ReduceOp::sum);
      world().reduce(send.data(), root_recv.data(), 2 * n, dtype, ReduceOp::sum, 0);
      const float exact = static_cast<float>(big) + static_cast<float>(n - 1);
      const double want = dtype == DType::bf16 ? to_double(BFloat16(exact)) : to_double(Half(exact));
      EXPECT_TRUE(same_bits(recv, filled(dtype, 2, [&](int64_t) { return want; }), "reduce_scatter"));
      if (me == 0) {
        EXPECT_TRUE(same_bits(root_recv, filled(dtype, 2 * n, [&](int64_t) { return want; }), "reduce"));
      }
    }
  });
}

// --- all_gather, all_gather_v -----------------------------------------------------------------

TEST(Collectives, AllGatherEveryDtypeAndGroup) {
  for_each_world(world_sizes(), [] {
    const int me = rank();
    for (const GroupCase& g : group_cases()) {
      if (!g.comm) continue;
      for (DType dtype : all_dtypes())
        for (int64_t count : {0, 1, 5}) {
          const Buffer send = filled(dtype, count, [&](int64_t i) { return pattern(dtype, me, i, 1); });
          Buffer recv = filled(dtype, count * g.size(), [&](int64_t i) { return pattern(dtype, 99, i, 7); });
          g.comm->all_gather(send.data(), recv.data(), count, dtype);
          const Buffer want = filled(dtype, count * g.size(),
                                     [&](int64_t i) { return pattern(dtype, g.who(static_cast<int>(i / count)), i % count, 1); });
          EXPECT_TRUE(same_bits(recv, want, label(g, "all_gather", dtype, count)));
        }
    }
  });
}

TEST(Collectives, AllGatherVUnevenAndZeroCounts) {
  for_each_world(world_sizes(), [] {
    const int me = rank();
    for (const GroupCase& g : group_cases()) {
      if (!g.comm) continue;
      const int r = g.comm->rank();
      for (const auto& counts : count_variants(g.size()))
        for (DType dtype : all_dtypes()) {
          const auto displ = displacements(counts);
          const int64_t own = counts[static_cast<size_t>(r)], total = displ.back();
          const Buffer send = filled(dtype, own, [&](int64_t i) { return pattern(dtype, me, i, 2); });
          Buffer recv = filled(dtype, total, [&](int64_t i) { return pattern(dtype, 98, i, 7); });
          g.comm->all_gather_v(own ? send.data() : nullptr, total ? recv.data() : nullptr, counts, dtype);
          Buffer want(dtype, total);
          for (int k = 0; k < g.size(); ++k)
            for (int64_t i = 0; i < counts[static_cast<size_t>(k)]; ++i)
              want.set(displ[static_cast<size_t>(k)] + i, pattern(dtype, g.who(k), i, 2));
          EXPECT_TRUE(same_bits(recv, want, label(g, "all_gather_v", dtype, total) + " counts " + ::testing::PrintToString(counts)));
        }
    }
  });
}

// --- reduce_scatter, reduce_scatter_v ---------------------------------------------------------

TEST(Collectives, ReduceScatterEveryOpDtypeAndGroup) {
  for_each_world(world_sizes(), [] {
    const int me = rank();
    for (const GroupCase& g : group_cases()) {
      if (!g.comm) continue;
      const int r = g.comm->rank();
      size_t k = 0;
      for (DType dtype : all_dtypes())
        for (ReduceOp op : all_reduce_ops()) {
          if (!defined(dtype, op)) continue;
          for (int64_t count : picks<int64_t>({0, 1, 5}, k++, 1)) {
            const Buffer send = filled(dtype, count * g.size(), [&](int64_t i) { return contribution(dtype, op, me, i); });
            Buffer recv = filled(dtype, count, [&](int64_t i) { return pattern(dtype, 97, i); });
            g.comm->reduce_scatter(send.data(), recv.data(), count, dtype, op);
            const auto value = [&](int who, int64_t i) { return contribution(dtype, op, who, i); };
            const Buffer want = filled(dtype, count, [&](int64_t i) {
              return reduce_expected(dtype, op, g.members, r * count + i, value);
            });
            EXPECT_TRUE(same_bits(recv, want, label(g, "reduce_scatter", dtype, op, count)));
          }
        }
    }
  });
}

TEST(Collectives, ReduceScatterVUnevenAndZeroCounts) {
  for_each_world(world_sizes(), [] {
    const int me = rank();
    for (const GroupCase& g : group_cases()) {
      if (!g.comm) continue;
      const int r = g.comm->rank();
      size_t k = 0;
      for (const auto& counts : count_variants(g.size()))
        for (DType dtype : all_dtypes()) {
          const ReduceOp op = op_for(dtype, k++);  // rotating: every op meets every variant
          const auto displ = displacements(counts);
          const int64_t own = counts[static_cast<size_t>(r)], total = displ.back();
          const Buffer send = filled(dtype, total, [&](int64_t i) { return contribution(dtype, op, me, i); });
          Buffer recv = filled(dtype, own, [&](int64_t i) { return pattern(dtype, 96, i); });
          g.comm->reduce_scatter_v(total ? send.data() : nullptr, own ? recv.data() : nullptr, counts, dtype, op);
          const auto value = [&](int who, int64_t i) { return contribution(dtype, op, who, i); };
          const Buffer want = filled(dtype, own, [&](int64_t i) {
            return reduce_expected(dtype, op, g.members, displ[static_cast<size_t>(r)] + i, value);
          });
          EXPECT_TRUE(same_bits(recv, want, label(g, "reduce_scatter_v", dtype, op, total) + " counts " +
                                                ::testing::PrintToString(counts)));
        }
    }
  });
}

// --- all_to_all, all_to_all_v -------------------------------------------------------------------

TEST(Collectives, AllToAllEveryDtypeAndGroup) {
  for_each_world(world_sizes(), [] {
    const int me = rank();
    for (const GroupCase& g : group_cases()) {
      if (!g.comm) continue;
      const int r = g.comm->rank(), m = g.size();
      for (DType dtype : all_dtypes())
        for (int64_t count : {0, 1, 3}) {
          // element j of block p goes from me to group rank p
          const Buffer send = filled(dtype, count * m, [&](int64_t i) { return pattern(dtype, me, i, 3); });
          Buffer recv = filled(dtype, count * m, [&](int64_t i) { return pattern(dtype, 95, i); });
          g.comm->all_to_all(send.data(), recv.data(), count, dtype);
          const Buffer want = filled(dtype, count * m, [&](int64_t i) {
            const int p = static_cast<int>(i / count);
            return pattern(dtype, g.who(p), r * count + i % count, 3);
          });
          EXPECT_TRUE(same_bits(recv, want, label(g, "all_to_all", dtype, count)));
        }
    }
  });
}

// Counts from group rank s to group rank d, zeros included.
int64_t a2a_count(int variant, int s, int d) {
  switch (variant) {
    case 0:
      return (s + 2 * d) % 3;
    case 1:
      return (2 * s + d + 1) % 4;
    case 2:
      return 0;  // nothing moves
    case 3:
      return s == d ? 2 : 0;  // only to self
    default:
      return d == 0 ? s + 1 : 0;  // everything to rank 0
  }
}

TEST(Collectives, AllToAllVUnevenAndZeroCounts) {
  for_each_world(world_sizes(), [] {
    for (const GroupCase& g : group_cases()) {
      if (!g.comm) continue;
      const int r = g.comm->rank(), m = g.size();
      for (int variant = 0; variant < 5; ++variant)
        for (DType dtype : all_dtypes()) {
          std::vector<int64_t> send_counts, recv_counts;
          for (int p = 0; p < m; ++p) {
            send_counts.push_back(a2a_count(variant, r, p));
            recv_counts.push_back(a2a_count(variant, p, r));
          }
          const auto sdispl = displacements(send_counts), rdispl = displacements(recv_counts);
          const Buffer send = filled(dtype, sdispl.back(), [&](int64_t i) { return pattern(dtype, g.who(r), i, 4); });
          Buffer recv = filled(dtype, rdispl.back(), [&](int64_t i) { return pattern(dtype, 94, i); });
          g.comm->all_to_all_v(sdispl.back() ? send.data() : nullptr, send_counts,
                               rdispl.back() ? recv.data() : nullptr, recv_counts, dtype);
          Buffer want(dtype, rdispl.back());
          for (int p = 0; p < m; ++p) {
            std::vector<int64_t> peer_counts;  // what p sends to each rank
            for (int d = 0; d < m; ++d) peer_counts.push_back(a2a_count(variant, p, d));
            const int64_t offset = displacements(peer_counts)[static_cast<size_t>(r)];
            for (int64_t j = 0; j < recv_counts[static_cast<size_t>(p)]; ++j)
              want.set(rdispl[static_cast<size_t>(p)] + j, pattern(dtype, g.who(p), offset + j, 4));
          }
          EXPECT_TRUE(same_bits(recv, want, label(g, "all_to_all_v", dtype, rdispl.back()) + " variant " +
                                                std::to_string(variant)));
        }
    }
  });
}

// --- rooted collectives -------------------------------------------------------------------------

TEST(Collectives, BroadcastEveryRootDtypeAndGroup) {
  for_each_world(world_sizes(), [] {
    const int me = rank();
    for (const GroupCase& g : group_cases()) {
      if (!g.comm) continue;
      const int r = g.comm->rank();
      size_t k = 0;
      for (int root : roots_of(g.size()))
        for (DType dtype : all_dtypes())
          for (int64_t count : picks<int64_t>({0, 1, 9}, k++, 1)) {
            Buffer buf = filled(dtype, count, [&](int64_t i) {
              return r == root ? pattern(dtype, me, i, root) : pattern(dtype, 93, i, me);
            });
            g.comm->broadcast(count ? buf.data() : nullptr, count, dtype, root);
            const Buffer want = filled(dtype, count, [&](int64_t i) { return pattern(dtype, g.who(root), i, root); });
            EXPECT_TRUE(same_bits(buf, want, label(g, "broadcast", dtype, count) + " root " + std::to_string(root)));
          }
    }
  });
}

// recv matters only on the root: elsewhere it may be null and is left untouched.
TEST(Collectives, ReduceEveryRootOpDtypeAndGroup) {
  for_each_world(world_sizes(), [] {
    const int me = rank();
    for (const GroupCase& g : group_cases()) {
      if (!g.comm) continue;
      const int r = g.comm->rank();
      size_t k = 0;
      for (DType dtype : all_dtypes())
        for (ReduceOp op : all_reduce_ops()) {
          if (!defined(dtype, op)) continue;
          for (int root : picks(roots_of(g.size()), k, 1))
            for (int64_t count : picks<int64_t>({0, 1, 6}, k++ / 3, 1)) {
              const Buffer send = filled(dtype, count, [&](int64_t i) { return contribution(dtype, op, me, i); });
              const Buffer untouched = filled(dtype, count, [&](int64_t i) { return pattern(dtype, 92, i, me); });
              Buffer recv = untouched;
              const bool null_recv = r != root && r % 2 == 1;
              g.comm->reduce(send.data(), null_recv ? nullptr : recv.data(), count, dtype, op, root);
              const std::string what = label(g, "reduce", dtype, op, count) + " root " + std::to_string(root);
              if (r == root) {
                const auto value = [&](int who, int64_t i) { return contribution(dtype, op, who, i); };
                EXPECT_TRUE(same_bits(recv, filled(dtype, count, [&](int64_t i) {
                                        return reduce_expected(dtype, op, g.members, i, value);
                                      }),
                                      what));
              } else {
                EXPECT_TRUE(same_bits(recv, untouched, what + " (recv of a non-root)"));
              }
            }
          }
    }
  });
}

TEST(Collectives, GatherEveryRootDtypeAndGroup) {
  for_each_world(world_sizes(), [] {
    const int me = rank();
    for (const GroupCase& g : group_cases()) {
      if (!g.comm) continue;
      const int r = g.comm->rank(), m = g.size();
      size_t k = 0;
      for (int root : roots_of(m))
        for (DType dtype : all_dtypes())
          for (int64_t count : picks<int64_t>({0, 1, 4}, k++, 1)) {
            const Buffer send = filled(dtype, count, [&](int64_t i) { return pattern(dtype, me, i, 5); });
            const Buffer untouched = filled(dtype, count * m, [&](int64_t i) { return pattern(dtype, 91, i); });
            Buffer recv = untouched;
            const bool null_recv = r != root && r % 2 == 1;
            g.comm->gather(send.data(), null_recv ? nullptr : recv.data(), count, dtype, root);
            const std::string what = label(g, "gather", dtype, count) + " root " + std::to_string(root);
            if (r == root) {
              EXPECT_TRUE(same_bits(recv, filled(dtype, count * m, [&](int64_t i) {
                                      return pattern(dtype, g.who(static_cast<int>(i / count)), i % count, 5);
                                    }),
                                    what));
            } else {
              EXPECT_TRUE(same_bits(recv, untouched, what + " (recv of a non-root)"));
            }
          }
    }
  });
}

TEST(Collectives, ScatterEveryRootDtypeAndGroup) {
  for_each_world(world_sizes(), [] {
    const int me = rank();
    for (const GroupCase& g : group_cases()) {
      if (!g.comm) continue;
      const int r = g.comm->rank(), m = g.size();
      size_t k = 0;
      for (int root : roots_of(m))
        for (DType dtype : all_dtypes())
          for (int64_t count : picks<int64_t>({0, 1, 4}, k++, 1)) {
            // only the root's send matters: elsewhere it is null or junk
            const Buffer send = filled(dtype, count * m, [&](int64_t i) {
              return r == root ? pattern(dtype, me, i, 6) : pattern(dtype, 90, i, me);
            });
            const bool null_send = r != root && r % 2 == 1;
            Buffer recv = filled(dtype, count, [&](int64_t i) { return pattern(dtype, 89, i); });
            g.comm->scatter(null_send ? nullptr : send.data(), recv.data(), count, dtype, root);
            const Buffer want = filled(dtype, count, [&](int64_t i) { return pattern(dtype, g.who(root), r * count + i, 6); });
            EXPECT_TRUE(same_bits(recv, want, label(g, "scatter", dtype, count) + " root " + std::to_string(root)));
          }
    }
  });
}

// --- point to point ----------------------------------------------------------------------------

// Every ordered pair exchanges one message each way, pairs in one global order (so blocking
// sends cannot deadlock), two tags per direction received in the order sent.
TEST(Collectives, SendRecvEveryPairDtypeAndGroup) {
  for_each_world(world_sizes(), [] {
    for (const GroupCase& g : group_cases()) {
      if (!g.comm) continue;
      const int r = g.comm->rank(), m = g.size();
      for (DType dtype : all_dtypes())
        for (int64_t count : {0, 1, 5})
          for (int a = 0; a < m; ++a)
            for (int b = a + 1; b < m; ++b) {
              if (r != a && r != b) continue;
              const int peer = r == a ? b : a;
              const auto message = [&](int from, int tag) {
                return filled(dtype, count, [&](int64_t i) { return pattern(dtype, g.who(from), i, tag); });
              };
              const auto send_both = [&] {
                for (int tag : {3, 11}) {
                  const Buffer out = message(r, tag + peer);
                  g.comm->send(count ? out.data() : nullptr, count, dtype, peer, tag);
                }
              };
              const auto recv_both = [&] {
                for (int tag : {3, 11}) {
                  Buffer in = filled(dtype, count, [&](int64_t i) { return pattern(dtype, 88, i); });
                  g.comm->recv(count ? in.data() : nullptr, count, dtype, peer, tag);
                  EXPECT_TRUE(same_bits(in, message(peer, tag + r),
                                        label(g, "recv", dtype, count) + " from " + std::to_string(peer) + " tag " +
                                            std::to_string(tag)));
                }
              };
              if (r == a) {
                send_both();
                recv_both();
              } else {
                recv_both();
                send_both();
              }
            }
    }
  });
}

// A receiver picks messages by peer and tag: two ranks send to rank 0 at once, rank 0 takes
// them in the opposite order of their ranks.
TEST(Collectives, RecvMatchesPeerAndTag) {
  for_each_world(world_sizes(), [] {
    const int me = rank(), n = world_size();
    if (n < 3) return;
    Communicator& w = world();
    if (me == 1 || me == 2) {
      const Buffer out = filled(DType::i32, 4, [&](int64_t i) { return me * 100 + i; });
      w.send(out.data(), 4, DType::i32, 0, /*tag=*/40 + me);
    } else if (me == 0) {
      for (int from : {2, 1}) {
        Buffer in(DType::i32, 4);
        w.recv(in.data(), 4, DType::i32, from, 40 + from);
        EXPECT_TRUE(same_bits(in, filled(DType::i32, 4, [&](int64_t i) { return from * 100 + i; }),
                              "message from rank " + std::to_string(from)));
      }
    }
    w.barrier();
  });
}

// --- barrier, split ------------------------------------------------------------------------------

// After a barrier every rank of the group has arrived (threads: a shared counter proves it).
TEST(Collectives, BarrierSynchronisesEveryGroup) {
  static std::atomic<int> arrived[8];
  for_each_world(world_sizes(), [] {
    const bool shared_memory = !under_mpi();
    for (const GroupCase& g : group_cases()) {
      if (!g.comm) continue;
      const int leader = g.who(0), m = g.size();
      if (shared_memory && g.comm->rank() == 0) arrived[leader].store(0);
      g.comm->barrier();  // the reset is visible before anyone counts
      for (int round = 0; round < 3; ++round) {
        if (shared_memory) arrived[leader].fetch_add(1);
        g.comm->barrier();
        if (shared_memory) {
          const int seen = arrived[leader].load();
          EXPECT_GE(seen, m * (round + 1)) << g.describe() << " round " << round;
          EXPECT_LT(seen, m * (round + 2)) << g.describe() << " round " << round;
        }
      }
      g.comm->barrier();  // everyone read the counter before the next group resets it
    }
  });
}

// group_cases() checks membership and order of every split; this adds the corner cases.
TEST(Collectives, SplitOrdersByKeyThenRankAndNests) {
  for_each_world(world_sizes(), [] {
    const int me = rank(), n = world_size();
    Communicator& w = world();
    // Equal keys: ordered by parent rank.
    GroupCase same = split_case(w, "one color, equal keys", [](int) { return 7; }, [](int) { return 0; });
    ASSERT_NE(same.comm, nullptr);
    EXPECT_EQ(same.comm->rank(), me);
    // Keys reversing the world.
    GroupCase reversed = split_case(w, "reversed", [](int) { return 0; }, [](int r) { return -r; });
    ASSERT_NE(reversed.comm, nullptr);
    EXPECT_EQ(reversed.comm->rank(), n - 1 - me);
    // Singletons: every rank its own color.
    GroupCase single = split_case(w, "singletons", [](int r) { return r; }, [](int) { return 0; });
    ASSERT_NE(single.comm, nullptr);
    EXPECT_EQ(single.comm->size(), 1);
    int64_t x = me + 1;
    single.comm->all_reduce(&x, 1, DType::i64, ReduceOp::sum);
    EXPECT_EQ(x, me + 1);
    single.comm->barrier();
    // Everyone out but rank 0.
    GroupCase only0 = split_case(w, "only rank 0", [](int r) { return r == 0 ? 0 : -1; }, [](int) { return 0; });
    EXPECT_EQ(only0.comm != nullptr, me == 0);
    // A split of a split: the reversed world split into halves by key parity; members in the
    // parent's (reversed) order, world ranks mapped through.
    auto half = reversed.comm->split(reversed.comm->rank() % 2, 0);
    ASSERT_NE(half, nullptr);
    std::vector<int> expected;
    for (int k = 0; k < n; ++k)
      if (k % 2 == reversed.comm->rank() % 2) expected.push_back(n - 1 - k);
    EXPECT_EQ(half->world_ranks(), expected);
    int64_t sum = me;
    half->all_reduce(&sum, 1, DType::i64, ReduceOp::sum);
    EXPECT_EQ(sum, std::accumulate(expected.begin(), expected.end(), int64_t{0}));
    // to_string names the world ranks.
    std::string names = "group[";
    for (size_t i = 0; i < expected.size(); ++i) names.append(i ? ", " : "").append(std::to_string(expected[i]));
    EXPECT_TRUE(starts_with(half->to_string(), names + "]")) << half->to_string();
    EXPECT_TRUE(contains(half->to_string(), std::string(half->backend()))) << half->to_string();
    // Groups are independent: interleaved collectives on the parent and the children.
    int64_t a = 1, b = 1;
    w.all_reduce(&a, 1, DType::i64, ReduceOp::sum);
    half->all_reduce(&b, 1, DType::i64, ReduceOp::sum);
    EXPECT_EQ(a, n);
    EXPECT_EQ(b, static_cast<int64_t>(expected.size()));
  });
}

// Mixed traffic on one communicator keeps working: collectives of every kind back to back,
// checked for the sequence numbering the desync check relies on.
TEST(Collectives, BackToBackMixedCollectives) {
  for_each_world(world_sizes(), [] {
    const int me = rank(), n = world_size();
    Communicator& w = world();
    for (int round = 0; round < 20; ++round) {
      int64_t v = me + round;
      w.all_reduce(&v, 1, DType::i64, ReduceOp::max);
      EXPECT_EQ(v, n - 1 + round);
      std::vector<int32_t> all(static_cast<size_t>(n));
      const int32_t mine = me * round;
      w.all_gather(&mine, all.data(), 1, DType::i32);
      for (int k = 0; k < n; ++k) EXPECT_EQ(all[static_cast<size_t>(k)], k * round);
      double d = me == round % n ? 1.5 * round : -1;
      w.broadcast(&d, 1, DType::f64, round % n);
      EXPECT_EQ(d, 1.5 * round);
      w.barrier();
    }
  });
}

}  // namespace
