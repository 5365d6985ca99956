// export_safetensors: the file read back byte by byte here (the 8-byte header size, the JSON
// header, the packed buffer) holds every dtype, layout and shape (uneven, 0-d, empty) whole; a
// split export gives Hugging Face's shards and index, greedy in key order, and removes the files
// of an earlier export it does not replace; bad keys and tensors throw ValueError, and a failed
// write throws IoError naming the path on every rank.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include <tessera/checkpoint/safetensors.hpp>
#include <tessera/dtensor/ops.hpp>
#include <tessera/ops/ops.hpp>

#include "checkpoint/checkpoint_test_util.hpp"
#include "rank_test_util.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::testing;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Every dtype, uneven shapes, a 0-d and an empty tensor.
std::map<std::string, Tensor> wholes() {
  return {{"a_f64", sample_values({7, 5}, 0.1, DType::f64)},  {"b_f32", sample_values({6}, 0.2, DType::f32)},
          {"c_bf16", sample_values({5, 3}, 0.3, DType::bf16)}, {"d_i64", sample_values({4}, 0.4, DType::i64)},
          {"e_b8", sample_values({3, 2}, 0.5, DType::b8)},     {"f_f16", sample_values({2, 9}, 0.6, DType::f16)},
          {"g_scalar", sample_values({}, 0.7, DType::f32)},    {"h_empty", sample_values({0, 3}, 0.8, DType::f32)},
          {"i_u8", sample_values({5}, 0.9, DType::u8)},        {"j_i32", sample_values({3, 3}, 1.0, DType::i32)}};
}

// The same tensors in a variety of layouts on `mesh`: sharded both ways, nested, replicated.
std::map<std::string, DTensor> distributed(const std::map<std::string, Tensor>& whole, const DeviceMesh& mesh) {
  std::map<std::string, DTensor> out;
  size_t k = 0;
  for (const auto& [key, t] : whole) {
    Placements p(static_cast<size_t>(mesh.ndim()), Replicate{});
    if (t.ndim() >= 1 && k % 3 == 0) p[0] = Shard{0};
    if (t.ndim() >= 2 && mesh.ndim() == 2 && k % 3 == 0) p[1] = Shard{1};
    if (t.ndim() >= 1 && mesh.ndim() == 2 && k % 3 == 1) p[0] = Shard{t.ndim() - 1}, p[1] = Shard{t.ndim() - 1};
    out.emplace(key, distribute_tensor(t, mesh, p));
    ++k;
  }
  return out;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    case DType::b8: return "BOOL";
  }
  return "";
}

struct SafetensorsFile {
  uint64_t header_size = 0;
  json header;
  std::string buffer;
};

// Parsed here, apart from the code under test, as the format's readme says.
SafetensorsFile read_safetensors(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  SafetensorsFile file;
  if (bytes.size() < 8) {
    ADD_FAILURE() << path << " has " << bytes.size() << " bytes";
    return file;
  }
  for (size_t b = 0; b < 8; ++b) file.header_size |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[b])) << (8 * b);
  EXPECT_LE(8 + file.header_size, bytes.size()) << path;
  EXPECT_EQ((8 + file.header_size) % 8, 0u) << path << ": the buffer is not 8-byte aligned";
  const std::string text = bytes.substr(8, file.header_size);
  EXPECT_EQ(text.front(), '{') << path;
  file.header = json::parse(text);  // trailing spaces are JSON whitespace
  file.buffer = bytes.substr(8 + file.header_size);
  return file;
}

// The file's tensors: dtypes and shapes as `whole`'s, packed back to back in key order from
// offset 0 to the end of the buffer, each holding the bytes of its whole tensor.
void expect_holds(const SafetensorsFile& file, const std::map<std::string, Tensor>& whole,
                  const std::set<std::string>& keys) {
  int64_t offset = 0;
  for (const std::string& key : keys) {
    SCOPED_TRACE(key);
    ASSERT_TRUE(file.header.contains(key));
    const json& entry = file.header.at(key);
    const Tensor t = whole.at(key).contiguous();
    EXPECT_EQ(entry.at("dtype"), dtype_name(t.dtype()));
    EXPECT_EQ(entry.at("shape").get<std::vector<int64_t>>(), t.shape().vec());
    const auto offsets = entry.at("data_offsets").get<std::vector<int64_t>>();
    ASSERT_EQ(offsets.size(), 2u);
    EXPECT_EQ(offsets[0], offset);
    EXPECT_EQ(offsets[1], offset + t.nbytes());
    ASSERT_LE(offsets[1], static_cast<int64_t>(file.buffer.size()));
    if (t.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(file.buffer.data() + offsets[0], t.raw_data(), static_cast<size_t>(t.nbytes())), 0);
    }
    offset = offsets[1];
  }
  EXPECT_EQ(offset, static_cast<int64_t>(file.buffer.size())) << "bytes after the last tensor";
  size_t tensors = 0;
  for (const auto& [key, value] : file.header.items()) tensors += key == "__metadata__" ? 0 : 1;
  EXPECT_EQ(tensors, keys.size());
}

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

}  // namespace

TEST(Safetensors, ExportsEveryDTypeAndLayoutWholeInOneFile) {
  for_each_world({2, 3, 4, 6}, [] {
    const int n = world_size();
    const bool two_d = n % 2 == 0 && n > 2;
    const DeviceMesh mesh = two_d ? DeviceMesh({2, n / 2}, {"dp", "tp"}) : DeviceMesh({n}, {"dp"});
    // A mesh of some ranks only (rank 0 among them): the others skip that tensor.
    std::vector<int> some;
    for (int r = 0; r + 1 < n; ++r) some.push_back(r);
    const DeviceMesh part({n - 1}, {"x"}, some);
    const std::string dir = shared_dir("safetensors-one-file");

    std::map<std::string, Tensor> whole = wholes();
    std::map<std::string, DTensor> tensors = distributed(whole, mesh);
    whole.emplace("k_part", sample_values({5, 2}, 1.1, DType::f32));
    tensors.emplace("k_part", distribute_tensor(whole.at("k_part"), part, {Shard{0}}));
    // Partial over dp: the exported value is the sum (the whole on dp = 0, zeros elsewhere).
    FromLocalOptions shape;
    shape.shape = Shape{3, 4};
    whole.emplace("l_partial", sample_values({3, 4}, 1.2, DType::f64));
    Placements partial(static_cast<size_t>(mesh.ndim()), Replicate{});
    partial[0] = Partial{};
    tensors.emplace("l_partial", DTensor::from_local(mesh.coordinate()[0] == 0 ? whole.at("l_partial") : zeros({3, 4}, DType::f64),
                                                     mesh, partial, shape));

    checkpoint::SafetensorsOptions options;
    options.metadata = {{"format", "pt"}, {"source", "tessera"}};
    checkpoint::export_safetensors(dir, tensors, options);

    EXPECT_EQ(files_in(dir), std::set<std::string>{"model.safetensors"});  // no index, no temporaries
    const SafetensorsFile file = read_safetensors(fs::path(dir) / "model.safetensors");
    EXPECT_EQ(file.header.at("__metadata__"), json({{"format", "pt"}, {"source", "tessera"}}));
    std::set<std::string> keys;
    for (const auto& [key, t] : whole) keys.insert(key);
    expect_holds(file, whole, keys);

    // Every rank has read the file before rank 0 replaces it (a replicated tensor's full_tensor
    // does not communicate, so nothing else holds rank 0 back).
    world().barrier();
    // Without metadata there is no "__metadata__"; an empty map is a valid, empty file.
    checkpoint::export_safetensors(dir, {{"b_f32", tensors.at("b_f32")}});
    const SafetensorsFile plain = read_safetensors(fs::path(dir) / "model.safetensors");
    EXPECT_FALSE(plain.header.contains("__metadata__"));
    expect_holds(plain, whole, {"b_f32"});
    world().barrier();
    checkpoint::export_safetensors(dir, {});
    const SafetensorsFile nothing = read_safetensors(fs::path(dir) / "model.safetensors");
    EXPECT_EQ(nothing.header, json::object());
    EXPECT_TRUE(nothing.buffer.empty());
    remove_shared(dir);
  });
}

TEST(Safetensors, SplitsIntoShardsWithAnIndex) {
  for_each_world({2, 3, 4, 6}, [] {
    const int n = world_size();
    const DeviceMesh mesh = n % 2 == 0 && n > 2 ? DeviceMesh({2, n / 2}, {"dp", "tp"}) : DeviceMesh({n}, {"dp"});
    const std::string dir = shared_dir("safetensors-split");
    const std::map<std::string, Tensor> whole = wholes();
    const std::map<std::string, DTensor> tensors = distributed(whole, mesh);
    // An earlier one-file export into the same directory, which the split export replaces.
    checkpoint::export_safetensors(dir, tensors);
    EXPECT_TRUE(fs::exists(fs::path(dir) / "model.safetensors"));
    world().barrier();

    const int64_t max_bytes = 64;  // a_f64 (280 bytes) alone; the small ones together
    checkpoint::SafetensorsOptions options;
    options.max_file_bytes = max_bytes;
    checkpoint::export_safetensors(dir, tensors, options);

    std::ifstream in(fs::path(dir) / "model.safetensors.index.json");
    const json index = json::parse(in);
    int64_t total = 0;
    for (const auto& [key, t] : whole) total += t.nbytes();
    EXPECT_EQ(index.at("metadata").at("total_size"), total);
    const json& weight_map = index.at("weight_map");
    std::map<std::string, std::set<std::string>> by_file;  // file -> its keys
    for (const auto& [key, t] : whole) {
      ASSERT_TRUE(weight_map.contains(key)) << key;
      by_file[weight_map.at(key).get<std::string>()].insert(key);
    }
    EXPECT_EQ(weight_map.size(), whole.size());
    const size_t count = by_file.size();
    EXPECT_GT(count, 2u);
    std::set<std::string> expected_files{"model.safetensors.index.json"};
    char name[64];
    for (size_t i = 1; i <= count; ++i) {
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i, count);
      expected_files.insert(name);
      ASSERT_TRUE(by_file.count(name)) << name << " holds no tensor";
    }
    // The earlier model.safetensors is gone: a loader would take it over the index.
    EXPECT_EQ(files_in(dir), expected_files);

    // Greedy in key order: each file within the limit unless it holds one tensor, and the next
    // file's first tensor would not have fitted.
    std::string previous_last;
    int64_t previous_bytes = 0;
    for (const auto& [file_name, keys] : by_file) {
      SCOPED_TRACE(file_name);
      const SafetensorsFile file = read_safetensors(fs::path(dir) / file_name);
      expect_holds(file, whole, keys);
      const auto bytes = static_cast<int64_t>(file.buffer.size());
      EXPECT_TRUE(bytes <= max_bytes || keys.size() == 1) << bytes << " bytes";
      if (!previous_last.empty()) {
        EXPECT_LT(previous_last, *keys.begin());
        EXPECT_GT(previous_bytes + whole.at(*keys.begin()).nbytes(), max_bytes);
      }
      previous_last = *keys.rbegin();
      previous_bytes = bytes;
    }

    // Exported as one file again: the shards and the index go.
    world().barrier();
    checkpoint::export_safetensors(dir, tensors);
    EXPECT_EQ(files_in(dir), std::set<std::string>{"model.safetensors"});
    remove_shared(dir);
  });
}

TEST(Safetensors, NamesWhatIsWrong) {
  for_each_world({2, 3, 4, 6}, [] {
    const int n = world_size();
    const DeviceMesh mesh({n}, {"dp"});
    const DTensor w = distribute_tensor(sample_values({6, 4}, 0.3, DType::f32), mesh, {Shard{0}});
    const std::string dir = shared_dir("safetensors-errors");
    const std::string op = "[checkpoint::export_safetensors]";

    EXPECT_TRUE(throws_with<ValueError>([&] { checkpoint::export_safetensors(dir, {{"w", w}, {"", w}}); },
                                        {op, "key '' is empty"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { checkpoint::export_safetensors(dir, {{"__metadata__", w}}); },
                                        {op, "'__metadata__'"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { checkpoint::export_safetensors(dir, {{"w", w}, {"v", DTensor()}}); },
                                        {op, "tensor 'v' is undefined"}));
    checkpoint::SafetensorsOptions negative;
    negative.max_file_bytes = -1;
    EXPECT_TRUE(throws_with<ValueError>([&] { checkpoint::export_safetensors(dir, {{"w", w}}, negative); },
                                        {op, "max_file_bytes is -1"}));
    // A mesh without rank 0: the writer could not make the tensor whole.
    std::vector<int> others;
    for (int r = 1; r < n; ++r) others.push_back(r);
    const DeviceMesh rest({n - 1}, {"x"}, others);
    const DTensor elsewhere = zeros({4}, rest, {Shard{0}});
    EXPECT_TRUE(throws_with<ValueError>([&] { checkpoint::export_safetensors(dir, {{"w", w}, {"far", elsewhere}}); },
                                        {op, "tensor 'far'", rest.to_string(), "does not include world rank 0"}));
    // Nothing was written for any of them.
    EXPECT_FALSE(fs::exists(dir));

    // A directory under a regular file cannot be created: only rank 0 tries, every rank throws.
    world().barrier();
    if (rank() == 0) std::ofstream(dir + "-file") << "not a directory";
    world().barrier();
    const std::string unwritable = dir + "-file/out";
    EXPECT_TRUE(throws_with<checkpoint::IoError>([&] { checkpoint::export_safetensors(unwritable, {{"w", w}}); },
                                                 {op, "rank 0 could not export to " + unwritable, "cannot create directory"}));
    world().barrier();
    if (rank() == 0) fs::remove(dir + "-file");
    remove_shared(dir);
  });
}
