#include <tessera/checkpoint/detail/files.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <tessera/checkpoint/checkpoint.hpp>
#include <tessera/checkpoint/detail/faults.hpp>
#include <tessera/checkpoint/detail/zarr.hpp>

namespace tessera::checkpoint::detail {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSave = "checkpoint::save";

// fsync (or syncfs) of a directory; 0 or the errno.
int sync_directory_errno(const fs::path& path, bool whole_file_system) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int synced = whole_file_system ? ::syncfs(fd) : ::fsync(fd);
  const int error = synced == 0 ? 0 : errno;
  ::close(fd);
  return error;
}

int rename_errno(const fs::path& from, const fs::path& to, unsigned int flags = 0) {
  const int renamed = flags ? ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags)
                            : ::rename(from.c_str(), to.c_str());
  return renamed == 0 ? 0 : errno;
}

// What renameat2 says when the file system (or the kernel) cannot exchange: then two renames.
bool exchange_unsupported(int error) { return error == EINVAL || error == ENOSYS || error == EOPNOTSUPP; }

struct FaultState {
  int64_t call = -1;
  CommitFault fault = CommitFault::fail;
  bool reached = false;
  bool exchange = true;
};

FaultState& fault_state() {
  thread_local FaultState state;
  return state;
}

// Counts a commit's file-system calls, for the test's fault (set_commit_fault); the fault applies
// to this commit only.
class Calls {
 public:
  Calls() : call_(fault_state().call), fault_(fault_state().fault) {
    fault_state().call = -1;
    fault_state().reached = false;
  }
  // Before each call: the errno the call is to fail with (0: make it), or the crash.
  int next() {
    if (count_++ != call_) return 0;
    fault_state().reached = true;
    if (fault_ == CommitFault::crash) throw SimulatedCrash{call_};
    return EIO;
  }

 private:
  int64_t call_;
  CommitFault fault_;
  int64_t count_ = 0;
};

}  // namespace

void write_file(const fs::path& path, const void* data, int64_t bytes, bool sync) {
  // write(2) straight from the tensor's memory: no stream buffer in between.
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  TESSERA_CHECK(fd >= 0, IoError, kSave, "cannot create ", path.string(), ": ", std::strerror(errno));
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t written = ::write(fd, p, static_cast<size_t>(bytes));
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      const int error = errno;
      ::close(fd);
      TESSERA_CHECK(false, IoError, kSave, "cannot write ", path.string(), ": ",
                    written < 0 ? std::strerror(error) : "no progress");
    }
    p += written;
    bytes -= written;
  }
  if (sync && ::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    TESSERA_CHECK(false, IoError, kSave, "cannot sync ", path.string(), ": ", std::strerror(error));
  }
  TESSERA_CHECK(::close(fd) == 0, IoError, kSave, "cannot write ", path.string(), ": ", std::strerror(errno));
}

void sync_directory(const fs::path& path, bool whole_file_system) {
  const int error = sync_directory_errno(path, whole_file_system);
  TESSERA_CHECK(error == 0, IoError, kSave, "cannot sync directory ", path.string(), ": ", std::strerror(error));
}

fs::path checkpoint_dir(const std::string& dir) {
  fs::path path(dir);
  while (!path.has_filename() && path.has_relative_path()) path = path.parent_path();
  return path;
}

fs::path staging_dir(const fs::path& dir) { return dir.string() + ".tessera-saving"; }

fs::path parked_dir(const fs::path& dir) { return dir.string() + ".tessera-old"; }

std::optional<fs::path> committed_dir(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(fs::status(dir, ec))) return dir;
  // Only a commit cut short between its two renames leaves no `dir` and a whole checkpoint here
  // (a partly removed one always has `dir` beside it).
  if (fs::is_directory(parked_dir(dir), ec)) return parked_dir(dir);
  return std::nullopt;
}

void prepare_staging(const fs::path& dir, const std::vector<std::string>& arrays) {
  const fs::path staging = staging_dir(dir), parked = parked_dir(dir);
  std::error_code ec;
  const fs::file_status target = fs::status(dir, ec);
  TESSERA_CHECK(!ec || ec == std::errc::no_such_file_or_directory, IoError, kSave, "cannot read ", dir.string(), ": ",
                ec.message());
  if (!fs::exists(target)) {
    if (fs::is_directory(parked, ec)) {  // a commit cut short between its renames: the previous checkpoint back first
      const int error = rename_errno(parked, dir);
      TESSERA_CHECK(error == 0, IoError, kSave, "cannot rename ", parked.string(), " (the checkpoint an interrupted save left) back to ",
                    dir.string(), ": ", std::strerror(error));
    }
  } else {
    TESSERA_CHECK(fs::is_directory(target), IoError, kSave, dir.string(), " exists and is not a directory; expected a checkpoint directory or nothing");
    fs::remove_all(parked, ec);  // what a two-rename commit had still to remove
    TESSERA_CHECK(!ec, IoError, kSave, "cannot remove ", parked.string(), " (left by an interrupted save): ", ec.message());
  }
  fs::remove_all(staging, ec);  // what an interrupted save left, or the previous checkpoint a commit had still to remove
  TESSERA_CHECK(!ec, IoError, kSave, "cannot remove ", staging.string(), " (left by an interrupted save): ", ec.message());
  fs::create_directory(staging, ec);
  TESSERA_CHECK(!ec, IoError, kSave, "cannot create directory ", staging.string(), ": ", ec.message());
  for (const std::string& name : arrays) {
    fs::create_directory(staging / name, ec);
    TESSERA_CHECK(!ec, IoError, kSave, "cannot create directory ", (staging / name).string(), ": ", ec.message());
  }
}

std::string commit(const fs::path& dir, bool sync) {
  const fs::path staging = staging_dir(dir), parked = parked_dir(dir);
  const std::string unchanged = "; " + dir.string() + " is unchanged";
  Calls calls;
  // The group's metadata goes last: until every rank's arrays are in, the staged group is no group.
  int error = calls.next();
  TESSERA_CHECK(error == 0, IoError, kSave, "cannot write ", (staging / "zarr.json").string(), ": ", std::strerror(error), unchanged);
  const std::string group = group_json();
  write_file(staging / "zarr.json", group.data(), static_cast<int64_t>(group.size()), sync);
  if (sync) {
    error = calls.next();
    if (error == 0) error = sync_directory_errno(staging, false);
    TESSERA_CHECK(error == 0, IoError, kSave, "cannot sync directory ", staging.string(), ": ", std::strerror(error), unchanged);
  }

  // The switch: one rename (exchange) on file systems that have it, so that `dir` always exists.
  std::error_code ec;
  fs::path previous;  // where the previous checkpoint is once the new one is in place
  if (!fs::exists(fs::status(dir, ec))) {
    error = calls.next();
    if (error == 0) error = rename_errno(staging, dir);
    TESSERA_CHECK(error == 0, IoError, kSave, "cannot rename ", staging.string(), " to ", dir.string(), ": ",
                  std::strerror(error), "; there is no checkpoint at ", dir.string());
  } else {
    error = EINVAL;
    if (fault_state().exchange) {
      error = calls.next();
      if (error == 0) error = rename_errno(staging, dir, RENAME_EXCHANGE);
      TESSERA_CHECK(error == 0 || exchange_unsupported(error), IoError, kSave, "cannot exchange ", staging.string(),
                    " and ", dir.string(), ": ", std::strerror(error), unchanged);
      previous = staging;
    }
    if (error != 0) {  // no RENAME_EXCHANGE here: two renames, the previous checkpoint parked between them
      error = calls.next();
      if (error == 0) error = rename_errno(dir, parked);
      TESSERA_CHECK(error == 0, IoError, kSave, "cannot rename ", dir.string(), " to ", parked.string(), ": ",
                    std::strerror(error), unchanged);
      error = calls.next();
      if (error == 0) error = rename_errno(staging, dir);
      if (error != 0) {
        int back = calls.next();
        if (back == 0) back = rename_errno(parked, dir);
        TESSERA_CHECK(false, IoError, kSave, "cannot rename ", staging.string(), " to ", dir.string(), ": ",
                      std::strerror(error),
                      back == 0 ? unchanged
                                : "; the previous checkpoint is at " + parked.string() + " (it cannot be renamed back: " +
                                      std::strerror(back) + "), where load and the next save find it");
      }
      previous = parked;
    }
  }

  // In place: what fails from here on is reported, not thrown (the save succeeded).
  std::string warning;
  if (sync) {
    const fs::path parent = fs::absolute(dir, ec).parent_path();
    error = calls.next();
    if (error == 0) error = ec ? ec.value() : sync_directory_errno(parent, false);
    if (error != 0)
      warning = "cannot sync directory " + parent.string() + " (the rename of " + dir.string() +
                " may not survive a power loss): " + std::strerror(error);
  }
  if (!previous.empty()) {
    ec.clear();
    error = calls.next();
    if (error == 0) fs::remove_all(previous, ec);
    if (error != 0 || ec)
      warning += (warning.empty() ? "" : "; ") + std::string("cannot remove the previous checkpoint, now at ") +
                 previous.string() + " (the next save removes it): " + (ec ? ec.message() : std::strerror(error));
  }
  return warning;
}

void set_commit_fault(int64_t call, CommitFault fault) {
  fault_state().call = call;
  fault_state().fault = fault;
}

bool commit_fault_reached() { return fault_state().reached; }

void set_rename_exchange(bool enabled) { fault_state().exchange = enabled; }

}  // namespace checkpoint::detail
