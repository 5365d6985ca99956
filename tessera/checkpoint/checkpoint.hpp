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
  /// Put every file and directory on the disk before the group is switched into place, and the
  /// switch after (as torch.distributed.checkpoint's sync_files): a machine that loses power
  /// keeps the previous checkpoint or the new one whole. Each rank syncs its writes at once
  /// (syncfs), not file by file. Off: a crashed process still leaves one whole; the page cache
  /// decides when the bytes reach the disk.
  bool sync_files = true;
};

/// Writes `tensors` to the directory `dir` as a Zarr v3 group whose arrays are named by the keys.
/// Each tensor is first moved, by the planner, to a chunk-aligned layout (Partial reduced; a dim
/// split over several mesh dims or into explicit sizes gathered); then each chunk is written by
/// the one rank that holds it (replicas write nothing twice). Atomic: the group is written beside
/// `dir` (as `dir`.tessera-saving) and, when every rank has finished, exchanged with `dir` in one
/// rename (renameat2 RENAME_EXCHANGE; a plain rename when there is no `dir`), so that a failure or
/// a killed process at any point leaves `dir` holding one whole checkpoint: the previous one
/// before the exchange, the new one from it on. On a file system without RENAME_EXCHANGE (NFS,
/// some FUSE file systems) the switch is two renames, `dir` to `dir`.tessera-old and the new group
/// to `dir`; a crash between them leaves the previous checkpoint whole at `dir`.tessera-old, where
/// load reads it and the next save puts it back first. Every rank runs the same collectives
/// whatever fails on any of them, so that all learn the first failure at once. Collective over
/// the world: every rank passes the same keys, shapes and dtypes in the same layouts. `dir` must
/// be on a file system every rank sees. Throws ValueError for a bad key (empty, or with '/', or
/// "." / ".."), IoError naming the path and the failing rank when a write or the switch fails (on
/// every rank; load then reads the previous checkpoint). Once the new group is in place the save
/// has succeeded: a failure to sync the parent directory or to remove the previous checkpoint
/// after it is printed to stderr, not thrown.
void save(const std::string& dir, const std::map<std::string, DTensor>& tensors, const SaveOptions& options = {});

/// Reads the arrays named by the keys of `tensors` from the group at `dir` into each value, in its
/// own layout (its local block is overwritten in place; it stays the same DTensor; a Partial
/// value is not accepted). Each rank reads the chunks its block overlaps and checks each chunk's
/// CRC-32 (raw and zstd chunks alike). A value replicated over some mesh dims is read split over
/// those ranks (each chunk read by one rank of each replica group) and all-gathered. The ranks of
/// a tensor's mesh pass it under the same key; other ranks need not pass it. Where a save was cut
/// short between the two renames of its switch (see save), reads the previous checkpoint it left
/// beside `dir`. Throws IoError when there is no checkpoint at `dir` (no such directory, or not a
/// directory), ValueError naming the key for a missing array or a shape or dtype that differs
/// from the value's, and IoError naming the file for missing array metadata or a missing, short
/// or corrupt chunk, or one that is no file; on every rank (collective over the world), with the rank that found it named.
/// After a failure the values may be partly overwritten.
void load(const std::string& dir, std::map<std::string, DTensor>& tensors);

}  // namespace checkpoint
}  // namespace tessera
