#pragma once
// Optimizers over DTensor parameters: every update is elementwise on the parameter's own layout,
// so each rank updates its shard locally (no communication; AdamW in one pass per parameter).
// Gradient clipping by the global norm reduces one scalar per mesh. A learning-rate schedule with
// linear warmup and cosine decay.
#include <map>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/dtensor/dtensor.hpp>

namespace tessera TESSERA_API {
namespace nn {

/// What every optimizer has: the parameters it updates and a learning rate.
class Optimizer {
 public:
  Optimizer(std::vector<DTensor*> params, double lr) : params_(std::move(params)), lr_(lr) {}
  virtual ~Optimizer() = default;
  /// One update from the parameters' current gradients (parameters without one are skipped).
  virtual void step() = 0;
  /// Clears every parameter's gradient.
  void zero_grad();
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  const std::vector<DTensor*>& params() const { return params_; }

  /// The optimizer's state, torch.optim's state_dict flattened into one map of DTensors:
  /// "<i>.<name>" for the state of params()[i] (AdamW: exp_avg, exp_avg_sq; SGD with momentum:
  /// momentum_buffer), each in the parameter's layout and sharing storage with the optimizer, and
  /// the optimizer-wide entries ("lr"; AdamW: "step"), 0-d and replicated on the first
  /// parameter's mesh. State a parameter does not have yet is created as zeros, which update
  /// exactly as absent state does. nn::get_state_dict names the entries by parameter path.
  virtual std::map<std::string, DTensor> state_dict();
  /// Takes the state from `state` (the keys state_dict gives; each value resharded to its
  /// parameter's layout, so state saved under one parallel plan loads into another). Throws
  /// ValueError naming the key for a missing, unexpected or misshapen entry, before writing anything.
  virtual void load_state_dict(const std::map<std::string, DTensor>& state);

 protected:
  /// Throws ValueError naming `op` (before anything is written) unless `state` holds exactly
  /// "<i>.<name>" for every parameter i and name in `per_parameter` (of the parameter's shape)
  /// and every name in `global` (one element each).
  void check_state(const char* op, const std::map<std::string, DTensor>& state,
                   const std::vector<std::string>& per_parameter, const std::vector<std::string>& global) const;
  /// Whether this rank holds the optimizer-wide entries (members of the first parameter's mesh).
  bool member_of_first_mesh() const;
  std::vector<DTensor*> params_;
  double lr_;
};

/// SGD with momentum (PyTorch's form: buf = momentum * buf + grad; p -= lr * buf) and weight decay.
class SGD : public Optimizer {
 public:
  SGD(std::vector<DTensor*> params, double lr, double momentum = 0.0, double weight_decay = 0.0);
  void step() override;
  std::map<std::string, DTensor> state_dict() override;
  void load_state_dict(const std::map<std::string, DTensor>& state) override;

 private:
  std::vector<DTensor> momentum_buffers_;
  double momentum_, weight_decay_;
};

/// AdamW (decoupled weight decay), bias-corrected moments, as torch.optim.AdamW.
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<DTensor*> params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8,
        double weight_decay = 0.01);
  void step() override;
  /// Steps taken (the bias corrections' t).
  int64_t steps() const { return steps_; }
  std::map<std::string, DTensor> state_dict() override;
  void load_state_dict(const std::map<std::string, DTensor>& state) override;

 private:
  std::vector<DTensor> m_, v_;
  double beta1_, beta2_, eps_, weight_decay_;
  int64_t steps_ = 0;
};

/// Scales every gradient by max_norm / total when the total 2-norm over all parameters (all
/// shards) exceeds max_norm; returns the total norm before clipping. Gradients that are Partial
/// sums are reduced first (reduce_gradients_). One all_reduce per mesh for the norm. Every rank
/// calls it.
double clip_grad_norm_(const std::vector<DTensor*>& params, double max_norm);

/// Reduces every gradient that is still a Partial sum (one set by hand, or kept Partial under
/// NoSync) to its value, in buckets (reduce_partials). Backward already reduces the gradients it
/// produces this way; optimizers and clip_grad_norm_ call it for the others. Every rank calls it
/// with the same parameters in the same order.
void reduce_gradients_(const std::vector<DTensor*>& params, int64_t bucket_bytes = int64_t{25} << 20);

/// Linear warmup from 0 over `warmup` steps, then cosine decay to `min_lr` at `total` steps.
double warmup_cosine_lr(int64_t step, int64_t warmup, int64_t total, double max_lr, double min_lr = 0.0);

}  // namespace nn
}  // namespace tessera
