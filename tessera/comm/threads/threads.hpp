#pragma once
// The in-process backend: ranks are threads of one process sharing memory. A collective is a
// rendezvous: every rank posts its buffers, then each reads its peers' buffers directly (one
// copy per byte that must move). Waits spin briefly (not where the ranks outnumber the cores),
// then block, so ranks may outnumber cores.
#include <memory>
#include <string>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/comm/communicator.hpp>

namespace tessera TESSERA_API {
namespace threads {

/// Always true: the threads backend needs nothing outside the process.
bool is_available();

/// The world communicators of `nranks` in-process ranks: element r belongs to rank r and must
/// be used only by that rank's thread (and its async calls). Throws ValueError if nranks < 1.
std::vector<std::shared_ptr<Communicator>> make_world(int nranks);

/// The end of a rank's program (launch calls it): a call still waiting for this rank fails at
/// once naming it, instead of waiting for the timeout.
void end_of_program(const Communicator& world_comm);

/// Fails the world that `comm` belongs to: every blocked or later call on any of its groups
/// throws CommError naming `reason`. The first reason is kept.
void abort_world(const Communicator& comm, const std::string& reason);

}  // namespace threads
}  // namespace tessera
