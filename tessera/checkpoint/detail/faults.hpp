#pragma once
// Tests only: the faults a test makes a save meet, to check that a failed or interrupted save
// leaves the previous checkpoint whole and every rank told. Each is the calling thread's (a rank's).
#include <cstdint>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {
namespace checkpoint::detail {

/// The calling rank's save throws after writing `chunks` more arrays' chunks (negative: never).
void set_save_fault(int64_t chunks);
/// Where save meets that fault: after each array's chunk.
void save_fault_point();

/// What happens at a commit's file-system call.
enum class CommitFault {
  crash,  // the commit stops before the call, as a killed process would: throws SimulatedCrash
  fail,   // the call fails with EIO
};
/// Thrown by a crash fault. Not a std::exception, so that no error path of the commit runs.
struct SimulatedCrash {
  int64_t call;
};
/// The calling thread's next commit meets `fault` at its file-system call number `call` (0: the
/// first; negative: none).
void set_commit_fault(int64_t call, CommitFault fault);
/// Whether the calling thread's last commit met the fault set before it (false: it made fewer
/// calls, or none was set).
bool commit_fault_reached();
/// Off: the calling thread's commits use the two-rename commit, as on a file system without
/// RENAME_EXCHANGE.
void set_rename_exchange(bool enabled);

}  // namespace checkpoint::detail
}  // namespace tessera
