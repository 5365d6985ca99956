#pragma once
// Zarr v3 metadata as Tessera writes and reads it: a group's zarr.json, an array's zarr.json
// (regular chunk grid, default chunk keys "c.i.j", the bytes codec little-endian, optionally
// followed by the zstd codec) with the CRC-32 of every chunk file in its attributes, and the
// chunk keys and zstd (de)compression of a chunk.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <tessera/core/dtype.hpp>
#include <tessera/core/export.hpp>
#include <tessera/core/shape.hpp>

namespace tessera TESSERA_API {
namespace checkpoint::detail {

struct ArrayMeta {
  Shape shape;
  DType dtype = DType::f32;
  Shape chunks;                               // the regular grid's chunk shape
  std::map<std::string, uint32_t> checksums;  // chunk key -> CRC-32 of its file's bytes
  std::optional<int> zstd_level;              // chunks compressed by zstd at this level (nullopt: raw)
  // The default chunk key encoding's separator. Tessera writes '.': every chunk a file in the
  // array's directory, no directory per chunk row (creating inodes is most of a save's cost on
  // ext4 when arrays are many and chunks small). It reads '/' too.
  char separator = '.';
};

/// The group's zarr.json.
std::string group_json();
/// An array's zarr.json. bf16 has no Zarr v3 core type: it is stored as "uint16" (the raw bits)
/// with attributes.tessera.dtype = "bfloat16".
std::string array_json(const ArrayMeta& meta);
/// Parses an array's zarr.json; throws ValueError naming `path` for anything Tessera did not write
/// (another codec, grid or chunk key encoding, an unknown data type).
ArrayMeta parse_array_json(const std::string& text, const std::string& path);

/// Throws ValueError naming `op` unless `key` can name an array of the group (a directory of its
/// own: not empty, '.', '..' or 'zarr.json', without '/', a tab or a newline).
void check_key(const std::string& key, const char* op);

/// "c.i.j" (separator '.') or "c/i/j" for the chunk at grid index `index` ("c" for a 0-d array).
std::string chunk_key(const std::vector<int64_t>& index, char separator = '.');
/// Number of chunks along a dim of `extent` elements cut every `chunk`.
inline int64_t grid_extent(int64_t extent, int64_t chunk) { return (extent + chunk - 1) / chunk; }

/// `count` bytes compressed as one zstd frame (with its content size) at `level`.
std::vector<char> zstd_compress(const void* bytes, int64_t count, int level);
/// Decompresses the zstd frame `stored` into `out` of `count` bytes; false unless it decodes to
/// exactly `count` bytes.
bool zstd_decompress(const std::vector<char>& stored, void* out, int64_t count);

/// CRC-32 (zlib's: the gzip polynomial, reflected) of `bytes`.
uint32_t crc32_of(const void* bytes, int64_t count);

}  // namespace checkpoint::detail
}  // namespace tessera
