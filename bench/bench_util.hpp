#pragma once
// Helpers the benchmark binaries share: medians and where their JSON goes.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <tessera/comm/communicator.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::bench_util {

/// The middle value (the upper one of an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// "mpi" or "threads": the backend the bench runs on, for titles and file names.
inline const char* backend_name() { return world().backend() == "mpi" ? "mpi" : "threads"; }

/// Writes `doc` to `path`, or when that is empty next to the binary as <stem>_<backend>.json,
/// and prints where.
inline void write_json(const nlohmann::json& doc, const std::string& path, const char* argv0, const std::string& stem) {
  const std::string target =
      !path.empty() ? path
                    : (std::filesystem::path(argv0).parent_path() / (stem + "_" + backend_name() + ".json")).string();
  std::ofstream(target) << doc.dump(2);
  std::printf("json: %s\n", target.c_str());
}

}  // namespace tessera::bench_util
