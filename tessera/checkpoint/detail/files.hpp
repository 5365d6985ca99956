#pragma once
// The file-system side of a save: writing and syncing the staged group's files, and the commit
// that puts the staged group in place of the previous checkpoint in one step (and where a load
// finds the checkpoint when a commit of the two-rename kind was cut short).
//
// The commit, on the save's rank 0, once every rank has written and synced its files:
//   write <dir>.tessera-saving/zarr.json, sync it and the staging directory (sync_files);
//   renameat2(<dir>.tessera-saving, <dir>, RENAME_EXCHANGE): the one step that switches; the
//   staging name then holds the previous checkpoint (a plain rename when there was none);
//   sync the parent directory (sync_files); remove <dir>.tessera-saving.
// A crash anywhere leaves <dir> whole: the previous checkpoint before the exchange, the new one
// after. Where the file system has no RENAME_EXCHANGE (EINVAL: NFS, some FUSE file systems), two
// renames: <dir> to <dir>.tessera-old, then the staging directory to <dir>. Between them there is
// no <dir>; load then reads <dir>.tessera-old (the previous checkpoint, whole) and the next save
// renames it back before it stages. Tessera before RENAME_EXCHANGE left the same state.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {
namespace checkpoint::detail {

/// Writes a file in an existing directory; with `sync`, on the disk before it returns. Throws
/// IoError naming the path.
void write_file(const std::filesystem::path& path, const void* data, int64_t bytes, bool sync);
/// A directory's entries on the disk; with `whole_file_system`, everything this machine wrote to
/// the file system holding it (syncfs). Throws IoError naming the path.
void sync_directory(const std::filesystem::path& path, bool whole_file_system = false);

/// `dir` as save and load use it: a trailing '/' dropped (so that the names beside it are beside
/// it, not in it).
std::filesystem::path checkpoint_dir(const std::string& dir);
/// Where a save to `dir` stages its group: "<dir>.tessera-saving".
std::filesystem::path staging_dir(const std::filesystem::path& dir);
/// Where a two-rename commit parks the previous checkpoint between its renames: "<dir>.tessera-old".
std::filesystem::path parked_dir(const std::filesystem::path& dir);

/// The directory holding the checkpoint saved at `dir`: `dir`, or when it is missing, the
/// previous checkpoint that an interrupted two-rename commit parked beside it; nullopt when there
/// is neither.
std::optional<std::filesystem::path> committed_dir(const std::filesystem::path& dir);

/// Before a save to `dir` stages its group: puts back a checkpoint that an interrupted commit
/// parked, removes what an interrupted save or commit left, and makes the staging directory with
/// a directory per array. Throws IoError naming the path (nothing at `dir` changed).
void prepare_staging(const std::filesystem::path& dir, const std::vector<std::string>& arrays);

/// Puts the complete staged group of a save to `dir` in place (see the top of this file). Throws
/// IoError when it fails before the switch (the message says where the previous checkpoint is:
/// at `dir`, unchanged). After the switch the checkpoint is in place: a failure to sync the parent
/// or to remove the previous checkpoint is returned as a warning ("" when none).
std::string commit(const std::filesystem::path& dir, bool sync);

}  // namespace checkpoint::detail
}  // namespace tessera
