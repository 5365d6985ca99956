// Runtime: launch/run start one program as N ranks; rank(), world_size(), world() of the
// calling rank (thread-local); errors outside a rank, nested launches, bad rank counts; run()'s
// rank count from --ranks and TESSERA_RANKS and its exit status; one default generator per rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <tessera/comm/communicator.hpp>
#include <tessera/ops/random.hpp>
#include <tessera/runtime/runtime.hpp>

#include <rank_test_util.hpp>
#include <test_util.hpp>

using namespace tessera;
using namespace tessera::testing;

namespace {

const std::vector<int>& world_sizes() {
  static const std::vector<int> sizes = {1, 2, 3, 4, 8};
  return sizes;
}

// Sets (or unsets, with nullopt) an environment variable for the scope; restores it after.
class EnvGuard {
 public:
  EnvGuard(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    if (value) setenv(name, value->c_str(), 1);
    else unsetenv(name);
  }
  ~EnvGuard() {
    if (saved_) setenv(name_, saved_->c_str(), 1);
    else unsetenv(name_);
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

// Restores the global comm timeout when it leaves scope.
class TimeoutGuard {
 public:
  explicit TimeoutGuard(double seconds) : saved_(comm_timeout_seconds()) { set_comm_timeout_seconds(seconds); }
  ~TimeoutGuard() { set_comm_timeout_seconds(saved_); }
  TimeoutGuard(const TimeoutGuard&) = delete;
  TimeoutGuard& operator=(const TimeoutGuard&) = delete;

 private:
  double saved_;
};

// run() with these arguments; returns its status and the world sizes its ranks saw.
struct RunResult {
  int status = -1;
  std::vector<int> sizes;  // world_size() on each rank that ran
  std::set<int> ranks;
};

RunResult run_with(std::vector<std::string> args, const std::function<void()>& extra = [] {}) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  RunResult result;
  std::mutex mutex;
  result.status = run(static_cast<int>(args.size()), argv.data(), [&] {
    {
      std::lock_guard lock(mutex);
      result.sizes.push_back(world_size());
      result.ranks.insert(rank());
    }
    extra();
  });
  return result;
}

std::set<int> zero_to(int n) {
  std::set<int> s;
  for (int r = 0; r < n; ++r) s.insert(r);
  return s;
}

// --- rank context ------------------------------------------------------------------------------

TEST(Runtime, RankAndWorldSizeInsideLaunch) {
  TESSERA_SKIP_UNDER_MPI();
  for (int n : world_sizes()) {
    std::mutex mutex;
    std::multiset<int> seen;
    launch(n, [&] {
      EXPECT_TRUE(in_rank());
      EXPECT_EQ(world_size(), n);
      EXPECT_EQ(world().size(), n);
      EXPECT_EQ(world().rank(), rank());
      EXPECT_EQ(world_ptr().get(), &world());
      EXPECT_EQ(world().backend(), "threads");
      std::lock_guard lock(mutex);
      seen.insert(rank());
    });
    EXPECT_EQ(std::set<int>(seen.begin(), seen.end()), zero_to(n)) << n << " ranks";
    EXPECT_EQ(seen.size(), static_cast<size_t>(n)) << "each rank runs the body once";
  }
}

// The same on either backend: ranks are 0..n-1, each once, agreeing on the world size.
TEST(Runtime, RanksAreDistinctOnEveryBackend) {
  for_each_world(world_sizes(), [] {
    const int n = world_size();
    ASSERT_GE(n, 1);
    EXPECT_GE(rank(), 0);
    EXPECT_LT(rank(), n);
    std::vector<int32_t> all(static_cast<size_t>(n));
    const int32_t mine = rank(), size = n;
    world().all_gather(&mine, all.data(), 1, DType::i32);
    for (int k = 0; k < n; ++k) EXPECT_EQ(all[static_cast<size_t>(k)], k);
    world().all_gather(&size, all.data(), 1, DType::i32);
    for (int k = 0; k < n; ++k) EXPECT_EQ(all[static_cast<size_t>(k)], n);
  });
}

void expect_outside_a_rank() {
  EXPECT_FALSE(in_rank());
  EXPECT_TRUE(value_error([] { (void)rank(); }, {"[rank]", "called outside a rank", "tessera::run or tessera::launch"}));
  EXPECT_TRUE(value_error([] { (void)world_size(); }, {"[world_size]", "called outside a rank"}));
  EXPECT_TRUE(value_error([] { (void)world(); }, {"[world]", "called outside a rank"}));
  EXPECT_TRUE(value_error([] { (void)world_ptr(); }, {"[world]", "called outside a rank"}));
}

TEST(Runtime, OutsideARankIsAValueError) {
  // A thread of its own is outside every rank on both backends.
  std::thread([] { expect_outside_a_rank(); }).join();
  if (!under_mpi()) expect_outside_a_rank();  // so is the test's own thread with threads
}

// The context is per thread: every rank reads its own while the others read theirs; a thread a
// rank starts is not a rank; the caller of launch has no context before or after.
TEST(Runtime, RankContextIsThreadLocal) {
  TESSERA_SKIP_UNDER_MPI();
  expect_outside_a_rank();
  const int n = 8;
  std::atomic<int> wrong{0};
  launch(n, [&] {
    const int me = rank();
    for (int i = 0; i < 2000; ++i) {
      if (rank() != me || world().rank() != me || world_size() != n) wrong.fetch_add(1);
      if (i % 100 == 0) std::this_thread::yield();
    }
    world().barrier();
    EXPECT_EQ(rank(), me);
    std::thread([] { expect_outside_a_rank(); }).join();
    EXPECT_EQ(rank(), me);  // untouched by the helper thread
  });
  EXPECT_EQ(wrong.load(), 0);
  expect_outside_a_rank();
  // Also after a launch whose body threw.
  EXPECT_THROW(launch(2, [] { throw ValueError("[t] x"); }), ValueError);
  expect_outside_a_rank();
}

// Per-rank state (rank_local): one value per rank, kept across calls, shared with the rank's own
// threads (rank_thread) even when they ask for it first at the same time, released with the
// rank; outside a rank a ValueError.
TEST(Runtime, RankLocalStateIsOnePerRank) {
  for_each_world(world_sizes(), [] {
    auto& counter = rank_local<std::atomic<int64_t>>("tessera.test.counter");
    EXPECT_EQ(counter.load(), 0);  // value-initialised, and empty again in every launch
    counter += rank() + 1;
    EXPECT_EQ(&rank_local<std::atomic<int64_t>>("tessera.test.counter"), &counter);
    // The rank's threads race to create another slot: all of them see one object.
    std::vector<std::thread> threads;
    std::vector<std::atomic<int64_t>*> seen(4, nullptr);
    for (size_t t = 0; t < seen.size(); ++t)
      threads.push_back(rank_thread([&seen, t] { seen[t] = &rank_local<std::atomic<int64_t>>("tessera.test.raced"); }));
    for (auto& thread : threads) thread.join();
    for (auto* p : seen) EXPECT_EQ(p, &rank_local<std::atomic<int64_t>>("tessera.test.raced"));
    // Every rank kept its own value.
    std::vector<int64_t> all(static_cast<size_t>(world_size()));
    const int64_t mine = counter.load();
    world().all_gather(&mine, all.data(), 1, DType::i64);
    for (int r = 0; r < world_size(); ++r) EXPECT_EQ(all[static_cast<size_t>(r)], r + 1);
  });
  std::thread([] { EXPECT_TRUE(value_error([] { (void)rank_local<int>("x"); }, {"[rank_state]", "outside a rank"})); }).join();
}

// One program, two backends (run's documentation): a variable the rank body captures by
// reference is one variable for every thread rank, and each process's own under MPI; the safe
// pattern, locals and rank_local, is per rank on both.
TEST(Runtime, CapturedStateIsSharedByThreadRanksOnly) {
  std::atomic<int> captured{0};
  for_each_world({4}, [&] {
    captured.fetch_add(1);                                  // the pitfall: shared between thread ranks
    auto& mine = rank_local<int>("tessera.test.per_rank");  // the safe pattern
    mine += 1;
    world().barrier();  // every rank has added by now
    const int seen = captured.load();
    EXPECT_EQ(seen, under_mpi() ? 1 : world_size()) << "a captured variable is per process";
    EXPECT_EQ(mine, 1) << "rank_local is per rank on both backends";
    int64_t total = mine;
    world().all_reduce(&total, 1, DType::i64, ReduceOp::sum);
    EXPECT_EQ(total, world_size());
  });
}

// --- launch errors ---------------------------------------------------------------------------

// A failure every rank throws alike is reported as such, not as one arbitrary rank's; failures
// that differ name the first rank, as before.
TEST(Runtime, FailuresAllRanksShareSayEveryRank) {
  TESSERA_SKIP_UNDER_MPI();
  EXPECT_TRUE(value_error([] { launch(3, [] { throw ValueError("[op] bad input"); }); },
                          {"every rank (3 of 3) failed alike: [op] bad input"}));
  EXPECT_TRUE(
      value_error([] { launch(1, [] { throw ValueError("[op] bad input"); }); }, {"rank 0 failed: [op] bad input"}));
  try {
    launch(3, [] { throw ValueError("[op] rank " + std::to_string(rank()) + " is broken"); });
    ADD_FAILURE() << "launch did not throw";
  } catch (const ValueError& e) {
    const std::string text = e.what();
    EXPECT_EQ(text.rfind("rank ", 0), 0u) << text;
    EXPECT_NE(text.find(" failed: [op] rank "), std::string::npos) << text;
  }
}

TEST(Runtime, NestedLaunchIsRejected) {
  for_each_world(world_sizes(), [] {
    const std::string inside = "called from inside rank " + std::to_string(rank());
    bool ran = false;
    EXPECT_TRUE(value_error([&] { launch(2, [&] { ran = true; }); }, {"[launch]", inside, "nested launches are not supported"}));
    EXPECT_FALSE(ran);
    EXPECT_TRUE(in_rank());  // the rejected call left this rank's context alone
    world().barrier();
  });
}

TEST(Runtime, LaunchNeedsAtLeastOneRank) {
  for (int bad : {0, -1, -100}) {
    bool ran = false;
    EXPECT_TRUE(value_error([&] { launch(bad, [&] { ran = true; }); },
                            {"[launch]", "the number of ranks must be at least 1, got " + std::to_string(bad)}));
    EXPECT_FALSE(ran);
  }
}

// --- run -------------------------------------------------------------------------------------

TEST(Runtime, RunTakesRanksFromTheFlag) {
  TESSERA_SKIP_UNDER_MPI();
  EnvGuard env("TESSERA_RANKS", std::nullopt);
  EnvGuard backend("TESSERA_BACKEND", "threads");
  RunResult r = run_with({"prog", "--ranks", "3"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.sizes, std::vector<int>(3, 3));
  EXPECT_EQ(r.ranks, zero_to(3));
  r = run_with({"prog", "--ranks=5"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.sizes, std::vector<int>(5, 5));
  r = run_with({"prog", "--other", "x", "--ranks", "2", "positional"});  // other arguments are left alone
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.sizes, std::vector<int>(2, 2));
  r = run_with({"prog", "--ranks", "1"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.sizes, std::vector<int>(1, 1));
}

TEST(Runtime, RunTakesRanksFromTheEnvironmentAndDefaultsToFour) {
  TESSERA_SKIP_UNDER_MPI();
  EnvGuard backend("TESSERA_BACKEND", "threads");
  {
    EnvGuard env("TESSERA_RANKS", "2");
    RunResult r = run_with({"prog"});
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.sizes, std::vector<int>(2, 2));
    r = run_with({"prog", "--ranks", "3"});  // the flag wins over the environment
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.sizes, std::vector<int>(3, 3));
  }
  {
    EnvGuard env("TESSERA_RANKS", std::nullopt);
    RunResult r = run_with({"prog"});
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.sizes, std::vector<int>(4, 4));
  }
  {  // TESSERA_BACKEND unset and no MPI launcher: threads
    EnvGuard env("TESSERA_RANKS", "3");
    EnvGuard none("TESSERA_BACKEND", std::nullopt);
    RunResult r = run_with({"prog"});
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.sizes, std::vector<int>(3, 3));
  }
}

// The ranks of run() communicate like those of launch.
TEST(Runtime, RunRanksCommunicate) {
  TESSERA_SKIP_UNDER_MPI();
  EnvGuard backend("TESSERA_BACKEND", "threads");
  std::atomic<int> checked{0};
  const RunResult r = run_with({"prog", "--ranks", "4"}, [&] {
    int64_t x = rank() + 1;
    world().all_reduce(&x, 1, DType::i64, ReduceOp::sum);
    if (x == 10) checked.fetch_add(1);
  });
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(checked.load(), 4);
}

TEST(Runtime, RunReturnsOneAndPrintsWhenARankFails) {
  TESSERA_SKIP_UNDER_MPI();
  EnvGuard backend("TESSERA_BACKEND", "threads");
  TimeoutGuard timeout(60);
  ::testing::internal::CaptureStderr();
  const RunResult r = run_with({"prog", "--ranks", "3"}, [] {
    if (rank() == 1) throw ValueError("[user_op] rank one is broken");
    world().barrier();  // released by the failure, not by the timeout
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(err, "rank 1 failed: [user_op] rank one is broken")) << err;
  EXPECT_TRUE(starts_with(err, "tessera: ")) << err;
}

TEST(Runtime, RunRejectsBadRankCountsAndBackends) {
  TESSERA_SKIP_UNDER_MPI();
  const auto expect_rejected = [](std::vector<std::string> args, const std::string& part) {
    bool ran = false;
    ::testing::internal::CaptureStderr();
    const RunResult r = run_with(std::move(args), [&] { ran = true; });
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(r.status, 1);
    EXPECT_TRUE(r.sizes.empty());
    EXPECT_TRUE(contains(err, part)) << err;
  };
  {
    EnvGuard backend("TESSERA_BACKEND", "threads");
    EnvGuard env("TESSERA_RANKS", std::nullopt);
    expect_rejected({"prog", "--ranks", "0"}, "[run] the number of ranks must be at least 1, got 0");
    expect_rejected({"prog", "--ranks=-2"}, "[run] the number of ranks must be at least 1, got -2");
  }
  {
    EnvGuard backend("TESSERA_BACKEND", "threads");
    EnvGuard env("TESSERA_RANKS", "0");
    expect_rejected({"prog"}, "TESSERA_RANKS");
  }
  {
    EnvGuard backend("TESSERA_BACKEND", "bogus");
    expect_rejected({"prog", "--ranks", "2"}, "[run] TESSERA_BACKEND='bogus' is not a backend; expected threads or mpi");
  }
}

// --- one default generator per rank --------------------------------------------------------------

// Each rank thread starts from (seed 0, offset 0) whatever the caller's generator did; seeding
// and drawing on one rank leaves the others' generators alone.
TEST(Runtime, EachRankHasItsOwnDefaultGenerator) {
  TESSERA_SKIP_UNDER_MPI();
  manual_seed(777);  // the caller's generator: not inherited by the ranks
  (void)tessera::rand({3});
  const int n = 4;
  std::vector<std::vector<float>> first_draw(n);
  launch(n, [&] {
    const int me = rank();
    EXPECT_EQ(default_generator().seed(), kDefaultSeed);
    EXPECT_EQ(default_generator().offset(), 0u);
    // Ranks 0 and 1 keep the default seed; the others seed themselves.
    if (me >= 2) manual_seed(100 + static_cast<uint64_t>(me));
    world().barrier();
    for (int k = 0; k <= me; ++k) {
      const Tensor t = tessera::rand({8});
      if (k == 0) first_draw[static_cast<size_t>(me)] = t.to_vector<float>();
      world().barrier();  // the other ranks draw in between
    }
    // barrier count must match across ranks: pad the ranks that drew less
    for (int k = me + 1; k < n; ++k) world().barrier();
    EXPECT_EQ(default_generator().seed(), me >= 2 ? 100 + static_cast<uint64_t>(me) : kDefaultSeed);
    EXPECT_EQ(default_generator().offset(), static_cast<uint64_t>(me + 1));
  });
  EXPECT_EQ(default_generator().seed(), 777u);  // the caller's is untouched too
  EXPECT_EQ(default_generator().offset(), 1u);
  // Same (seed, offset) gives the same values; different seeds differ.
  EXPECT_EQ(first_draw[0], first_draw[1]);
  EXPECT_NE(first_draw[0], first_draw[2]);
  EXPECT_NE(first_draw[2], first_draw[3]);
  manual_seed(kDefaultSeed);
}

// The same independence on either backend, relative to where each rank's generator stands.
TEST(Runtime, SeedingOneRankLeavesOthersAlone) {
  for_each_world(world_sizes(), [] {
    const int me = rank();
    const uint64_t seed_before = default_generator().seed(), offset_before = default_generator().offset();
    world().barrier();
    if (me == 0) {
      manual_seed(4242);
      (void)tessera::rand({2});
    }
    world().barrier();
    if (me == 0) {
      EXPECT_EQ(default_generator().seed(), 4242u);
      EXPECT_EQ(default_generator().offset(), 1u);
      manual_seed(seed_before);
      default_generator().set_offset(offset_before);
    } else {
      EXPECT_EQ(default_generator().seed(), seed_before);
      EXPECT_EQ(default_generator().offset(), offset_before);
    }
  });
}

}  // namespace

// --- host topology ------------------------------------------------------------------------------

namespace {

TEST(HostTopology, SimulatedHostsAreConsecutiveNearEqualBlocks) {
  const HostTopology four = HostTopology::simulated(4, 2);
  EXPECT_EQ(four.num_hosts(), 2);
  EXPECT_TRUE(four.is_simulated());
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(four.host_of(r), r / 2);
    EXPECT_EQ(four.rank_in_host(r), r % 2);
  }
  EXPECT_EQ(four.ranks_on(1), (std::vector<int>{2, 3}));
  EXPECT_EQ(four.to_string(), "2 hosts: host0 [0, 1], host1 [2, 3] (simulated)");
  const HostTopology uneven = HostTopology::simulated(5, 2);  // 3 + 2 ranks
  EXPECT_EQ(uneven.ranks_on(0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(uneven.ranks_on(1), (std::vector<int>{3, 4}));
  EXPECT_EQ(uneven.rank_in_host(4), 1);
  EXPECT_EQ(HostTopology::simulated(3, 3).host_of(2), 2);
}

TEST(HostTopology, BadHostCountsAndRanksAreValueErrors) {
  EXPECT_TRUE(value_error([] { HostTopology::simulated(4, 0); }, {"[HostTopology]", "TESSERA_HOSTS=0", "between 1 and", "4"}));
  EXPECT_TRUE(value_error([] { HostTopology::simulated(4, 5); }, {"[HostTopology]", "TESSERA_HOSTS=5"}));
  {
    EnvGuard env("TESSERA_HOSTS", "two");
    EXPECT_TRUE(value_error([] { HostTopology::from_environment(4, HostTopology::simulated(4, 1)); },
                            {"[HostTopology]", "TESSERA_HOSTS='two'"}));
  }
  EXPECT_TRUE(value_error([] { HostTopology({1, 0}, {"a", "b"}, false); }, {"[HostTopology]", "rank 0 is on host 1"}));
  EXPECT_TRUE(value_error([] { HostTopology({0, 0}, {"a", "b"}, false); }, {"[HostTopology]", "2 host names for 1 hosts"}));
  const HostTopology t = HostTopology::simulated(2, 1);
  EXPECT_TRUE(value_error([&] { t.host_of(2); }, {"[host_of]", "rank 2 out of range", "2 ranks"}));
  EXPECT_TRUE(value_error([&] { t.ranks_on(1); }, {"[ranks_on]", "host 1 out of range"}));
  if (!in_rank()) {  // under mpirun the tests run inside the rank
    EXPECT_TRUE(value_error([] { num_hosts(); }, {"[num_hosts]", "outside a rank"}));
  }
}

// On threads: one host (this machine) unless TESSERA_HOSTS simulates several; every rank sees
// the same topology. A bad TESSERA_HOSTS fails launch before any rank starts.
TEST(HostTopology, ThreadsSimulateHostsFromTheEnvironment) {
  TESSERA_SKIP_UNDER_MPI();
  {
    EnvGuard env("TESSERA_HOSTS", std::nullopt);
    launch(3, [] {
      EXPECT_EQ(num_hosts(), 1);
      EXPECT_FALSE(host_topology().is_simulated());
      EXPECT_EQ(rank_in_host(), rank());
    });
  }
  {
    EnvGuard env("TESSERA_HOSTS", "2");
    std::mutex mutex;
    std::vector<int> hosts(4, -1), local(4, -1);
    launch(4, [&] {
      std::lock_guard lock(mutex);
      hosts[static_cast<size_t>(rank())] = host_of(rank());
      local[static_cast<size_t>(rank())] = rank_in_host();
      EXPECT_EQ(num_hosts(), 2);
      EXPECT_TRUE(host_topology().is_simulated());
    });
    EXPECT_EQ(hosts, (std::vector<int>{0, 0, 1, 1}));
    EXPECT_EQ(local, (std::vector<int>{0, 1, 0, 1}));
  }
  {
    EnvGuard env("TESSERA_HOSTS", "5");
    EXPECT_TRUE(value_error([] { launch(4, [] {}); }, {"[HostTopology]", "TESSERA_HOSTS=5"}));
  }
}

// Under mpirun: the machines (all ranks of a plain mpirun here share one; the multi-host test
// sets TESSERA_EXPECT_HOSTS to its number of network namespaces). Ranks agree on the topology,
// and a host's ranks are the ones MPI puts in one shared-memory group.
TEST(HostTopologyMpi, FindsTheMachinesOfTheJob) {
  if (!under_mpi()) GTEST_SKIP() << "MPI backend only (mpirun)";
  const HostTopology& t = host_topology();
  EXPECT_EQ(t.world_size(), world_size());
  const auto mine = t.ranks_on(host_of(rank()));
  EXPECT_NE(std::find(mine.begin(), mine.end(), rank()), mine.end());
  EXPECT_EQ(mine[static_cast<size_t>(rank_in_host())], rank());
  if (const char* expected = std::getenv("TESSERA_EXPECT_HOSTS")) {
    EXPECT_EQ(num_hosts(), std::atoi(expected)) << t.to_string();
  } else if (!std::getenv("TESSERA_HOSTS")) {
    EXPECT_EQ(num_hosts(), 1) << t.to_string();
  }
  // Every rank holds the same topology.
  int64_t signature = 0;
  for (int r = 0; r < world_size(); ++r) signature = signature * 31 + host_of(r) + 1;
  int64_t top = signature;
  world().all_reduce(&top, 1, DType::i64, ReduceOp::max);
  EXPECT_EQ(top, signature);
  world().barrier();
}

}  // namespace
