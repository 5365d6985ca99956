// checkpoint::export_safetensors: the files are planned from keys, shapes and dtypes alone, so
// every rank agrees on them without communicating; each tensor is made whole in turn and rank 0
// writes it; one exchange at the end tells every rank whether rank 0 succeeded.
#include <tessera/checkpoint/safetensors.hpp>

#include <bit>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include <tessera/core/grad_mode.hpp>
#include <tessera/dtensor/internal/mesh_io.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::checkpoint {

namespace fs = std::filesystem;

namespace {

using nlohmann::json;

constexpr const char* kOp = "checkpoint::export_safetensors";

// Tensor bytes go to the file as they lie in memory; safetensors is little-endian.
static_assert(std::endian::native == std::endian::little, "export_safetensors writes host bytes as little-endian");

const char* safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    case DType::b8: return "BOOL";  // one byte, 0 or 1, as Tessera stores a bool
  }
  return "";
}

// nlohmann::json refuses to dump invalid UTF-8; checking first turns that into a ValueError
// naming the key on every rank, before any communication.
bool valid_utf8(const std::string& text) {
  try {
    (void)json(text).dump();
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

struct Entry {
  std::string key;
  const DTensor* value = nullptr;
  int64_t begin = 0, end = 0;  // byte offsets in the file's buffer
};

struct File {
  std::string name;
  std::vector<Entry> entries;
  int64_t bytes = 0;
};

// Hugging Face's shard names: 1-based, five digits.
std::string shard_name(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index, count);
  return name;
}

// Key order (the map's); a new file whenever the next tensor would take the current one past
// max_bytes, so a tensor larger than max_bytes lands alone in a file.
std::vector<File> plan_files(const std::map<std::string, DTensor>& tensors, int64_t max_bytes) {
  std::vector<File> files(1);
  for (const auto& [key, value] : tensors) {
    const int64_t bytes = value.numel() * itemsize(value.dtype());
    if (max_bytes > 0 && !files.back().entries.empty() && files.back().bytes + bytes > max_bytes) files.emplace_back();
    File& file = files.back();
    file.entries.push_back({key, &value, file.bytes, file.bytes + bytes});
    file.bytes += bytes;
  }
  for (size_t i = 0; i < files.size(); ++i)
    files[i].name = files.size() == 1 ? "model.safetensors" : shard_name(i + 1, files.size());
  return files;
}

// What precedes the buffer: the header's size as a little-endian uint64, then the JSON header
// padded with spaces so that the buffer starts 8-byte aligned (as the safetensors writer does).
std::string file_prefix(const File& file, const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const Entry& entry : file.entries)
    header[entry.key] = {{"dtype", safetensors_dtype(entry.value->dtype())},
                         {"shape", entry.value->shape().vec()},
                         {"data_offsets", json::array({entry.begin, entry.end})}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string prefix(8, '\0');
  const uint64_t size = text.size();
  for (size_t b = 0; b < 8; ++b) prefix[b] = static_cast<char>((size >> (8 * b)) & 0xffu);
  return prefix + text;
}

std::string index_json(const std::vector<File>& files) {
  json weight_map = json::object();
  int64_t total = 0;
  for (const File& file : files) {
    total += file.bytes;
    for (const Entry& entry : file.entries) weight_map[entry.key] = file.name;
  }
  return json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n";
}

fs::path temporary(const fs::path& path) { return path.string() + ".tessera-writing"; }

}  // namespace

void export_safetensors(const std::string& dir, const std::map<std::string, DTensor>& tensors,
                        const SafetensorsOptions& options) {
  // Checked from what every rank holds alike (keys, meshes, options): all ranks throw or none.
  TESSERA_CHECK(options.max_file_bytes >= 0, ValueError, kOp, "max_file_bytes is ", options.max_file_bytes,
                "; expected 0 (one file) or a positive size");
  for (const auto& [key, value] : tensors) {
    TESSERA_CHECK(!key.empty(), ValueError, kOp, "key '' is empty; every tensor needs a name");
    TESSERA_CHECK(key != "__metadata__", ValueError, kOp, "key '", key, "' is the header's metadata entry");
    TESSERA_CHECK(valid_utf8(key), ValueError, kOp, "key '", key, "' is not valid UTF-8");
    const DeviceMesh& mesh = value.device_mesh();
    // A rank outside the tensor's mesh holds no local; a default DTensor has no mesh at all.
    TESSERA_CHECK(mesh.size() > 0 && (value.defined() || !mesh.is_member()), ValueError, kOp, "tensor '", key,
                  "' is undefined");
    TESSERA_CHECK(mesh.spec().contains(0), ValueError, kOp, "tensor '", key, "' is on ", mesh.to_string(),
                  ", which does not include world rank 0 (the rank that writes)");
  }
  for (const auto& [key, text] : options.metadata)
    TESSERA_CHECK(valid_utf8(key) && valid_utf8(text), ValueError, kOp, "metadata '", key, "' is not valid UTF-8");

  const std::vector<File> files = plan_files(tensors, options.max_file_bytes);
  const bool split = files.size() > 1;
  const fs::path target(dir);
  const fs::path index_path = target / "model.safetensors.index.json";
  const bool leader = rank() == 0;

  // Rank 0's first failure, kept rather than thrown so that rank 0 goes on taking part in every
  // full_tensor the other ranks call; once it is set, rank 0 writes nothing more.
  std::string failure;
  const auto fail = [&](const auto&... parts) {
    if (failure.empty()) failure = ::tessera::detail::concat(parts...);
  };
  const auto remove_temporaries = [&] {
    std::error_code ec;
    for (const File& file : files) fs::remove(temporary(target / file.name), ec);
    fs::remove(temporary(index_path), ec);
  };

  if (leader) {
    std::error_code ec;
    fs::create_directories(target, ec);
    if (!fs::is_directory(target, ec)) fail("cannot create directory ", target.string(), ec ? ": " + ec.message() : "");
  }
  try {
    const autograd::NoGradGuard no_grad;  // the whole tensors are only written out
    for (const File& file : files) {
      const fs::path part = temporary(target / file.name);
      std::ofstream out;
      if (leader && failure.empty()) {
        const std::string prefix = file_prefix(file, options.metadata);
        out.open(part, std::ios::binary | std::ios::trunc);
        out.write(prefix.data(), static_cast<std::streamsize>(prefix.size()));
        if (!out) fail("cannot write ", part.string());
      }
      for (const Entry& entry : file.entries) {
        // full_tensor is collective over the tensor's mesh: its other members make it whole too.
        if (!entry.value->device_mesh().is_member()) continue;
        const Tensor whole = entry.value->full_tensor().contiguous();
        if (!leader || !failure.empty() || whole.nbytes() == 0) continue;
        out.write(static_cast<const char*>(whole.raw_data()), static_cast<std::streamsize>(whole.nbytes()));
        if (!out) fail("cannot write ", part.string(), " (tensor '", entry.key, "')");
      }
      if (out.is_open()) {
        out.close();
        if (!out) fail("cannot write ", part.string());
      }
    }
  } catch (...) {  // a collective failed: every rank throws it; leave nothing half-written
    if (leader) remove_temporaries();
    throw;
  }

  if (leader && failure.empty()) {
    // Renamed only when every file is complete, the index last: it is what a loader reads first.
    std::error_code ec;
    if (split) {
      std::ofstream out(temporary(index_path), std::ios::binary | std::ios::trunc);
      const std::string text = index_json(files);
      out.write(text.data(), static_cast<std::streamsize>(text.size()));
      out.close();
      if (!out) fail("cannot write ", temporary(index_path).string());
    }
    std::vector<fs::path> finals;
    for (const File& file : files) finals.push_back(target / file.name);
    if (split) finals.push_back(index_path);
    for (const fs::path& path : finals) {
      if (!failure.empty()) break;
      fs::rename(temporary(path), path, ec);
      if (ec) fail("cannot rename ", temporary(path).string(), " to ", path.string(), ": ", ec.message());
    }
    // An earlier export's files that this one did not replace would mislead a loader (transformers
    // prefers model.safetensors to an index; an old index names old shards): they go, as
    // Hugging Face's save_pretrained removes them.
    if (failure.empty()) {
      std::set<std::string> written;
      for (const fs::path& path : finals) written.insert(path.filename().string());
      static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
      std::vector<fs::path> stale;
      for (const fs::directory_entry& entry : fs::directory_iterator(target, ec)) {
        const std::string name = entry.path().filename().string();
        const bool ours = name == "model.safetensors" || name == index_path.filename().string() ||
                          std::regex_match(name, shard);
        if (ours && !written.count(name)) stale.push_back(entry.path());
      }
      for (const fs::path& path : stale)
        if (!fs::remove(path, ec) && ec) fail("cannot remove ", path.string(), " (from an earlier export): ", ec.message());
    }
    if (!failure.empty()) remove_temporaries();
  } else if (leader) {
    remove_temporaries();
  }

  // Only rank 0 wrote, so only its report can be non-empty; every rank throws the same error.
  const std::string reported = tessera::detail::all_gather_text(world(), leader ? failure : "").front();
  TESSERA_CHECK(reported.empty(), IoError, kOp, "rank 0 could not export to ", target.string(), ": ", reported);
}

}  // namespace tessera::checkpoint
