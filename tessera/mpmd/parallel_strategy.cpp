// ParallelStrategy's name: the one place a plan's name is built.
#include <tessera/mpmd/parallelize.hpp>

namespace tessera::mpmd {

namespace {

std::string joined(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const std::string& p : parts) out.append(out.empty() ? "" : separator).append(p);
  return out;
}

}  // namespace

std::string ParallelStrategy::to_string() const {
  std::vector<std::string> parts;
  if (pipeline) parts.push_back("pp(" + pipeline->axis + ")[" + joined(pipeline->units, "|") + "]");
  if (tensor) parts.push_back((tensor->sequence_parallel ? "tp+sp(" : "tp(") + tensor->axis + ")");
  if (!data.axes.empty()) {
    const std::string axes = joined(data.axes, ",");
    if (data.sharded && !data.sharded_modules.empty())
      parts.push_back("fsdp(" + axes + ")[" + joined(data.sharded_units, ",") + "] + ddp(" + axes + ")");
    else
      parts.push_back((data.sharded ? "fsdp(" : "ddp(") + axes + ")");
  }
  return joined(parts, " + ");
}

}  // namespace tessera::mpmd
