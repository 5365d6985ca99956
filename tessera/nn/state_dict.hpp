#pragma once
// A training run's state as one map of DTensors named by parameter path, for checkpoints (as
// torch.distributed.checkpoint.state_dict's get_state_dict / set_state_dict): the module's
// parameters and its optimizer's state, each in its own layout, so that every rank saves and
// loads only its shards and a state saved under one parallel plan loads into another.
//
//   checkpoint::save(dir, nn::get_state_dict(model, optimizer));
//   auto state = nn::get_state_dict(model, optimizer);   // on resume: the layouts to load into
//   checkpoint::load(dir, state);                         // in place, each rank its shards
//   nn::set_state_dict(model, optimizer, state);          // the scalars, and FSDP's caches
#include <map>
#include <string>

#include <tessera/core/export.hpp>
#include <tessera/nn/module.hpp>
#include <tessera/nn/optim.hpp>

namespace tessera TESSERA_API {
namespace nn {

/// "model.<path>" for every parameter of `module` (detached, sharing its storage) and
/// "optim.<path>.<name>" for the optimizer's state of that parameter (AdamW: exp_avg,
/// exp_avg_sq; sharing the optimizer's storage) plus "optim.<name>" for the optimizer-wide
/// entries ("optim.lr", "optim.step"). Throws ValueError if the optimizer updates a tensor that is
/// not a parameter of `module`.
std::map<std::string, DTensor> get_state_dict(Module& module, Optimizer& optimizer);
/// The module's parameters only, as "model.<path>".
std::map<std::string, DTensor> get_state_dict(Module& module);

/// Loads what get_state_dict gives (from any layouts and meshes: each value is resharded to its
/// parameter's layout; values loaded in place are not copied again) into `module` and
/// `optimizer`. Every entry is checked before anything is written: ValueError names a missing,
/// unexpected or misshapen entry. Every rank of the module's mesh calls it.
void set_state_dict(Module& module, Optimizer& optimizer, const std::map<std::string, DTensor>& state);
void set_state_dict(Module& module, const std::map<std::string, DTensor>& state);

}  // namespace nn
}  // namespace tessera
