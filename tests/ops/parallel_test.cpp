// Intra-op parallelism (ops/detail/parallel.hpp): with a rank given two threads, parallel_for
// covers every iteration once, rethrows a chunk's error after all chunks ran, runs nested and
// concurrent calls inline, and the kernels that split their work give the one-thread results bit
// for bit.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include <tessera/ops/detail/parallel.hpp>
#include <tessera/ops/fused_backward.hpp>
#include <tessera/ops/ops.hpp>

#include "test_util.hpp"

using namespace tessera;
using tessera::detail::parallel_for;

namespace {

// Runs the test body with `threads` intra-op threads, then restores the count.
class WithThreads {
 public:
  explicit WithThreads(int threads) : before_(blas_threads()) { set_blas_threads(threads); }
  ~WithThreads() { set_blas_threads(before_); }

 private:
  int before_;
};

std::vector<int> visits(int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> count(static_cast<size_t>(n));
  parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    EXPECT_LE(0, begin);
    EXPECT_LE(begin, end);
    EXPECT_LE(end, n);
    for (int64_t i = begin; i < end; ++i) count[static_cast<size_t>(i)].fetch_add(1);
  });
  std::vector<int> out;
  for (const auto& c : count) out.push_back(c.load());
  return out;
}

}  // namespace

TEST(ParallelFor, CoversEveryIterationOnce) {
  for (int threads : {1, 2, 3}) {
    const WithThreads scope(threads);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{64}, int64_t{1001}})
      for (int64_t grain : {int64_t{1}, int64_t{4}, int64_t{500}})
        EXPECT_EQ(visits(n, grain), std::vector<int>(static_cast<size_t>(n), 1))
            << threads << " threads, n " << n << ", grain " << grain;
  }
}

TEST(ParallelFor, RethrowsAChunksErrorAfterAllChunksRan) {
  const WithThreads scope(2);
  std::atomic<int64_t> ran{0};
  try {
    parallel_for(100, 10, [&](int64_t begin, int64_t end) {
      ran.fetch_add(end - begin);
      if (begin == 0) throw std::runtime_error("chunk at 0 failed");
    });
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "chunk at 0 failed");
  }
  EXPECT_EQ(ran.load(), 100);
  EXPECT_EQ(visits(40, 1), std::vector<int>(40, 1));  // the pool still works
}

TEST(ParallelFor, NestedAndConcurrentCallsAreComplete) {
  const WithThreads scope(2);
  std::vector<std::atomic<int>> count(400);
  parallel_for(20, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      parallel_for(20, 1, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) count[static_cast<size_t>(i * 20 + j)].fetch_add(1);
      });
  });
  for (const auto& c : count) EXPECT_EQ(c.load(), 1);
  // Two threads at once (as two ranks): one gets the pool, the other runs inline.
  std::vector<int> first, second;
  std::thread other([&] { first = visits(5000, 1); });
  second = visits(5000, 1);
  other.join();
  EXPECT_EQ(first, std::vector<int>(5000, 1));
  EXPECT_EQ(second, std::vector<int>(5000, 1));
}

// The kernels that split their work over the threads give the one-thread results exactly.
TEST(ParallelFor, KernelsEqualTheirOneThreadResults) {
  manual_seed(5);
  const Tensor q = randn({4, 8, 64, 16}), k = randn({4, 8, 64, 16}), v = randn({4, 8, 64, 16});
  const Tensor x = randn({300, 128}), g = randn({300, 128}), w = randn({128});
  const Tensor logits = randn({300, 37});
  std::vector<int64_t> classes;
  for (int64_t i = 0; i < 300; ++i) classes.push_back(i % 7 == 3 ? -100 : (i * 11) % 37);
  const Tensor target = from_vector(classes);
  const Tensor per_target = randn({300});
  const auto run = [&] {
    Tensor qq = q.clone().requires_grad_(), kk = k.clone().requires_grad_(), vv = v.clone().requires_grad_();
    const Tensor out = scaled_dot_product_attention(qq, kk, vv, std::nullopt, 0.0, true);
    sum(mul(out, randn(out.shape()))).backward();
    const auto [dx, gx] = norm_backward(g, x, w, 1, 1e-6, false);
    return std::vector<Tensor>{out.detach(), qq.grad(), kk.grad(), vv.grad(), gelu_backward(g, x, gelu(x)),
                               gelu_backward(g, x), dx, gx, cross_entropy_backward(per_target, logits, target, -100)};
  };
  manual_seed(9);
  const std::vector<Tensor> one = run();
  const WithThreads scope(2);
  manual_seed(9);
  const std::vector<Tensor> two = run();
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(allclose(one[i], two[i], 0, 0)) << i;
}
