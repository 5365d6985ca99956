// A pipeline stage that throws mid-step (issue 40): every rank's step ends at once with a
// tessera::Error naming the failing stage and rank; no send buffer is freed while a peer may
// still read it (the sanitizer build catches a use after free here); nobody is left waiting (a
// world barrier right after the failure completes); and the pipeline's next step runs and
// equals the unsplit computation.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include <tessera/dtensor/ops.hpp>
#include <tessera/mpmd/pipeline.hpp>
#include <tessera/ops/ops.hpp>

#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;
using namespace tessera::mpmd;

namespace {

// Three stages of `per` ranks each (1-d "dp"), the world's first ranks; the rest in no stage.
std::vector<DeviceMesh> three_stage_meshes(int per) {
  std::vector<DeviceMesh> meshes;
  for (int s = 0; s < 3; ++s) {
    std::vector<int> ranks;
    for (int k = 0; k < per; ++k) ranks.push_back(s * per + k);
    meshes.emplace_back(std::vector<int64_t>{per}, std::vector<std::string>{"dp"}, ranks);
  }
  return meshes;
}

// The pipeline's computation without stages: mean((tanh(tanh(tanh(x W))))^2) over zeros, and
// its gradient in W.
std::pair<double, Tensor> unsplit_loss_and_grad(const Tensor& x, const Tensor& w_value) {
  const Tensor w = w_value.detach().requires_grad_();
  const Tensor y = tanh(tanh(tanh(matmul(x, w))));
  const Tensor loss = mse_loss(y, zeros_like(y));
  loss.backward();
  return {loss.item<double>(), w.grad()};
}

void run_failing_stage(Schedule schedule, const char* schedule_name) {
  SCOPED_TRACE(schedule_name);
  const int per = world_size() >= 6 ? 2 : 1;
  const std::vector<DeviceMesh> meshes = three_stage_meshes(per);
  const Tensor w_full = sin(arange(9).to(DType::f64) * 0.7).reshape({3, 3});
  const DTensor w = distribute_tensor(w_full, meshes[0], {Replicate{}}).requires_grad_();
  // This rank's copy of stage 1 throws on its third forward while armed (the first step only).
  bool armed = true;
  int forwards_of_stage_1 = 0;
  Pipeline pipeline({{meshes[0], [&](const DTensor& x) { return tanh(matmul(x, w)); }},
                     {meshes[1],
                      [&](const DTensor& x) {
                        if (armed && ++forwards_of_stage_1 == 3)
                          throw ValueError("[user stage] third forward fails on purpose");
                        return tanh(x);
                      }},
                     {meshes[2], [](const DTensor& x) { return tanh(x); }}},
                    [](const DTensor& y, const DTensor& t) { return mse_loss(y, t); }, {schedule, 4, 0});
  const Tensor input = ones({8, 3}, DType::f64);
  const DTensor x = distribute_tensor(input, meshes[0], {Shard{0}});
  const DTensor t = distribute_tensor(zeros({8, 3}, DType::f64), meshes[2], {Shard{0}});

  std::string message;
  bool value_error = false;
  try {
    pipeline.step(x, t);
    ADD_FAILURE() << "world rank " << rank() << ": the step did not fail";
  } catch (const ValueError& e) {
    value_error = true;
    message = e.what();
  } catch (const Error& e) {
    message = e.what();
  }
  // A rank of stage 1 that threw keeps its error's kind, naming the stage, the rank and the
  // action; every other rank (stage 1's included, when its peer threw first) learns of it from
  // the pipeline's aborted group, as a CommError carrying the same text.
  if (value_error) {
    EXPECT_EQ(pipeline.my_stage(), 1) << message;
  }
  EXPECT_TRUE(starts_with(message, "[Pipeline::step] ")) << message;
  EXPECT_TRUE(contains(message, "stage 1 failed on world rank ")) << message;
  EXPECT_TRUE(contains(message, "in the forward of microbatch 2")) << message;
  EXPECT_TRUE(contains(message, "third forward fails on purpose")) << message;

  // Nobody waits on the failed step: a collective over the world meets at once (before the fix,
  // the other stages stayed blocked until the communication timeout).
  world().barrier();

  // The pipeline is usable again: the next step (no throw now) equals the unsplit computation.
  // The failed step left no half-reduced gradient behind: W's gradient is the unsplit one.
  armed = false;
  const auto [expected_loss, expected_grad] = unsplit_loss_and_grad(input, w_full);
  const double loss = pipeline.step(x, t);
  EXPECT_NEAR(loss, expected_loss, 1e-12);
  if (pipeline.my_stage() == 0) {
    EXPECT_TRUE(allclose(w.grad().full_tensor(), expected_grad, 1e-10, 1e-12));
  }
}

}  // namespace

TEST(PipelineFailure, AStageThatThrowsReleasesEveryRankAndNamesIt) {
  if (under_mpi() && world_size() < 3)
    GTEST_SKIP() << "needs 3 MPI ranks, one per stage; this run has " << world_size();
  for_each_world({6, 4}, [] {
    run_failing_stage(Schedule::gpipe, "GPipe");
    run_failing_stage(Schedule::one_f_one_b, "1F1B");
  });
}
