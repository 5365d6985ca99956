// memory_stats: a thread's live and peak tensor bytes. A storage counts against the thread that
// allocated it wherever it is freed, and each rank of a world has its own account.
#include <gtest/gtest.h>

#include <thread>

#include <tessera/core/storage.hpp>
#include <tessera/core/tensor.hpp>
#include <tessera/runtime/runtime.hpp>

using namespace tessera;

TEST(MemoryStats, CountsLiveAndPeakBytesOfThisThread) {
  const MemoryStats before = memory_stats();
  constexpr int64_t kBytes = int64_t{1} << 20;
  {
    const Tensor a = empty({kBytes / 4}, DType::f32);
    const MemoryStats during = memory_stats();
    EXPECT_GE(during.allocated_bytes - before.allocated_bytes, kBytes);
    EXPECT_GE(during.peak_allocated_bytes, during.allocated_bytes);
  }
  const MemoryStats after = memory_stats();
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_GE(after.peak_allocated_bytes - before.allocated_bytes, kBytes);
  reset_peak_memory_stats();
  EXPECT_EQ(memory_stats().peak_allocated_bytes, memory_stats().allocated_bytes);

  // Freed on another thread: still this thread's bytes that go.
  Tensor moved = empty({kBytes / 4}, DType::f32);
  const int64_t with = memory_stats().allocated_bytes;
  std::thread([t = std::move(moved)]() mutable { t = Tensor(); }).join();
  EXPECT_EQ(memory_stats().allocated_bytes, with - kBytes);
}

TEST(MemoryStats, EachRankHasItsOwnAccount) {
  launch(3, [] {
    reset_peak_memory_stats();
    const int64_t base = memory_stats().allocated_bytes;
    const Tensor mine = empty({(rank() + 1) * (int64_t{1} << 18)}, DType::f32);  // rank r: (r + 1) MiB
    world().barrier();  // every rank holds its tensor now
    EXPECT_EQ(memory_stats().allocated_bytes - base, (rank() + 1) * (int64_t{1} << 20));
  });
}
