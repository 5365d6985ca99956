// checkpoint::save: chunk-aligned layouts by the planner, each chunk written once by the rank that
// holds it, checksums gathered for the metadata, the group renamed into place when all is written.
#include <tessera/checkpoint/checkpoint.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <tessera/checkpoint/detail/chunks.hpp>
#include <tessera/checkpoint/detail/zarr.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::checkpoint {

namespace fs = std::filesystem;

namespace {

// Writes a file in an existing directory; with `sync`, on the disk before it returns.
void write_file(const fs::path& path, const void* data, int64_t bytes, bool sync) {
  // write(2) straight from the tensor's memory: no stream buffer in between.
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  TESSERA_CHECK(fd >= 0, IoError, "checkpoint::save", "cannot create ", path.string(), ": ", std::strerror(errno));
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t written = ::write(fd, p, static_cast<size_t>(bytes));
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      const int error = errno;
      ::close(fd);
      TESSERA_CHECK(false, IoError, "checkpoint::save", "cannot write ", path.string(), ": ",
                    written < 0 ? std::strerror(error) : "no progress");
    }
    p += written;
    bytes -= written;
  }
  if (sync && ::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    TESSERA_CHECK(false, IoError, "checkpoint::save", "cannot sync ", path.string(), ": ", std::strerror(error));
  }
  TESSERA_CHECK(::close(fd) == 0, IoError, "checkpoint::save", "cannot write ", path.string(), ": ", std::strerror(errno));
}

void write_text(const fs::path& path, const std::string& text, bool sync) {
  write_file(path, text.data(), static_cast<int64_t>(text.size()), sync);
}

// A directory's entries on the disk (the files in it, a rename into it); with `whole_file_system`,
// everything this machine wrote to the file system holding it (syncfs: one call for many files,
// where an fsync per file would commit the journal once per file).
void sync_directory(const fs::path& path, bool whole_file_system = false) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TESSERA_CHECK(fd >= 0, IoError, "checkpoint::save", "cannot open directory ", path.string(), ": ", std::strerror(errno));
  const int synced = whole_file_system ? ::syncfs(fd) : ::fsync(fd);
  const int error = errno;
  ::close(fd);
  TESSERA_CHECK(synced == 0, IoError, "checkpoint::save", "cannot sync directory ", path.string(), ": ", std::strerror(error));
}

// Writes this rank's chunk of `value` (already in plan.layout) if it is the writer; returns
// "name\tkey\tcrc\n" for the metadata, or "".
std::string write_chunk(const fs::path& array_dir, const std::string& name, const DTensor& value,
                        const detail::ChunkPlan& plan, const SaveOptions& options) {
  const DeviceMesh& mesh = value.device_mesh();
  if (!mesh.is_member()) return "";
  const std::vector<int64_t> coordinate = mesh.coordinate();
  const auto index = detail::chunk_index(plan, coordinate);
  if (!index) return "";  // a replica, or an empty trailing piece
  const Tensor chunk = detail::padded_chunk(value.to_local(), plan.chunks);
  const std::string key = detail::chunk_key(*index);
  uint32_t crc = 0;
  if (options.zstd_level > 0) {
    const std::vector<char> stored = detail::zstd_compress(chunk.raw_data(), chunk.nbytes(), options.zstd_level);
    write_file(array_dir / key, stored.data(), static_cast<int64_t>(stored.size()), false);
    crc = detail::crc32_of(stored.data(), static_cast<int64_t>(stored.size()));
  } else {
    write_file(array_dir / key, chunk.raw_data(), chunk.nbytes(), false);
    crc = detail::crc32_of(chunk.raw_data(), chunk.nbytes());
  }
  std::ostringstream line;
  line << name << '\t' << key << '\t' << crc << '\n';
  return line.str();
}

}  // namespace

void save(const std::string& dir, const std::map<std::string, DTensor>& tensors, const SaveOptions& options) {
  TESSERA_CHECK(options.zstd_level >= 0 && options.zstd_level <= 22, ValueError, "checkpoint::save", "zstd_level ",
                options.zstd_level, " is not in [0, 22] (0: raw chunks)");
  for (const auto& [name, value] : tensors) {
    detail::check_key(name, "checkpoint::save");
    TESSERA_CHECK(value.defined() || !value.device_mesh().is_member(), ValueError, "checkpoint::save", "tensor '",
                  name, "' is undefined");
  }
  const fs::path target(dir);
  const fs::path staging = target.string() + ".tessera-saving";
  const bool leader = rank() == 0;
  if (leader) {  // the group's directories, made once (each rank only writes files into them)
    std::error_code ec;
    fs::remove_all(staging, ec);  // what a crashed save left
    for (const auto& [name, value] : tensors) fs::create_directories(staging / name, ec);
  }
  world().barrier();

  // Each rank writes its chunks; a failure is recorded, not thrown, so that no rank is left
  // waiting in the exchange below.
  std::string lines, failure;
  std::map<std::string, Shape> chunk_shapes;  // for the metadata
  try {
    const autograd::NoGradGuard no_grad;
    for (const auto& [name, value] : tensors) {
      const detail::ChunkPlan plan = detail::chunk_plan(value.layout());
      chunk_shapes[name] = plan.chunks;
      const DTensor aligned = value.layout() == plan.layout ? value : value.redistribute(value.device_mesh(), plan.layout);
      lines += write_chunk(staging / name, name, aligned, plan, options);
      detail::save_fault_point();
    }
    if (options.sync_files) sync_directory(staging, true);  // this rank's chunks, all at once
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const std::string report = failure.empty() ? lines : "!" + std::to_string(rank()) + "\t" + failure + "\n";
  const std::string all = detail::all_gather_text(report);

  std::string first_failure;
  std::map<std::string, detail::ArrayMeta> arrays;
  std::istringstream in(all);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (line[0] == '!') {
      if (first_failure.empty()) first_failure = line.substr(1);
      continue;
    }
    std::istringstream fields(line);
    std::string name, key, crc;
    std::getline(fields, name, '\t');
    std::getline(fields, key, '\t');
    std::getline(fields, crc, '\t');
    arrays[name].checksums[key] = static_cast<uint32_t>(std::stoul(crc));
  }
  // A failure anywhere: the staged group goes, the previous checkpoint stays, every rank throws.
  const auto abandon_if = [&](const std::string& failure_line) {
    if (failure_line.empty()) return;
    if (leader) {
      std::error_code ec;
      fs::remove_all(staging, ec);
    }
    world().barrier();
    const size_t tab = failure_line.find('\t');
    TESSERA_CHECK(false, IoError, "checkpoint::save", "rank ", failure_line.substr(0, tab), " failed: ",
                  failure_line.substr(tab + 1, failure_line.find('\n') - tab - 1), "; ", target.string(), " is unchanged");
  };
  abandon_if(first_failure);

  // The arrays' metadata, spread over the ranks (array i by rank i mod n): where creating and
  // syncing a file costs a millisecond, one rank writing them all would take most of the save.
  std::string meta_failure;
  try {
    int64_t i = 0;
    for (const auto& [name, value] : tensors) {
      if (i++ % world_size() != rank()) continue;
      detail::ArrayMeta& meta = arrays[name];
      meta.shape = value.shape();
      meta.dtype = value.dtype();
      meta.chunks = chunk_shapes.at(name);
      if (options.zstd_level > 0) meta.zstd_level = options.zstd_level;
      write_text(staging / name / "zarr.json", detail::array_json(meta), false);
    }
    if (options.sync_files) sync_directory(staging, true);  // this rank's metadata and every directory entry
  } catch (const std::exception& e) {
    meta_failure = std::to_string(rank()) + "\t" + e.what() + "\n";
  }
  abandon_if(detail::all_gather_text(meta_failure));

  std::string rename_error;
  if (leader) {
    try {
      write_text(staging / "zarr.json", detail::group_json(), options.sync_files);
      if (options.sync_files) sync_directory(staging);
      // The previous checkpoint is replaced only now, by two renames.
      const fs::path old = target.string() + ".tessera-old";
      std::error_code ec;
      fs::remove_all(old, ec);
      if (fs::exists(target)) fs::rename(target, old);
      fs::rename(staging, target);
      if (options.sync_files) sync_directory(fs::absolute(target).parent_path());  // the rename itself
      fs::remove_all(old, ec);
    } catch (const std::exception& e) {
      rename_error = e.what();
    }
  }
  int64_t failed = rename_error.empty() ? 0 : 1;
  world().all_reduce(&failed, 1, DType::i64, ReduceOp::max);
  TESSERA_CHECK(failed == 0, IoError, "checkpoint::save", "rank 0 could not finish ", target.string(),
                rename_error.empty() ? "" : ": ", rename_error);
}

}  // namespace tessera::checkpoint
