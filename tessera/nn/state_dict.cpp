// get_state_dict / set_state_dict: the optimizer's entries, keyed by parameter index
// ("<i>.exp_avg"), renamed by the parameter's path in the module, and back.
#include <tessera/nn/state_dict.hpp>

#include <algorithm>
#include <cctype>

namespace tessera::nn {

namespace {

constexpr const char* kModel = "model.";
constexpr const char* kOptim = "optim.";

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// The path of each parameter the optimizer updates, by index.
std::vector<std::string> optimizer_paths(Module& module, const Optimizer& optimizer, const char* op) {
  const auto named = module.named_parameters();
  std::vector<std::string> paths;
  for (size_t i = 0; i < optimizer.params().size(); ++i) {
    const DTensor* p = optimizer.params()[i];
    const auto it = std::find_if(named.begin(), named.end(), [&](const auto& entry) { return entry.second == p; });
    TESSERA_CHECK(it != named.end(), ValueError, op, "the optimizer's parameter ", i,
                  " is not a parameter of the module: pass the optimizer made from module.parameters()");
    paths.push_back(it->first);
  }
  return paths;
}

// "<i>.<name>" -> "<path>.<name>", and optimizer-wide "<name>" as it is.
std::string optim_key(const std::string& key, const std::vector<std::string>& paths) {
  size_t digits = 0;
  while (digits < key.size() && std::isdigit(static_cast<unsigned char>(key[digits]))) ++digits;
  if (digits == 0 || digits == key.size() || key[digits] != '.') return key;
  return paths.at(std::stoul(key.substr(0, digits))) + key.substr(digits);
}

}  // namespace

std::map<std::string, DTensor> get_state_dict(Module& module) {
  std::map<std::string, DTensor> out;
  for (auto& [path, value] : module.state_dict()) out.emplace(kModel + path, value);
  return out;
}

std::map<std::string, DTensor> get_state_dict(Module& module, Optimizer& optimizer) {
  const std::vector<std::string> paths = optimizer_paths(module, optimizer, "get_state_dict");
  std::map<std::string, DTensor> out = get_state_dict(module);
  for (auto& [key, value] : optimizer.state_dict()) out.emplace(kOptim + optim_key(key, paths), value);
  return out;
}

void set_state_dict(Module& module, const std::map<std::string, DTensor>& state) {
  std::map<std::string, DTensor> parameters;
  for (const auto& [key, value] : state) {
    TESSERA_CHECK(starts_with(key, kModel), ValueError, "set_state_dict", "unexpected entry '", key,
                  "': a module's entries are named model.<path>");
    parameters.emplace(key.substr(std::string(kModel).size()), value);
  }
  module.load_state_dict(parameters);
}

void set_state_dict(Module& module, Optimizer& optimizer, const std::map<std::string, DTensor>& state) {
  const std::vector<std::string> paths = optimizer_paths(module, optimizer, "set_state_dict");
  std::map<std::string, std::string> by_name;  // "<path>.<name>" -> "<i>.<name>", for the optimizer's keys
  for (const auto& [key, value] : optimizer.state_dict()) by_name.emplace(optim_key(key, paths), key);
  std::map<std::string, DTensor> parameters, optim;
  for (const auto& [key, value] : state) {
    if (starts_with(key, kModel)) {
      parameters.emplace(key.substr(std::string(kModel).size()), value);
      continue;
    }
    TESSERA_CHECK(starts_with(key, kOptim), ValueError, "set_state_dict", "unexpected entry '", key,
                  "': entries are named model.<path> and optim.<path>.<state>");
    const std::string name = key.substr(std::string(kOptim).size());
    const auto it = by_name.find(name);
    TESSERA_CHECK(it != by_name.end(), ValueError, "set_state_dict", "unexpected entry '", key,
                  "': the optimizer has no such state");
    optim.emplace(it->second, value);
  }
  // The module's entries are checked before the optimizer writes anything (each checks its own
  // before writing): a bad state leaves both as they were.
  const auto named = module.named_parameters();
  for (const auto& [path, p] : named) {
    const auto it = parameters.find(path);
    TESSERA_CHECK(it != parameters.end(), ValueError, "set_state_dict", "missing entry '", kModel, path, "'");
    TESSERA_CHECK(it->second.shape() == p->shape(), ValueError, "set_state_dict", "entry '", kModel, path,
                  "' has shape ", it->second.shape().to_string(), "; the parameter has ", p->shape().to_string());
  }
  TESSERA_CHECK(parameters.size() == named.size(), ValueError, "set_state_dict",
                "unexpected model entries: the module has ", named.size(), " parameters, the state ", parameters.size());
  for (const auto& [name, index] : by_name)
    TESSERA_CHECK(optim.count(index) != 0, ValueError, "set_state_dict", "missing entry '", kOptim, name, "'");
  optimizer.load_state_dict(optim);
  module.load_state_dict(parameters);
}

}  // namespace tessera::nn
