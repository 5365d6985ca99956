#include <tessera/checkpoint/detail/zarr.hpp>

#include <zlib.h>

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
  return json{{"zarr_format", 3},
              {"node_type", "array"},
              {"shape", meta.shape.vec()},
              {"data_type", zarr_name(meta.dtype)},
              {"chunk_grid", {{"name", "regular"}, {"configuration", {{"chunk_shape", meta.chunks.vec()}}}}},
              {"chunk_key_encoding", {{"name", "default"}, {"configuration", {{"separator", "/"}}}}},
              {"fill_value", fill_value(meta.dtype)},
              {"codecs", json::array({{{"name", "bytes"}, {"configuration", {{"endian", "little"}}}}})},
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
    TESSERA_CHECK(keys.at("name") == "default" && keys.value("configuration", json::object()).value("separator", "/") == "/",
                  ValueError, "checkpoint::load", path, ": chunk keys ", keys.dump(), " are not supported");
    const json& codecs = j.at("codecs");
    TESSERA_CHECK(codecs.size() == 1 && codecs[0].at("name") == "bytes" &&
                      codecs[0].value("configuration", json::object()).value("endian", "little") == "little",
                  ValueError, "checkpoint::load", path, ": codecs ", codecs.dump(),
                  " are not supported (the bytes codec, little-endian, only)");
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

std::string chunk_key(const std::vector<int64_t>& index) {
  std::string key = "c";
  for (int64_t i : index) key += "/" + std::to_string(i);
  return key;
}

uint32_t crc32_of(const void* bytes, int64_t count) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(bytes);
  while (count > 0) {
    const auto step = static_cast<uInt>(std::min<int64_t>(count, int64_t{1} << 30));
    crc = crc32(crc, p, step);
    p += step;
    count -= step;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace tessera::checkpoint::detail
