#pragma once
// Sharded checkpoints in an open format: a map of DTensors saved as a Zarr v3 group (one array
// per key, little-endian chunks on a regular grid, raw or zstd-compressed, CRC-32 of every chunk
// file in the array's metadata) that zarr-python and other Zarr readers open, and loaded into any layout on any mesh.
// Every rank writes the chunks it holds, each chunk once; every rank reads the chunks its block
// overlaps. No pickles, no gathering on one rank.
#include <map>
#include <string>

#include <tessera/core/export.hpp>
#include <tessera/dtensor/dtensor.hpp>

namespace tessera TESSERA_API {
namespace checkpoint {

/// A checkpoint file could not be written or read (the message names the path).
class IoError : public Error {
 public:
  using Error::Error;
};

/// How save writes chunks.
struct SaveOptions {
  /// Compress each chunk with zstd at this level (Zarr's zstd codec; 1 fastest, 19 smallest);
  /// 0 writes raw chunks.
  int zstd_level = 0;
  /// Put every file and directory on the disk before the group is renamed into place, and the
  /// rename after (as torch.distributed.checkpoint's sync_files): a machine that loses power
  /// keeps the previous checkpoint or the new one whole. Each rank syncs its writes at once
  /// (syncfs), not file by file. Off: a crashed process still leaves one whole; the page cache
  /// decides when the bytes reach the disk.
  bool sync_files = true;
};

/// Writes `tensors` to the directory `dir` as a Zarr v3 group whose arrays are named by the keys.
/// Each tensor is first moved, by the planner, to a chunk-aligned layout (Partial reduced; a dim
/// split over several mesh dims or into explicit sizes gathered); then each chunk is written by
/// the one rank that holds it (replicas write nothing twice). Atomic: the group is written beside
/// `dir` and renamed over it when every rank has finished, so a failure leaves any previous
/// checkpoint at `dir` intact. Collective over the world: every rank passes the same keys, shapes
/// and dtypes in the same layouts. `dir` must be on a file system every rank sees. Throws
/// ValueError for a bad key (empty, or with '/', or "." / ".."), IoError naming the path and the
/// failing rank when a write fails (on every rank).
void save(const std::string& dir, const std::map<std::string, DTensor>& tensors, const SaveOptions& options = {});

/// Reads the arrays named by the keys of `tensors` from the group at `dir` into each value, in its
/// own layout (its local block is overwritten in place; it stays the same DTensor; a Partial
/// value is not accepted). Each rank reads the chunks its block overlaps and checks each chunk's
/// CRC-32 (raw and zstd chunks alike). A value replicated over some mesh dims is read split over
/// those ranks (each chunk read by one rank of each replica group) and all-gathered. The ranks of
/// a tensor's mesh pass it under the same key; other ranks need not pass it. Throws ValueError naming the key for a missing array or a shape or dtype that differs
/// from the value's, and IoError naming the chunk file for a missing, short or corrupt chunk; on
/// every rank (collective over the world), with the rank that found it named. After a failure
/// the values may be partly overwritten.
void load(const std::string& dir, std::map<std::string, DTensor>& tensors);

}  // namespace checkpoint
}  // namespace tessera
