#include <tessera/checkpoint/detail/zarr.hpp>

#include <isa-l/crc.h>
#include <zstd.h>

#include <nlohmann/json.hpp>

#include <tessera/core/error.hpp>

namespace tessera::checkpoint::detail {

namespace {

using nlohmann::json;

// Zarr v3 core data type names (bf16 aside, see array_json).
const char* zarr_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::f16: return "float16";
    case DType::bf16: return "uint16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u8: return "uint8";
    case DType::b8: return "bool";
  }
  return "";
}

json fill_value(DType dtype) {
  if (dtype == DType::b8) return false;
  if (dtype == DType::f32 || dtype == DType::f64 || dtype == DType::f16) return 0.0;
  return 0;
}

}  // namespace

std::string group_json() {
  return json{{"zarr_format", 3}, {"node_type", "group"}, {"attributes", json::object()}}.dump(2);
}

std::string array_json(const ArrayMeta& meta) {
  json checksums = json::object();
  for (const auto& [key, crc] : meta.checksums) checksums[key] = crc;
  json tessera{{"crc32", checksums}};
  if (meta.dtype == DType::bf16) tessera["dtype"] = "bfloat16";
  json codecs = json::array({{{"name", "bytes"}, {"configuration", {{"endian", "little"}}}}});
  if (meta.zstd_level) codecs.push_back({{"name", "zstd"}, {"configuration", {{"level", *meta.zstd_level}, {"checksum", false}}}});
  return json{{"zarr_format", 3},
              {"node_type", "array"},
              {"shape", meta.shape.vec()},
              {"data_type", zarr_name(meta.dtype)},
              {"chunk_grid", {{"name", "regular"}, {"configuration", {{"chunk_shape", meta.chunks.vec()}}}}},
              {"chunk_key_encoding", {{"name", "default"}, {"configuration", {{"separator", std::string(1, meta.separator)}}}}},
              {"fill_value", fill_value(meta.dtype)},
              {"codecs", codecs},
              {"attributes", {{"tessera", tessera}}}}
      .dump(2);
}

ArrayMeta parse_array_json(const std::string& text, const std::string& path) {
  ArrayMeta meta;
  try {
    const json j = json::parse(text);
    TESSERA_CHECK(j.at("zarr_format") == 3 && j.at("node_type") == "array", ValueError, "checkpoint::load", path,
                  " is not a Zarr v3 array");
    meta.shape = Shape(j.at("shape").get<std::vector<int64_t>>());
    const json& grid = j.at("chunk_grid");
    TESSERA_CHECK(grid.at("name") == "regular", ValueError, "checkpoint::load", path, ": chunk grid ",
                  grid.at("name").dump(), " is not supported (regular only)");
    meta.chunks = Shape(grid.at("configuration").at("chunk_shape").get<std::vector<int64_t>>());
    const json& keys = j.at("chunk_key_encoding");
    const std::string separator = keys.value("configuration", json::object()).value("separator", "/");
    TESSERA_CHECK(keys.at("name") == "default" && (separator == "/" || separator == "."), ValueError,
                  "checkpoint::load", path, ": chunk keys ", keys.dump(), " are not supported");
    meta.separator = separator[0];
    const json& codecs = j.at("codecs");
    const bool little = codecs.size() >= 1 && codecs[0].at("name") == "bytes" &&
                        codecs[0].value("configuration", json::object()).value("endian", "little") == "little";
    const bool zstd = codecs.size() == 2 && codecs[1].at("name") == "zstd";
    TESSERA_CHECK(little && (codecs.size() == 1 || zstd), ValueError, "checkpoint::load", path, ": codecs ",
                  codecs.dump(), " are not supported (the bytes codec, little-endian, then optionally zstd)");
    if (zstd) meta.zstd_level = codecs[1].value("configuration", json::object()).value("level", 0);
    const json tessera = j.value("attributes", json::object()).value("tessera", json::object());
    const std::string type = j.at("data_type").get<std::string>();
    bool known = false;
    for (DType d : {DType::f32, DType::f64, DType::f16, DType::i32, DType::i64, DType::u8, DType::b8})
      if (type == zarr_name(d)) meta.dtype = d, known = true;
    if (type == "uint16" && tessera.value("dtype", "") == "bfloat16") meta.dtype = DType::bf16, known = true;
    TESSERA_CHECK(known, ValueError, "checkpoint::load", path, ": data type '", type, "' is not supported");
    const json checksums = tessera.value("crc32", json::object());  // named: items() views it
    for (const auto& [key, crc] : checksums.items()) meta.checksums[key] = crc.get<uint32_t>();
  } catch (const json::exception& e) {
    TESSERA_CHECK(false, ValueError, "checkpoint::load", path, " is not valid array metadata: ", e.what());
  }
  TESSERA_CHECK(meta.chunks.size() == meta.shape.size(), ValueError, "checkpoint::load", path, ": chunk shape ",
                meta.chunks.to_string(), " for shape ", meta.shape.to_string());
  return meta;
}

std::string chunk_key(const std::vector<int64_t>& index, char separator) {
  std::string key = "c";
  for (int64_t i : index) key += separator + std::to_string(i);
  return key;
}

std::vector<char> zstd_compress(const void* bytes, int64_t count, int level) {
  std::vector<char> out(ZSTD_compressBound(static_cast<size_t>(count)));
  const size_t size = ZSTD_compress(out.data(), out.size(), bytes, static_cast<size_t>(count), level);
  TESSERA_CHECK(!ZSTD_isError(size), ValueError, "checkpoint::save", "zstd at level ", level, ": ",
                ZSTD_getErrorName(size));
  out.resize(size);
  return out;
}

bool zstd_decompress(const std::vector<char>& stored, void* out, int64_t count) {
  const size_t size = ZSTD_decompress(out, static_cast<size_t>(count), stored.data(), stored.size());
  return !ZSTD_isError(size) && size == static_cast<size_t>(count);
}

uint32_t crc32_of(const void* bytes, int64_t count) {
  // ISA-L's CRC-32 is zlib's (the gzip polynomial, reflected), several times faster: it keeps
  // checking a chunk cheaper than reading it.
  return crc32_gzip_refl(0, static_cast<const unsigned char*>(bytes), static_cast<uint64_t>(count));
}

void check_key(const std::string& key, const char* op) {
  TESSERA_CHECK(!key.empty() && key != "." && key != ".." && key.find('/') == std::string::npos &&
                    key.find('\t') == std::string::npos && key.find('\n') == std::string::npos && key != "zarr.json",
                ValueError, op, "key '", key,
                "' cannot name a Zarr array (empty, '.', '..', 'zarr.json', or with '/', a tab or a newline)");
}

}  // namespace tessera::checkpoint::detail
