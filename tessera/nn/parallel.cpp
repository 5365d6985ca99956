// Styles as layouts: each sets parameter placements on one mesh dim and the input/output moves.
#include <tessera/nn/parallel.hpp>

#include <sstream>

#include <tessera/nn/detail/fsdp_unit.hpp>
#include <tessera/nn/layers.hpp>

namespace tessera::nn {

namespace {

int64_t axis_index(const DeviceMesh& mesh, const std::string& axis) {
  const auto& names = mesh.axis_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == axis) return static_cast<int64_t>(i);
  TESSERA_CHECK(false, ValueError, "parallelize_module", "no axis '", axis, "' in ", mesh.to_string());
  return -1;
}

// The parameter's layout with `p` on mesh dim m (other dims and shard orders kept).
Layout placed(const DTensor& value, int64_t m, Placement p) {
  Placements placements = value.placements();
  placements[static_cast<size_t>(m)] = p;
  return value.layout().with_placements(std::move(placements));
}

void set_param(Module& module, const std::string& name, int64_t m, Placement p) {
  module.set_parameter_layout(name, placed(module.parameter(name), m, p));
}

void apply(Module& module, const std::string& path, int64_t m, const ParallelStyle& style) {
  if (dynamic_cast<Linear*>(&module)) {
    const bool has_bias = module.parameter_names().size() > 1;
    if (auto* col = std::get_if<ColwiseParallel>(&style)) {
      set_param(module, "weight", m, Shard{0});
      if (has_bias) set_param(module, "bias", m, Shard{0});
      module.set_input_placement(m, col->input);
      module.set_output_placement(m, col->output);
      return;
    }
    if (auto* row = std::get_if<RowwiseParallel>(&style)) {
      set_param(module, "weight", m, Shard{1});
      module.set_input_placement(m, row->input);
      module.set_output_placement(m, row->output);
      return;
    }
  }
  if (dynamic_cast<Embedding*>(&module)) {
    if (auto* col = std::get_if<ColwiseParallel>(&style)) {
      set_param(module, "weight", m, Shard{1});
      module.set_output_placement(m, col->output);
      return;
    }
    if (auto* row = std::get_if<RowwiseParallel>(&style)) {
      set_param(module, "weight", m, Shard{0});
      module.set_output_placement(m, row->output);
      return;
    }
  }
  if (auto* seq = std::get_if<SequenceParallel>(&style)) {
    if (dynamic_cast<LayerNorm*>(&module) || dynamic_cast<RMSNorm*>(&module)) {
      module.set_input_placement(m, Shard{seq->sequence_dim});
      module.set_output_placement(m, Shard{seq->sequence_dim});
      return;
    }
  }
  const char* name = std::holds_alternative<ColwiseParallel>(style)   ? "ColwiseParallel"
                     : std::holds_alternative<RowwiseParallel>(style) ? "RowwiseParallel"
                                                                      : "SequenceParallel";
  TESSERA_CHECK(false, ValueError, "parallelize_module", name, " does not apply to the module at '", path,
                "' (Colwise/Rowwise: Linear or Embedding; SequenceParallel: LayerNorm or RMSNorm)");
}

}  // namespace

bool path_matches(const std::string& pattern, const std::string& path) {
  std::istringstream a(pattern), b(path);
  std::string x, y;
  while (true) {
    const bool more_a = static_cast<bool>(std::getline(a, x, '.')), more_b = static_cast<bool>(std::getline(b, y, '.'));
    if (!more_a || !more_b) return more_a == more_b;
    if (x != "*" && x != y) return false;
  }
}

void distribute_module(Module& module, const DeviceMesh& mesh, PartitionFn partition_fn, Module::InputHook input_fn,
                       Module::InputHook output_fn) {
  TESSERA_CHECK(mesh.spec() == module.mesh().spec(), ValueError, "distribute_module", "the module lives on ",
                module.mesh().to_string(), " but the mesh given is ", mesh.to_string(),
                "; a module's parameters are on the mesh it was built on");
  if (partition_fn)
    for (auto& [path, submodule] : module.named_modules()) partition_fn(path, *submodule, mesh);
  if (input_fn) module.set_input_hook(std::move(input_fn));
  if (output_fn) module.set_output_hook(std::move(output_fn));
}

void parallelize_module(Module& module, const std::string& axis, const std::map<std::string, ParallelStyle>& plan) {
  const int64_t m = axis_index(module.mesh(), axis);
  const auto modules = module.named_modules();
  for (const auto& [pattern, style] : plan) {
    bool matched = false;
    for (const auto& [path, sub] : modules) {
      if (!path_matches(pattern, path)) continue;
      apply(*sub, path, m, style);
      matched = true;
    }
    TESSERA_CHECK(matched, ValueError, "parallelize_module", "no submodule matches '", pattern, "'");
  }
}

std::map<std::string, ParallelStyle> transformer_tp_plan(bool sequence_parallel) {
  const RowwiseParallel row = sequence_parallel ? RowwiseParallel{Shard{-1}, Shard{1}} : RowwiseParallel{};
  std::map<std::string, ParallelStyle> plan = {
      {"blocks.*.attn.q", ColwiseParallel{}}, {"blocks.*.attn.k", ColwiseParallel{}},
      {"blocks.*.attn.v", ColwiseParallel{}}, {"blocks.*.attn.o", row},
      {"blocks.*.mlp.fc1", ColwiseParallel{}}, {"blocks.*.mlp.fc2", row},
      {"head", ColwiseParallel{}},
      {"tok", RowwiseParallel{Replicate{}, sequence_parallel ? Placement(Shard{1}) : Placement(Replicate{})}}};
  if (sequence_parallel) {
    for (const char* norm : {"blocks.*.norm1", "blocks.*.norm2", "norm"}) plan[norm] = SequenceParallel{};
  }
  return plan;
}

void fully_shard(Module& module, const std::string& axis) {
  const int64_t m = axis_index(module.mesh(), axis);
  auto unit = std::make_shared<detail::FsdpUnit>();
  for (const auto& [path, sub] : module.named_modules()) {
    for (const auto& slot : sub->params_) {
      if (slot->unit) continue;  // an inner fully_shard took it: its unit gathers it
      const std::string& name = slot->name;
      const DTensor& value = slot->value;
      TESSERA_CHECK(is_replicate(value.placements()[static_cast<size_t>(m)]), ValueError, "fully_shard", "parameter ",
                    path.empty() ? name : path + "." + name, " is ", value.layout().to_string(),
                    "; expected Replicate on axis '", axis, "'");
      const Layout compute = value.layout();
      // Shard(0) on the data-parallel dim, split after any other mesh dim sharding dim 0.
      Placements placements = compute.placements();
      placements[static_cast<size_t>(m)] = Shard{0};
      std::vector<int64_t> order = compute.shard_order(0);
      order.push_back(m);
      const Layout storage(compute.global_shape(), compute.dtype(), compute.mesh(), placements, ShardOrder{{0, order}});
      sub->set_parameter_layout(name, storage);
      sub->set_compute_layout(name, compute);
      slot->unit = unit;
      slot->unit_index = unit->add(&slot->value, compute);
    }
  }
}

void reshard(Module& module) {
  for (const auto& [path, sub] : module.named_modules())
    for (const auto& slot : sub->params_)
      if (slot->unit) slot->unit->reshard();
}

}  // namespace tessera::nn
