// CommDebugMode per module: the op trace, the modules' parameters, and PyTorch's tracing table
// and JSON dump over them. The per-call counts are kept by on_call (comm_debug_mode.cpp).
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include <tessera/core/error.hpp>
#include <tessera/debug/comm_debug_mode.hpp>
#include <tessera/nn/module.hpp>

namespace tessera {

namespace {

// What a noise level shows (PyTorch's _set_noise_parameters).
struct Noise {
  bool dtensor_ops = false;  // DTensor ops but the trivial ones
  bool module_data = false;  // each module's type and parameters
  bool trivial_ops = false;  // every op
};

Noise noise(int level, const char* call) {
  TESSERA_CHECK(
      level >= 0 && level <= 3, ValueError, call, "noise_level ", level,
      " is outside 0-3 (0: calls per module; 1 and 2: also the modules' parameters and DTensor ops; 3: every op)");
  return {level > 0, level > 0, level > 2};
}

// PyTorch's trivial ops (view, transpose, t), by Tessera's names.
bool trivial(const std::string& op) { return op == "reshape" || op == "permute"; }

// The ops module `path` ran in one pass that a noise level shows.
using TracedOps = std::map<std::string, std::vector<CommDebugMode::TracedOp>>;
std::vector<const CommDebugMode::TracedOp*> shown_ops(const TracedOps& operations, const std::string& path,
                                                      const Noise& shown, bool backward) {
  std::vector<const CommDebugMode::TracedOp*> out;
  const auto ops = operations.find(path);
  if (!shown.dtensor_ops || ops == operations.end()) return out;
  for (const CommDebugMode::TracedOp& op : ops->second)
    if (op.backward == backward && (shown.trivial_ops || !trivial(op.name))) out.push_back(&op);
  return out;
}

std::string shapes_text(const std::vector<Shape>& shapes) {
  std::string text = "[";
  for (size_t i = 0; i < shapes.size(); ++i) text.append(i ? ", " : "").append(shapes[i].to_string());
  return text + "]";
}

std::string placements_text(const std::vector<Placements>& placements) {
  std::string text = "[";
  for (size_t i = 0; i < placements.size(); ++i) text.append(i ? ", " : "").append(tessera::to_string(placements[i]));
  return text + "]";
}

void write_file(const std::string& file_name, const std::string& text, const char* call) {
  std::ofstream out(file_name, std::ios::binary | std::ios::trunc);
  TESSERA_CHECK(out.good(), Error, call, "cannot open '", file_name, "' for writing");
  out << text;
  out.close();
  TESSERA_CHECK(!out.fail(), Error, call, "cannot write '", file_name, "'");
}

}  // namespace

void CommDebugMode::on_op(std::string_view op, std::span<const DTensor* const> inputs) {
  const auto& position = detail::module_position();
  const std::string& module = position && !position->modules.empty() ? position->modules.back() : module_order_.front();
  TracedOp traced{std::string(op), {}, {}, "", position && position->backward};
  for (const DTensor* input : inputs) {
    traced.input_shapes.push_back(input->shape());
    traced.input_placements.push_back(input->placements());
    traced.device_mesh = input->device_mesh().to_string();
  }
  operations_[module].push_back(std::move(traced));
}

void CommDebugMode::on_forward(const std::string& path, const nn::Module& module) {
  if (modules_.count(path)) return;                  // as PyTorch: the first forward in the scope describes it
  const auto& position = detail::module_position();  // ends with path (ForwardScope set it)
  const size_t depth = position ? position->modules.size() : 1;
  const std::string parent = depth >= 2 ? position->modules[depth - 2] : "Global";
  ModuleInfo info{module.type_name(), static_cast<int64_t>(depth), {}, {}};
  for (const std::string& name : module.parameter_names()) info.parameters.emplace_back(name, module.parameter(name));
  modules_[path] = std::move(info);
  module_order_.push_back(path);
  if (auto it = modules_.find(parent); it != modules_.end()) it->second.children.push_back(path);
}

std::map<std::string, std::map<std::string, DTensor>> CommDebugMode::get_parameter_info() const {
  std::map<std::string, std::map<std::string, DTensor>> out;
  for (const auto& [path, info] : modules_)
    for (const auto& [name, value] : info.parameters) out[path].emplace(name, value);
  return out;
}

std::map<std::string, Placements> CommDebugMode::get_sharding_info() const {
  std::map<std::string, Placements> out;
  for (const auto& [path, info] : modules_)
    for (const auto& [name, value] : info.parameters) out.emplace(path + "." + name, value.placements());
  return out;
}

std::string CommDebugMode::generate_comm_debug_tracing_table(int noise_level) const {
  const Noise shown = noise(noise_level, "CommDebugMode::generate_comm_debug_tracing_table");
  std::ostringstream table;
  for (const std::string& path : module_order_) {
    const ModuleInfo& info = modules_.at(path);
    const std::string indent(static_cast<size_t>(4 * info.depth), ' ');
    table << indent << path << '\n';
    if (shown.module_data && path != "Global") {
      table << indent << "*module type: " << info.type << '\n';
      if (!info.parameters.empty()) {
        table << indent << "*Parameter List\n";
        for (const auto& [name, value] : info.parameters)
          table << indent << " *" << name << ": " << tessera::to_string(value.placements()) << '\n';
      }
    }
    const std::string pass_indent = indent + "  ", call_indent = indent + "    ", op_indent = indent + "      ";
    const auto counts = module_counts_.find(path);
    for (const bool backward : {false, true}) {
      const std::map<CollectiveKind, int64_t> none;
      const auto& calls = counts == module_counts_.end() ? none
                          : backward                     ? counts->second.backward
                                                         : counts->second.forward;
      const std::vector<const TracedOp*> listed = shown_ops(operations_, path, shown, backward);
      if (calls.empty() && listed.empty()) continue;
      table << pass_indent << (backward ? "BACKWARD PASS" : "FORWARD PASS") << '\n';
      for (const auto& [kind, n] : calls) table << call_indent << '*' << name(kind) << ": " << n << '\n';
      for (const TracedOp* op : listed) {
        table << call_indent << "**" << op->name << '\n';
        if (op->input_shapes.empty()) continue;
        table << op_indent << "shape: " << shapes_text(op->input_shapes) << '\n';
        table << op_indent << "sharding: " << placements_text(op->input_placements) << '\n';
        table << op_indent << "device mesh: " << op->device_mesh << '\n';
      }
    }
  }
  return table.str();
}

void CommDebugMode::generate_json_dump(const std::string& file_name, int noise_level) const {
  const Noise shown = noise(noise_level, "CommDebugMode::generate_json_dump");
  using nlohmann::json;
  const auto node = [&](const auto& self, const std::string& path) -> json {
    const ModuleInfo& info = modules_.at(path);
    json out = {{"fqn", path},
                {"module_type", ""},
                {"parameters", json::array()},
                {"children", json::array()},
                {"collectives_forward", json::array()},
                {"collectives_backward", json::array()},
                {"operations_forward", json::array()},
                {"operations_backward", json::array()}};
    if (shown.module_data && path != "Global") {
      out["module_type"] = info.type;
      for (const auto& [name, value] : info.parameters)
        out["parameters"].push_back(json::array({name, tessera::to_string(value.placements())}));
    }
    if (const auto counts = module_counts_.find(path); counts != module_counts_.end()) {
      for (const auto& [kind, n] : counts->second.forward)
        out["collectives_forward"].push_back(json::array({std::string(name(kind)), n}));
      for (const auto& [kind, n] : counts->second.backward)
        out["collectives_backward"].push_back(json::array({std::string(name(kind)), n}));
    }
    for (const bool backward : {false, true})
      for (const TracedOp* op : shown_ops(operations_, path, shown, backward)) {
        json shapes = json::array(), shardings = json::array();
        for (const Shape& s : op->input_shapes) shapes.push_back(s.to_string());
        for (const Placements& p : op->input_placements) shardings.push_back(tessera::to_string(p));
        out[backward ? "operations_backward" : "operations_forward"].push_back({{"name", op->name},
                                                                                {"input_shape", shapes},
                                                                                {"input_sharding", shardings},
                                                                                {"device_mesh", op->device_mesh}});
      }
    for (const std::string& child : info.children) out["children"].push_back(self(self, child));
    return out;
  };
  write_file(file_name, node(node, "Global").dump(4) + "\n", "CommDebugMode::generate_json_dump");
}

void CommDebugMode::log_comm_debug_tracing_table_to_file(const std::string& file_name, int noise_level) const {
  // The level is checked before the file is touched.
  const std::string table = generate_comm_debug_tracing_table(noise_level);
  write_file(file_name, table, "CommDebugMode::log_comm_debug_tracing_table_to_file");
}

}  // namespace tessera
