#include <tessera/mpmd/detail/lm_units.hpp>

#include <algorithm>
#include <cmath>
#include <ctime>

#include <tessera/comm/communicator.hpp>
#include <tessera/core/error.hpp>
#include <tessera/dtensor/ops.hpp>

namespace tessera::mpmd::detail {

int64_t unit_of(const nn::TransformerLM& model, const std::string& path) {
  if (path.rfind("tok.", 0) == 0 || path.rfind("pos.", 0) == 0) return 0;
  if (path.rfind("blocks.", 0) == 0) return 1 + std::stoll(path.substr(7, path.find('.', 7) - 7));
  TESSERA_CHECK(path.rfind("norm.", 0) == 0 || path.rfind("head.", 0) == 0, ValueError, "parallelize",
                "parameter ", path, " belongs to no unit of the transformer LM");
  return model.units() - 1;
}

std::vector<std::string> unit_modules(const nn::TransformerLM& model, int64_t unit) {
  if (unit == 0) return {"tok", "pos"};
  if (unit == model.units() - 1) return {"norm", "head"};
  return {"blocks." + std::to_string(unit - 1)};
}

std::string unit_label(const nn::TransformerLM& model, int64_t unit) {
  if (unit == 0) return "emb";
  if (unit == model.units() - 1) return "head";
  return std::string("b").append(std::to_string(unit - 1));
}

std::pair<DTensor, DTensor> synthetic_batch(const nn::TransformerLM& model, int64_t rows, int64_t seq) {
  const int64_t vocab = model.config().vocab;
  std::vector<int64_t> ids(static_cast<size_t>(rows * seq)), next(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>(i * 7 + 3) % vocab;
    next[i] = static_cast<int64_t>(i * 7 + 10) % vocab;
  }
  const DeviceMesh& mesh = model.mesh();
  const Placements whole(static_cast<size_t>(mesh.ndim()), Replicate{});
  return {DTensor::from_local(from_vector(ids, Shape{rows, seq}), mesh, whole),
          DTensor::from_local(from_vector(next, Shape{rows, seq}), mesh, whole)};
}

std::vector<double> measure_unit_us(nn::TransformerLM& model, int64_t rows, int64_t seq, const DeviceMesh& agree) {
  const auto& c = model.config();
  const DeviceMesh& mesh = model.mesh();
  const Placements whole(static_cast<size_t>(mesh.ndim()), Replicate{});
  const auto [tokens, targets] = synthetic_batch(model, rows, seq);
  std::vector<float> values(static_cast<size_t>(rows * seq * c.dim));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  const Tensor hidden_values = from_vector(values, Shape{rows, seq, c.dim});
  const int64_t units = model.units();
  const auto run = [&](int64_t u) {
    if (u == 0) return sum(model.forward_units(0, 1, tokens)).backward();
    // A later stage's input: a leaf that wants its gradient, as the pipeline's received activation.
    DTensor hidden = DTensor::from_local(hidden_values, mesh, whole);
    hidden.requires_grad_();
    if (u == units - 1) return model.next_token_loss(model.forward_units(u, u + 1, hidden), targets).backward();
    sum(model.forward_units(u, u + 1, hidden)).backward();
  };
  // This thread's CPU time, not wall time: ranks sharing cores would otherwise measure each
  // other's turns, by chance (a unit's run can be shorter than a scheduler's time slice).
  // parallelize accounts for shared cores separately. A warm-up pass, then the median of three.
  const auto cpu_us = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) * 1e-3;
  };
  constexpr int kPasses = 3;
  std::vector<std::vector<double>> times(static_cast<size_t>(units));
  for (int pass = 0; pass <= kPasses; ++pass)
    for (int64_t u = 0; u < units; ++u) {
      const double start = cpu_us();
      run(u);
      if (pass > 0) times[static_cast<size_t>(u)].push_back(cpu_us() - start);
    }
  std::vector<double> result;
  for (std::vector<double>& t : times) {
    std::sort(t.begin(), t.end());
    result.push_back(t[kPasses / 2]);
  }
  model.zero_grad();
  if (const auto comm = agree.mesh_comm_ptr())
    comm->all_reduce(result.data(), units, DType::f64, ReduceOp::max);
  return result;
}

}  // namespace tessera::mpmd::detail
