// checkpoint::save: chunk-aligned layouts by the planner, each chunk written once by the rank that
// holds it, checksums gathered for the metadata, the group switched into place when all is written
// (detail/files.hpp).
#include <tessera/checkpoint/checkpoint.hpp>

#include <filesystem>
#include <iostream>

#include <tessera/checkpoint/detail/agreement.hpp>
#include <tessera/checkpoint/detail/chunks.hpp>
#include <tessera/checkpoint/detail/faults.hpp>
#include <tessera/checkpoint/detail/files.hpp>
#include <tessera/checkpoint/detail/zarr.hpp>
#include <tessera/dtensor/internal/mesh_io.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera::checkpoint {

namespace fs = std::filesystem;

namespace {

// Writes this rank's chunk of array number `array` (`value`, already in plan.layout) if it is the
// writer, and appends to `checksums` what the metadata needs of it: [array, chunk grid index...,
// CRC-32 of the file's bytes].
void write_chunk(const fs::path& array_dir, int64_t array, const DTensor& value, const detail::ChunkPlan& plan,
                 const SaveOptions& options, std::vector<int64_t>& checksums) {
  const DeviceMesh& mesh = value.device_mesh();
  if (!mesh.is_member()) return;
  const auto index = detail::chunk_index(plan, mesh.coordinate());
  if (!index) return;  // a replica, or an empty trailing piece
  const Tensor chunk = detail::padded_chunk(value.to_local(), plan.chunks);
  const std::string key = detail::chunk_key(*index);
  uint32_t crc = 0;
  if (options.zstd_level > 0) {
    const std::vector<char> stored = detail::zstd_compress(chunk.raw_data(), chunk.nbytes(), options.zstd_level);
    detail::write_file(array_dir / key, stored.data(), static_cast<int64_t>(stored.size()), false);
    crc = detail::crc32_of(stored.data(), static_cast<int64_t>(stored.size()));
  } else {
    detail::write_file(array_dir / key, chunk.raw_data(), chunk.nbytes(), false);
    crc = detail::crc32_of(chunk.raw_data(), chunk.nbytes());
  }
  checksums.push_back(array);
  checksums.insert(checksums.end(), index->begin(), index->end());
  checksums.push_back(crc);
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
  const fs::path target = detail::checkpoint_dir(dir);
  const fs::path staging = detail::staging_dir(target);
  const bool leader = rank() == 0;
  // A failure anywhere before the commit: the staged group goes, the previous checkpoint stays,
  // every rank throws the first failure.
  const auto abandon_if = [&](const std::string& failure) {
    if (failure.empty()) return;
    if (leader) {
      std::error_code ec;
      fs::remove_all(staging, ec);
    }
    world().barrier();
    TESSERA_CHECK(false, IoError, "checkpoint::save", failure, "; ", target.string(), " is unchanged");
  };

  // The arrays' names, in the order their numbers in the checksum words refer to.
  std::vector<std::string> names;
  for (const auto& entry : tensors) names.push_back(entry.first);
  std::string failure;
  if (leader) {  // the group's directories, made once (each rank only writes files into them)
    try {
      detail::prepare_staging(target, names);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  abandon_if(detail::first_failure(failure));

  // Each rank writes its chunks. A failure is recorded, not thrown, and the loop goes on with
  // the regathers alone (collectives): every rank runs the same collectives whatever fails, so
  // that none is left waiting in one and every rank learns the first failure from the exchange
  // below.
  std::vector<int64_t> checksums;
  std::map<std::string, Shape> chunk_shapes;  // for the metadata
  {
    const autograd::NoGradGuard no_grad;
    int64_t array = 0;
    for (const auto& [name, value] : tensors) {
      const int64_t number = array++;
      try {
        const detail::ChunkPlan plan = detail::chunk_plan(value.layout());
        chunk_shapes[name] = plan.chunks;
        const DTensor aligned =
            value.layout() == plan.layout ? value : value.redistribute(value.device_mesh(), plan.layout);
        if (!failure.empty()) continue;
        write_chunk(staging / name, number, aligned, plan, options, checksums);
        detail::save_fault_point();
      } catch (const std::exception& e) {
        if (failure.empty()) failure = e.what();
      }
    }
  }
  try {
    if (failure.empty() && options.sync_files) detail::sync_directory(staging, true);  // this rank's chunks, all at once
  } catch (const std::exception& e) {
    failure = e.what();
  }
  abandon_if(detail::first_failure(failure));
  // Every chunk's checksum, for the array's metadata: [array, grid index..., CRC-32] words.
  std::map<std::string, detail::ArrayMeta> arrays;
  for (const std::vector<int64_t>& words : tessera::detail::all_gather_int64(world(), checksums)) {
    for (size_t at = 0; at < words.size();) {
      const std::string& name = names.at(static_cast<size_t>(words[at++]));
      const size_t ndim = chunk_shapes.at(name).size();
      const std::vector<int64_t> index(words.begin() + static_cast<std::ptrdiff_t>(at),
                                       words.begin() + static_cast<std::ptrdiff_t>(at + ndim));
      at += ndim;
      arrays[name].checksums[detail::chunk_key(index)] = static_cast<uint32_t>(words.at(at++));
    }
  }

  // The arrays' metadata, spread over the ranks (array i by rank i mod n): where creating and
  // syncing a file costs a millisecond, one rank writing them all would take most of the save.
  failure.clear();
  try {
    int64_t i = 0;
    for (const auto& [name, value] : tensors) {
      if (i++ % world_size() != rank()) continue;
      detail::ArrayMeta& meta = arrays[name];
      meta.shape = value.shape();
      meta.dtype = value.dtype();
      meta.chunks = chunk_shapes.at(name);
      if (options.zstd_level > 0) meta.zstd_level = options.zstd_level;
      const std::string text = detail::array_json(meta);
      detail::write_file(staging / name / "zarr.json", text.data(), static_cast<int64_t>(text.size()), false);
    }
    if (options.sync_files) detail::sync_directory(staging, true);  // this rank's metadata and every directory entry
  } catch (const std::exception& e) {
    failure = e.what();
  }
  abandon_if(detail::first_failure(failure));

  // The commit, by rank 0. Once it has switched the new group in, the save has succeeded: what
  // fails after (syncing the parent, removing the previous checkpoint) is a warning.
  std::string outcome;  // "" committed; else "F" + the failure, or "C" + a crash the test made
  if (leader) {
    try {
      const std::string warning = detail::commit(target, options.sync_files);
      if (!warning.empty())
        std::cerr << "tessera: [checkpoint::save] " << target.string() << " is saved, but " << warning << "\n";
    } catch (const detail::SimulatedCrash& crash) {  // the process "died": nothing more happens on the disk
      outcome = "Cthe commit stopped before its file-system call " + std::to_string(crash.call) + " (fault injected by the test)";
    } catch (const std::exception& e) {
      outcome = std::string("F") + e.what();
      std::error_code ec;
      fs::remove_all(staging, ec);
    }
  }
  const std::string told = tessera::detail::all_gather_text(world(), outcome).front();  // rank 0's alone
  if (told.empty()) return;
  TESSERA_CHECK(told[0] != 'C', Error, "checkpoint::save", "rank 0 stopped: ", told.substr(1));
  TESSERA_CHECK(false, IoError, "checkpoint::save", "rank 0 failed: ", told.substr(1));
}

namespace detail {

namespace {

int64_t& fault_countdown() {
  thread_local int64_t countdown = -1;
  return countdown;
}

}  // namespace

void set_save_fault(int64_t chunks) { fault_countdown() = chunks; }

void save_fault_point() {
  int64_t& countdown = fault_countdown();
  if (countdown < 0) return;
  if (countdown-- == 0) {
    countdown = -1;
    TESSERA_CHECK(false, Error, "checkpoint::save", "fault injected by the test on rank ", rank());
  }
}

}  // namespace detail

}  // namespace tessera::checkpoint
