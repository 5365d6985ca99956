// Non-blocking point-to-point (isend, irecv, sendrecv) on both backends: every posting and
// waiting order completes (none can deadlock), same-tag messages pair up in posting order,
// mismatches fail both sides, and unmatched waits time out naming the peer.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <tessera/comm/communicator.hpp>
#include <tessera/runtime/runtime.hpp>

#include "comm_test_util.hpp"

namespace tessera::testing {
namespace {

std::string where(const GroupCase& g, DType dtype, int64_t count, int peer, int tag) {
  return g.describe() + " " + std::string(name(dtype)) + " count " + std::to_string(count) + " peer " +
         std::to_string(peer) + " tag " + std::to_string(tag);
}

// Every rank sends to and receives from every other rank of every group, on two tags, all posted
// at once in an order that differs by rank (receives first on odd ranks, peers in reverse on
// some), then waited for in yet another order. Blocking calls in these orders would deadlock.
TEST(PointToPoint, EveryPairInAnyPostingAndWaitingOrder) {
  for_each_world(world_sizes(), [] {
    for (const GroupCase& g : group_cases()) {
      if (!g.comm || g.size() < 2) continue;
      Communicator& c = *g.comm;
      const int r = c.rank(), m = g.size();
      for (DType dtype : all_dtypes())
        for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{70000}}) {
          if (count == 70000 && dtype != DType::f64) continue;  // one large case: MPI's rendezvous path
          std::vector<int> peers;
          for (int p = 0; p < m; ++p)
            if (p != r) peers.push_back(p);
          if (r % 3 == 1) std::reverse(peers.begin(), peers.end());
          const std::vector<int> tags = {5, 1234};
          const auto message = [&](int from, int to, int tag) {
            return filled(dtype, count, [&](int64_t i) { return pattern(dtype, g.who(from), i, tag + 3 * to); });
          };
          std::vector<Buffer> outgoing, incoming;
          for (int p : peers)
            for (int tag : tags) {
              outgoing.push_back(message(r, p, tag));
              incoming.push_back(filled(dtype, count, [&](int64_t i) { return pattern(dtype, 77, i); }));
            }
          std::vector<Work> sends(outgoing.size()), recvs(incoming.size());
          const auto post_sends = [&] {
            for (size_t k = 0; k < outgoing.size(); ++k)
              sends[k] = c.isend(count ? outgoing[k].data() : nullptr, count, dtype, peers[k / 2], tags[k % 2]);
          };
          const auto post_recvs = [&] {
            for (size_t k = 0; k < incoming.size(); ++k)
              recvs[k] = c.irecv(count ? incoming[k].data() : nullptr, count, dtype, peers[k / 2], tags[k % 2]);
          };
          if (r % 2) post_recvs(), post_sends();
          else post_sends(), post_recvs();
          // Wait receives (last posted first), then sends.
          for (size_t k = recvs.size(); k-- > 0;) recvs[k].wait();
          for (Work& w : sends) w.wait();
          for (size_t k = 0; k < incoming.size(); ++k) {
            const int p = peers[k / 2], tag = tags[k % 2];
            EXPECT_TRUE(same_bits(incoming[k], message(p, r, tag), where(g, dtype, count, p, tag)));
            EXPECT_TRUE(recvs[k].is_completed());
          }
        }
    }
  });
}

// Several messages between two ranks on one tag pair up in posting order, even when their sizes
// differ and the receiver waits for the last one first; blocking calls join the same order.
TEST(PointToPoint, SameTagMessagesPairUpInPostingOrder) {
  for_each_world({2, 3, 4}, [] {
    Communicator& w = world();
    const int me = rank();
    if (me > 1) return;
    const int peer = 1 - me;
    const auto message = [](int k) {
      return filled(DType::i32, 3 + 50000 * (k % 2), [&](int64_t i) { return 1000 * k + i % 1000; });
    };
    if (me == 0) {
      std::vector<Buffer> out;
      for (int k = 0; k < 4; ++k) out.push_back(message(k));
      std::vector<Work> works;
      for (int k = 0; k < 3; ++k) works.push_back(w.isend(out[k].data(), out[k].count(), DType::i32, peer, 9));
      w.send(out[3].data(), out[3].count(), DType::i32, peer, 9);
      for (Work& work : works) work.wait();
    } else {
      std::vector<Buffer> in;
      for (int k = 0; k < 4; ++k) in.emplace_back(DType::i32, message(k).count());
      std::vector<Work> works;
      for (int k = 0; k < 3; ++k) works.push_back(w.irecv(in[k].data(), in[k].count(), DType::i32, peer, 9));
      for (size_t k = works.size(); k-- > 0;) works[k].wait();
      w.recv(in[3].data(), in[3].count(), DType::i32, peer, 9);
      for (int k = 0; k < 4; ++k) EXPECT_TRUE(same_bits(in[k], message(k), "message " + std::to_string(k)));
    }
  });
}

// sendrecv shifts a ring (each rank's block moves to the next rank) and an open chain (the ends
// pass -1), on every group; with two ranks dest and source are the same rank.
TEST(PointToPoint, SendrecvShiftsRingsAndChains) {
  for_each_world(world_sizes(), [] {
    for (const GroupCase& g : group_cases()) {
      if (!g.comm || g.size() < 2) continue;
      Communicator& c = *g.comm;
      const int r = c.rank(), m = g.size();
      for (const bool ring : {true, false}) {
        const int next = ring ? (r + 1) % m : (r + 1 < m ? r + 1 : -1);
        const int prev = ring ? (r + m - 1) % m : (r > 0 ? r - 1 : -1);
        const Buffer mine = filled(DType::f32, 5, [&](int64_t i) { return pattern(DType::f32, g.who(r), i); });
        Buffer got = filled(DType::f32, 5, [](int64_t) { return -1.0; });
        c.sendrecv(mine.data(), 5, next, got.data(), 5, prev, DType::f32, 2);
        const Buffer want = prev >= 0 ? filled(DType::f32, 5, [&](int64_t i) { return pattern(DType::f32, g.who(prev), i); })
                                      : filled(DType::f32, 5, [](int64_t) { return -1.0; });
        EXPECT_TRUE(same_bits(got, want, g.describe() + (ring ? " ring" : " chain")));
      }
    }
  });
}

// is_completed never blocks: false while the sender has not posted, true once the data is in.
TEST(PointToPoint, IsCompletedPollsWithoutBlocking) {
  for_each_world({2, 4}, [] {
    Communicator& w = world();
    const int me = rank();
    int64_t value = 0;
    if (me == 1) {
      const Work work = w.irecv(&value, 1, DType::i64, 0, 4);
      EXPECT_FALSE(work.is_completed());  // rank 0 sends only after the barrier
      w.barrier();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!work.is_completed() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      EXPECT_TRUE(work.is_completed());
      work.wait();
      EXPECT_EQ(value, 42);
    } else {
      w.barrier();
      if (me == 0) {
        value = 42;
        w.send(&value, 1, DType::i64, 1, 4);
      }
    }
  });
}

// A count or dtype mismatch fails both sides' Works, naming both; the channel stays usable.
TEST(PointToPoint, MismatchFailsBothSidesAndTheChannelStaysUsable) {
  for_each_world({2, 3}, [] {
    Communicator& w = world();
    const int me = rank();
    if (me > 1) return;
    const int peer = 1 - me;
    double data[6] = {1, 2, 3, 4, 5, 6};
    const auto check = [&](int64_t recv_count, DType recv_dtype, const std::string& expects) {
      Work work = me == 0 ? w.isend(data, 4, DType::f64, peer, 6) : w.irecv(data, recv_count, recv_dtype, peer, 6);
      EXPECT_TRUE(throws_with<CommError>([&] { work.wait(); },
                                         {me == 0 ? "[send] send/recv mismatch on group[" : "[recv] send/recv mismatch on group[",
                                          "rank 0 sent 4 f64, rank 1 expects " + expects + " (tag 6)"}));
      EXPECT_TRUE(work.is_completed());
    };
    check(5, DType::f64, "5 f64");
    check(4, DType::i64, "4 i64");
    double got[6] = {};
    if (me == 0) w.sendrecv(data, 6, peer, got, 6, peer, DType::f64, 6);
    else w.sendrecv(data, 6, peer, got, 6, peer, DType::f64, 6);
    EXPECT_EQ(got[5], 6.0);
  });
}

// Bad arguments are the caller's mistake, named before anything is posted.
TEST(PointToPoint, BadArgumentsNameTheCall) {
  for_each_world({2}, [] {
    Communicator& w = world();
    const int me = rank(), peer = (me + 1) % world_size();
    if (peer == me) return;
    float buf[2] = {};
    EXPECT_TRUE(value_error([&] { w.isend(buf, 2, DType::f32, peer, -1); }, {"[isend]", "tag -1 out of range"}));
    EXPECT_TRUE(value_error([&] { w.irecv(buf, 2, DType::f32, peer, kMaxP2pTag); },
                            {"[irecv]", "out of range", "expected [0, 268435456)"}));
    EXPECT_TRUE(value_error([&] { w.isend(buf, 2, DType::f32, me); }, {"[isend]", "sends to itself"}));
    EXPECT_TRUE(value_error([&] { w.irecv(nullptr, 2, DType::f32, peer); }, {"[irecv]", "data buffer is null"}));
    EXPECT_TRUE(value_error([&] { w.isend(buf, 2, DType::f32, 99); }, {"[isend]", "peer 99 out of range"}));
    EXPECT_TRUE(value_error([&] { w.sendrecv(buf, 1, -2, buf, 1, peer, DType::f32); }, {"[sendrecv]", "dest -2"}));
    w.barrier();
  });
}

// A receive nobody sends times out naming the call and the peer, and fails its group only.
TEST(PointToPoint, UnmatchedWaitTimesOutNamingThePeer) {
  const auto expect_timeout = [](Communicator& comm) {
    float buf[3] = {};
    const Work work = comm.irecv(buf, 3, DType::f32, 1, 8);
    EXPECT_TRUE(throws_with<CommError>([&] { work.wait(); }, {"[recv] timeout after 1 s in recv(f32, count=3, peer=1) #0",
                                                              "no matching send from rank 1"}));
  };
  if (under_mpi()) {  // the timeout is per process: only rank 0's wait runs under the short one
    const int me = rank();
    auto comm = world().split(0, me);
    if (me == 0) {
      TimeoutGuard timeout(1);
      expect_timeout(*comm);
    }
    world().barrier();  // the world still works
    return;
  }
  TimeoutGuard timeout(1);  // one process: every rank thread shares it
  std::atomic<bool> done{false};
  launch(2, [&] {
    auto comm = world().split(0, rank());
    if (rank() == 0) expect_timeout(*comm), done.store(true);
    else  // stays alive (a rank that ended would fail the wait at once) and silent
      while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  });
}

// Threads: a rank whose program ends fails the peers that wait for its message at once.
TEST(PointToPoint, APeerThatEndedFailsTheWaitAtOnce) {
  TESSERA_SKIP_UNDER_MPI();
  const auto start = std::chrono::steady_clock::now();
  launch(2, [] {
    if (rank() == 1) return;
    float buf[1] = {};
    const Work work = world().irecv(buf, 1, DType::f32, 1, 0);
    EXPECT_TRUE(throws_with<CommError>([&] { work.wait(); }, {"[recv]", "world rank 1 ended its program"}));
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
}

}  // namespace
}  // namespace tessera::testing
