#include <tessera/runtime/runtime.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <tessera/comm/mpi/mpi.hpp>
#include <tessera/comm/threads/threads.hpp>
#include <tessera/core/error.hpp>

namespace tessera {

namespace {

// rank_state()'s slots: shared by every thread of the rank (rank_thread), hence the lock.
struct RankState {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<void>, std::less<>> slots;
};

struct RankContext {
  int rank = -1;
  int world_size = 0;
  std::shared_ptr<Communicator> world;
  std::shared_ptr<const HostTopology> hosts;
  std::shared_ptr<RankState> state;
};

thread_local RankContext context;

// Sets this thread's rank context for the lifetime of the scope.
class ContextScope {
 public:
  ContextScope(int rank, int size, std::shared_ptr<Communicator> world, std::shared_ptr<const HostTopology> hosts) {
    context = {rank, size, std::move(world), std::move(hosts), std::make_shared<RankState>()};
  }
  ~ContextScope() { context = {}; }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
};

void require_rank(const char* op) {
  TESSERA_CHECK(context.world != nullptr, ValueError, op,
                "called outside a rank; run the code inside tessera::run or tessera::launch");
}

// Rethrows `error` as the same Tessera kind with `prefix` ("rank r failed: ") in front of its
// message.
[[noreturn]] void rethrow_on_caller(std::exception_ptr error, const std::string& prefix) {
  try {
    std::rethrow_exception(error);
  } catch (const ValueError& e) {
    throw ValueError(prefix + e.what());
  } catch (const ShardingError& e) {
    throw ShardingError(prefix + e.what());
  } catch (const CommError& e) {
    throw CommError(prefix + e.what());
  } catch (const InternalError& e) {
    throw InternalError(prefix + e.what());
  } catch (const std::exception& e) {
    throw Error(prefix + e.what());
  } catch (...) {
    throw Error(prefix + "a non-standard exception");
  }
}

std::string message_of(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "a non-standard exception";
  }
}

enum class Backend { threads, mpi };

Backend choose_backend() {
  if (const char* forced = std::getenv("TESSERA_BACKEND")) {
    const std::string_view value(forced);
    if (value == "mpi") return Backend::mpi;
    TESSERA_CHECK(value == "threads" || value.empty(), ValueError, "run", "TESSERA_BACKEND='", value,
                  "' is not a backend; expected threads or mpi");
    return Backend::threads;
  }
  return mpi::launched_by_mpirun() ? Backend::mpi : Backend::threads;
}

}  // namespace

int ranks_from_args(int argc, char** argv) {
  int ranks = 4;
  if (const char* env = std::getenv("TESSERA_RANKS")) ranks = std::atoi(env);
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    if (arg == "--ranks" && i + 1 < argc) ranks = std::atoi(argv[i + 1]);
    else if (arg.rfind("--ranks=", 0) == 0) ranks = std::atoi(argv[i] + std::strlen("--ranks="));
  }
  TESSERA_CHECK(ranks >= 1, ValueError, "run", "the number of ranks must be at least 1, got ", ranks,
                " (from --ranks or TESSERA_RANKS)");
  return ranks;
}

void launch(int nranks, std::function<void()> body) {
  TESSERA_CHECK(nranks >= 1, ValueError, "launch", "the number of ranks must be at least 1, got ", nranks);
  TESSERA_CHECK(!in_rank(), ValueError, "launch", "called from inside rank ", context.rank,
                "; nested launches are not supported");
  // One real host (this machine), unless TESSERA_HOSTS simulates several.
  char name[256] = "localhost";
  gethostname(name, sizeof(name) - 1);
  const auto hosts = std::make_shared<const HostTopology>(HostTopology::from_environment(
      nranks, HostTopology(std::vector<int>(static_cast<size_t>(nranks), 0), {name}, /*simulated=*/false)));
  const auto world = threads::make_world(nranks);
  std::mutex mutex;
  std::exception_ptr first_error;  // the first failure that is not a consequence of another
  int first_rank = -1;
  std::vector<std::string> messages(static_cast<size_t>(nranks));  // each rank's failure, if any
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      ContextScope scope(r, nranks, world[static_cast<size_t>(r)], hosts);
      try {
        body();
        world[static_cast<size_t>(r)]->synchronize();
        threads::end_of_program(*world[static_cast<size_t>(r)]);
      } catch (...) {
        const std::exception_ptr error = std::current_exception();
        std::lock_guard lock(mutex);
        messages[static_cast<size_t>(r)] = message_of(error);
        if (!first_error) {
          first_error = error;
          first_rank = r;
          threads::abort_world(*world[static_cast<size_t>(r)],
                               "rank " + std::to_string(r) + " failed: " + message_of(error));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!first_error) return;
  // Every rank threw the same (a check all ranks make alike): naming one of them would suggest
  // the others were fine.
  const bool alike = nranks > 1 && std::all_of(messages.begin(), messages.end(), [&](const std::string& m) {
                       return !m.empty() && m == messages.front();
                     });
  rethrow_on_caller(first_error, alike ? "every rank (" + std::to_string(nranks) + " of " + std::to_string(nranks) +
                                             ") failed alike: "
                                       : "rank " + std::to_string(first_rank) + " failed: ");
}

int run(int argc, char** argv, std::function<void()> body) {
  try {
    if (choose_backend() == Backend::mpi) {
      auto world = mpi::init(&argc, &argv);
      const int r = world->rank(), n = world->size();
      try {
        ContextScope scope(r, n, world, std::make_shared<const HostTopology>(mpi::host_topology()));
        body();
        world->synchronize();
        // Every rank ends together: a rank still waiting in a call on the world learns within
        // the desync grace period that this one ended, instead of after the timeout.
        mpi::end_of_program(*world);
      } catch (const std::exception& e) {
        mpi::abort(1, "rank " + std::to_string(r) + " failed: " + e.what());
      }
      world.reset();
      mpi::finalize();
      return 0;
    }
    launch(ranks_from_args(argc, argv), std::move(body));
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "tessera: " << e.what() << "\n";
    return 1;
  }
}

namespace {
// The calling rank's slot under `key` (made empty if new). The caller holds the rank's lock.
std::shared_ptr<void>& slot_locked(RankState& state, std::string_view key) {
  auto it = state.slots.find(key);
  if (it == state.slots.end()) it = state.slots.emplace(std::string(key), nullptr).first;
  return it->second;  // std::map: the slot stays put while others are added
}
}  // namespace

std::shared_ptr<void>& rank_state(std::string_view key) {
  require_rank("rank_state");
  RankState& state = *context.state;
  std::lock_guard lock(state.mutex);
  return slot_locked(state, key);
}

std::shared_ptr<void> rank_state(std::string_view key, const std::function<std::shared_ptr<void>()>& make) {
  require_rank("rank_state");
  RankState& state = *context.state;
  std::lock_guard lock(state.mutex);
  std::shared_ptr<void>& slot = slot_locked(state, key);
  if (!slot) slot = make();
  return slot;
}

std::thread rank_thread(std::function<void()> body) {
  require_rank("rank_thread");
  return std::thread([copy = context, body = std::move(body)]() mutable {
    context = std::move(copy);
    body();
    context = {};
  });
}

int rank() {
  require_rank("rank");
  return context.rank;
}

int world_size() {
  require_rank("world_size");
  return context.world_size;
}

bool in_rank() { return context.world != nullptr; }

Communicator& world() {
  require_rank("world");
  return *context.world;
}

std::shared_ptr<Communicator> world_ptr() {
  require_rank("world");
  return context.world;
}

const HostTopology& host_topology() {
  require_rank("host_topology");
  return *context.hosts;
}

int host_of(int world_rank) {
  require_rank("host_of");
  return context.hosts->host_of(world_rank);
}

int num_hosts() {
  require_rank("num_hosts");
  return context.hosts->num_hosts();
}

int rank_in_host() {
  require_rank("rank_in_host");
  return context.hosts->rank_in_host(context.rank);
}

}  // namespace tessera
