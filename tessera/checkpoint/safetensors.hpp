#pragma once
// Export to safetensors (https://github.com/huggingface/safetensors), the format inference tools
// load (Hugging Face transformers, vLLM, llama.cpp's converters): whole tensors, not shards, in
// one file `model.safetensors` or, split by size, `model-00001-of-0000N.safetensors` ... with
// the Hugging Face index `model.safetensors.index.json`. One-way: Tessera's own checkpoints are
// Zarr groups (checkpoint.hpp), which keep the sharding and load into any layout.
#include <cstdint>
#include <map>
#include <string>

#include <tessera/checkpoint/checkpoint.hpp>
#include <tessera/core/export.hpp>
#include <tessera/dtensor/dtensor.hpp>

namespace tessera TESSERA_API {
namespace checkpoint {

/// How export_safetensors lays out its files.
/// **Constraints:** max_file_bytes >= 0; metadata keys and values valid UTF-8.
/// **Example:** `{.max_file_bytes = 5'000'000'000}` splits as Hugging Face's 5 GB shards.
struct SafetensorsOptions {
  /// 0: one file; else files of at most this many tensor bytes each (headers not counted),
  /// filled in key order; a tensor larger than it gets a file of its own.
  int64_t max_file_bytes = 0;
  /// The header's "__metadata__" (string to string), in every file; omitted when empty.
  std::map<std::string, std::string> metadata = {};
};

/// Writes `tensors` into the directory `dir` (created if absent) as safetensors, whole and
/// replicated: each tensor, in any layout (sharded, Partial, on any mesh that includes world
/// rank 0), is made whole with full_tensor(), one tensor at a time, and world rank 0 writes it.
/// Tensors are stored under their keys, little-endian row-major, packed in key order (dtypes F32
/// F64 F16 BF16 I32 I64 U8 BOOL). One file `model.safetensors` when everything fits in one (as
/// Hugging Face writes it); else `model-0000i-of-0000N.safetensors` and
/// `model.safetensors.index.json` ({"metadata": {"total_size": bytes}, "weight_map": {key: file}}).
/// Each file is written under a temporary name and renamed when every file is complete; the
/// files of an earlier export into `dir` that this one does not replace (model.safetensors,
/// shards, the index) are removed, so that a loader never mixes the two. Collective over the
/// world: every rank passes the same keys, shapes and dtypes in the same layouts. Throws
/// ValueError naming the key for an empty key, "__metadata__", a key or metadata that is not
/// valid UTF-8, an undefined tensor or a tensor whose mesh does not include world rank 0, and
/// for a negative max_file_bytes (before any communication); IoError naming the path on every
/// rank when rank 0 cannot write.
/// **Example:** `export_safetensors("out/hf", {{"lm_head.weight", w}}, {.metadata = {{"format", "pt"}}})`.
void export_safetensors(const std::string& dir, const std::map<std::string, DTensor>& tensors,
                        const SafetensorsOptions& options = {});

}  // namespace checkpoint
}  // namespace tessera
