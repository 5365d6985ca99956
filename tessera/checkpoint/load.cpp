// checkpoint::load: every rank reads the chunks its block overlaps, checks their CRC-32 against the
// metadata, and copies the overlap into its block. A replicated target is read split over its
// replicas and all-gathered; otherwise no communication but the agreement on failure. Where a
// two-rename commit was cut short (no `dir`), it reads the previous checkpoint parked beside `dir`.
#include <tessera/checkpoint/checkpoint.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <vector>

#include <tessera/checkpoint/detail/agreement.hpp>
#include <tessera/checkpoint/detail/chunks.hpp>
#include <tessera/checkpoint/detail/files.hpp>
#include <tessera/checkpoint/detail/zarr.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::checkpoint {

namespace fs = std::filesystem;

namespace {

// A file of the checkpoint, open for reading; `what` names it in errors ("chunk", "array metadata").
// POSIX calls, not a stream: a stream opens a directory as well and reports its size as 2^63 - 1.
class InputFile {
 public:
  InputFile(const fs::path& path, const char* what) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    const int error = errno;
    TESSERA_CHECK(fd_ >= 0 || error != ENOENT, IoError, "checkpoint::load", what, " ", path.string(), " is missing");
    TESSERA_CHECK(fd_ >= 0, IoError, "checkpoint::load", "cannot open ", what, " ", path.string(), ": ", std::strerror(error));
    struct stat info {};
    const bool stated = ::fstat(fd_, &info) == 0;
    if (!stated || !S_ISREG(info.st_mode)) {  // no destructor runs for a throwing constructor
      ::close(fd_);
      TESSERA_CHECK(false, IoError, "checkpoint::load", what, " ", path.string(), " is ",
                    stated && S_ISDIR(info.st_mode) ? "a directory" : "not a regular file", "; expected a file");
    }
    size_ = static_cast<int64_t>(info.st_size);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile() { ::close(fd_); }

  int64_t size() const { return size_; }
  // Reads the whole file into `into` (size() bytes).
  void read(char* into) const {
    for (int64_t done = 0; done < size_;) {
      const ssize_t got = ::pread(fd_, into + done, static_cast<size_t>(size_ - done), static_cast<off_t>(done));
      if (got < 0 && errno == EINTR) continue;
      TESSERA_CHECK(got > 0, IoError, "checkpoint::load", "cannot read ", path_.string(), ": ",
                    got < 0 ? std::strerror(errno) : "it ended early");
      done += got;
    }
  }

 private:
  fs::path path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// The directory holding the checkpoint at `dir` (see detail/files.hpp), or IoError naming what is there.
fs::path checkpoint_at(const std::string& dir) {
  const fs::path target = detail::checkpoint_dir(dir);
  const std::optional<fs::path> committed = detail::committed_dir(target);
  std::error_code ec;
  TESSERA_CHECK(committed, IoError, "checkpoint::load", "no checkpoint at ", dir, ": no such directory",
                fs::exists(detail::staging_dir(target), ec)
                    ? " (" + detail::staging_dir(target).string() + " is a save that did not finish)"
                    : std::string());
  TESSERA_CHECK(fs::is_directory(*committed, ec), IoError, "checkpoint::load", "no checkpoint at ", dir,
                ": it is not a directory");
  return *committed == target ? fs::path(dir) : *committed;
}

detail::ArrayMeta read_meta(const fs::path& group, const std::string& key) {
  const fs::path array_dir = group / key;
  std::error_code ec;
  TESSERA_CHECK(fs::is_directory(array_dir, ec), ValueError, "checkpoint::load", "no array '", key,
                "' in the checkpoint at ", group.string(), " (no directory ", array_dir.string(), ")");
  const fs::path path = array_dir / "zarr.json";
  const InputFile file(path, "array metadata");
  std::string text(static_cast<size_t>(file.size()), '\0');
  file.read(text.data());
  return detail::parse_array_json(text, path.string());
}

// Reads the chunk at `index` into `chunk` (contiguous, of the chunk shape), checked: its file's
// size (raw chunks) and CRC-32 against the metadata, and that it decompresses to a whole chunk
// (zstd chunks).
void read_chunk(const fs::path& array_dir, const detail::ArrayMeta& meta, const std::vector<int64_t>& index,
                Tensor& chunk) {
  const std::string key = detail::chunk_key(index, meta.separator);
  const fs::path path = array_dir / key;
  auto* bytes = static_cast<char*>(const_cast<void*>(chunk.raw_data()));
  const InputFile file(path, "chunk");
  const int64_t size = file.size();
  TESSERA_CHECK(meta.zstd_level || size == chunk.nbytes(), IoError, "checkpoint::load", "chunk ", path.string(),
                " has ", size, " bytes; expected ", chunk.nbytes(), " (", meta.chunks.to_string(), " ", name(meta.dtype), ")");
  std::vector<char> stored;  // zstd chunks: the file, decompressed into the chunk once checked
  char* into = bytes;
  if (meta.zstd_level) {
    stored.resize(static_cast<size_t>(size));
    into = stored.data();
  }
  file.read(into);
  const auto expected = meta.checksums.find(key);
  TESSERA_CHECK(expected != meta.checksums.end(), IoError, "checkpoint::load", "chunk ", path.string(),
                " has no checksum in the array's metadata");
  const uint32_t crc = detail::crc32_of(into, size);
  TESSERA_CHECK(crc == expected->second, IoError, "checkpoint::load", "chunk ", path.string(),
                " is corrupt: CRC-32 ", crc, ", the metadata says ", expected->second);
  if (meta.zstd_level)
    TESSERA_CHECK(detail::zstd_decompress(stored, bytes, chunk.nbytes()), IoError, "checkpoint::load", "chunk ",
                  path.string(), " does not decompress to ", chunk.nbytes(), " bytes (", meta.chunks.to_string(), " ",
                  name(meta.dtype), ")");
}

// Copies every chunk overlapping this rank's block of `value` into it.
void fill_block(const fs::path& array_dir, const detail::ArrayMeta& meta, DTensor& value) {
  const DeviceMesh& mesh = value.device_mesh();
  if (!mesh.is_member()) return;
  const Block block = value.layout().block(mesh.coordinate());
  if (block.numel() == 0) return;
  Tensor local = value.to_local();
  const int64_t nd = meta.shape.size();
  std::vector<int64_t> first(static_cast<size_t>(nd)), last(static_cast<size_t>(nd)), index(static_cast<size_t>(nd));
  for (int64_t d = 0; d < nd; ++d) {
    first[static_cast<size_t>(d)] = block.begin[d] / meta.chunks[d];
    last[static_cast<size_t>(d)] = (block.end[d] - 1) / meta.chunks[d];
  }
  index = first;
  Tensor scratch;  // for chunks that are not exactly this block
  while (true) {
    // The chunk's region within the block; when it is the whole block (a chunk-aligned layout)
    // and the block is contiguous, the chunk is read straight into it.
    std::vector<int64_t> start(static_cast<size_t>(nd)), end(static_cast<size_t>(nd));
    Tensor to_region = local;
    bool exact = local.is_contiguous();
    for (int64_t d = 0; d < nd; ++d) {
      const auto i = static_cast<size_t>(d);
      start[i] = std::max(block.begin[d], index[i] * meta.chunks[d]);
      end[i] = std::min({block.end[d], (index[i] + 1) * meta.chunks[d], meta.shape[d]});
      exact = exact && start[i] == block.begin[d] && end[i] == block.end[d] && end[i] - start[i] == meta.chunks[d];
      to_region = to_region.narrow(d, start[i] - block.begin[d], end[i] - start[i]);
    }
    if (exact) {
      read_chunk(array_dir, meta, index, local);
    } else {
      if (!scratch.defined()) scratch = empty(meta.chunks, meta.dtype);
      read_chunk(array_dir, meta, index, scratch);
      Tensor from_region = scratch;
      for (int64_t d = 0; d < nd; ++d) {
        const auto i = static_cast<size_t>(d);
        from_region = from_region.narrow(d, start[i] - index[i] * meta.chunks[d], end[i] - start[i]);
      }
      to_region.copy_(from_region);
    }
    int64_t d = nd - 1;  // the next index, row-major
    for (; d >= 0; --d) {
      const auto i = static_cast<size_t>(d);
      if (++index[i] <= last[i]) break;
      index[i] = first[i];
    }
    if (d < 0) return;
  }
}

// The layout `layout`'s ranks read in: its replicated mesh dims (of more than one rank) also split
// a tensor dim, so that replicas read 1/k of the chunks each and an all_gather completes the
// value; nullopt when nothing is replicated (or no dim can take the split: explicit sizes).
std::optional<Layout> reading_layout(const Layout& layout) {
  if (layout.ndim() == 0 || layout.global_shape().numel() == 0) return std::nullopt;
  std::vector<int64_t> replicated;
  for (int64_t m = 0; m < layout.mesh().ndim(); ++m)
    if (is_replicate(layout.placements()[static_cast<size_t>(m)]) && layout.mesh().size(m) > 1) replicated.push_back(m);
  if (replicated.empty()) return std::nullopt;
  int64_t dim = -1;  // the largest dim with chunk-sized pieces
  for (int64_t d = 0; d < layout.ndim(); ++d)
    if (!layout.has_explicit_sizes(d) && (dim < 0 || layout.global_shape()[d] > layout.global_shape()[dim])) dim = d;
  if (dim < 0) return std::nullopt;
  Placements placements = layout.placements();
  ShardOrder orders = layout.shard_orders();
  std::vector<int64_t> order = layout.shard_order(dim);
  for (int64_t m : replicated) {
    placements[static_cast<size_t>(m)] = Shard{dim};
    order.push_back(m);  // inside the dim's existing split
  }
  orders[dim] = order;
  return Layout(layout.global_shape(), layout.dtype(), layout.mesh(), placements, orders, layout.explicit_sizes());
}

}  // namespace

void load(const std::string& dir, std::map<std::string, DTensor>& tensors) {
  std::string failure;
  std::exception_ptr error;
  std::vector<std::pair<DTensor*, DTensor>> gathers;  // values read split, to gather into place
  try {
    const fs::path group = checkpoint_at(dir);
    for (auto& [key, value] : tensors) {
      detail::check_key(key, "checkpoint::load");
      TESSERA_CHECK(value.defined() || !value.device_mesh().is_member(), ValueError, "checkpoint::load", "tensor '",
                    key, "' is undefined");
      TESSERA_CHECK(!value.layout().has_partial(), ValueError, "checkpoint::load", "tensor '", key, "' is ",
                    value.layout().to_string(), "; load into a layout without Partial");
      const fs::path array_dir = group / key;
      const detail::ArrayMeta meta = read_meta(group, key);
      TESSERA_CHECK(meta.shape == value.shape() && meta.dtype == value.dtype(), ValueError, "checkpoint::load",
                    "array '", key, "' is ", meta.shape.to_string(), " ", name(meta.dtype), "; the tensor is ",
                    value.shape().to_string(), " ", name(value.dtype()));
      // Replicated targets are read split and gathered after (below), each chunk read once per
      // replica group rather than once per rank.
      const DeviceMesh& mesh = value.device_mesh();
      const std::optional<Layout> reading = mesh.is_member() ? reading_layout(value.layout()) : std::nullopt;
      if (reading) {
        DTensor split(empty(reading->block(mesh.coordinate()).shape(), value.dtype()), mesh, *reading);
        fill_block(array_dir, meta, split);
        gathers.emplace_back(&value, split);
      } else {
        fill_block(array_dir, meta, value);
      }
    }
  } catch (const std::exception& e) {
    failure = e.what();
    error = std::current_exception();
  }
  // Every rank learns whether any failed, so that none goes on alone.
  const std::string first = detail::first_failure(failure);
  if (first.empty()) {
    const autograd::NoGradGuard no_grad;
    for (auto& [value, split] : gathers) {  // collective over each value's mesh, in key order
      Tensor local = value->to_local();
      local.copy_(split.redistribute(value->device_mesh(), value->layout()).to_local());
    }
    return;
  }
  if (error) std::rethrow_exception(error);  // this rank's own error, as it was thrown
  TESSERA_CHECK(false, IoError, "checkpoint::load", first);
}

}  // namespace tessera::checkpoint
