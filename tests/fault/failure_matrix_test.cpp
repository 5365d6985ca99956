// The failure matrix (issue 13): every fault of fault_program.cpp on every backend (rank threads;
// mpirun -np 2, 4, 8; 3 hosts of network namespaces), TESSERA_FAILURE_REPS times each (default 3; the figure uses 20).
// Each run must end the whole job with a non-zero exit, within the timeout + 10 s of the fault,
// with a message naming the faulty rank, and no rank may return from the faulty call. The
// control (no fault) must succeed. Prints one row per cell: the slowest time from fault to the
// job's end, and whether every message named the rank.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

constexpr double kTimeoutSeconds = 10;  // TESSERA_TIMEOUT_S of the runs
constexpr double kMarginSeconds = 10;   // the job must end within timeout + this after the fault

double unix_seconds() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

struct Outcome {
  int exit_code = 0;   // the exit status, or 128 + signal
  bool hung = false;   // killed by us after the deadline
  double seconds = 0;  // from the fault (or the start, without one) to the job's end
  std::string output;  // stdout and stderr together
};

// Runs argv with extra environment entries; kills its process group after `deadline` seconds.
Outcome run(const std::vector<std::string>& argv, const std::vector<std::string>& env, double deadline) {
  char path[] = "/tmp/tessera-fault-XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fd, 1);
  posix_spawn_file_actions_adddup2(&actions, fd, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);  // its own group: a hang is killed whole
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<std::string> environment;
  for (char** e = environ; *e; ++e) environment.emplace_back(*e);
  environment.insert(environment.end(), env.begin(), env.end());
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : environment) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const double start = unix_seconds();
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, cargv[0], &actions, &attr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  Outcome out;
  if (rc != 0) {
    close(fd);
    unlink(path);
    out.exit_code = -1;
    out.output = "spawn failed";
    return out;
  }
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (unix_seconds() - start > deadline) {
      out.hung = true;
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double end = unix_seconds();
  close(fd);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path);
  out.output = text.str();
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  double fault = start;
  const auto at = out.output.find("tessera-fault: injecting ");
  if (at != std::string::npos) {
    const auto time = out.output.find(" at ", at);
    if (time != std::string::npos) fault = std::atof(out.output.c_str() + time + 4);
  }
  out.seconds = end - fault;
  return out;
}

int repetitions() {
  const char* text = std::getenv("TESSERA_FAILURE_REPS");
  return text && std::atoi(text) > 0 ? std::atoi(text) : 3;
}

const std::vector<std::string> kScenarios = {"throw", "skip", "kind", "count", "dtype", "p2p"};

// One backend's row of the matrix: every scenario, `repetitions()` times. Backends: "threads",
// "mpi" (mpirun on this machine), "multi-host" (mpirun across network namespaces, 2 ranks per
// host, TCP only: scripts/multihost.sh).
void check_matrix(const std::string& backend, int ranks) {
  const bool threads = backend == "threads", multihost = backend == "multi-host";
  const auto command = [&](const std::string& scenario) {
    std::vector<std::string> argv;
#ifdef TESSERA_MPIEXEC
    if (backend == "mpi") argv = {TESSERA_MPIEXEC, "-np", std::to_string(ranks), "--oversubscribe"};
#endif
    if (multihost)
      argv = {TESSERA_MULTIHOST_SCRIPT, "run", "--hosts", std::to_string(ranks / 2), "--ranks-per-host", "2", "--"};
    argv.push_back(TESSERA_FAULT_PROGRAM);
    argv.push_back(scenario);
    if (threads) argv.insert(argv.end(), {"--ranks", std::to_string(ranks)});
    return argv;
  };
  const std::vector<std::string> env = {"TESSERA_TIMEOUT_S=" + std::to_string(static_cast<int>(kTimeoutSeconds)),
                                        "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                        "OMPI_MCA_rmaps_base_oversubscribe=1"};
  const double deadline = kTimeoutSeconds + 60;
  const std::string bad = "rank " + std::to_string(ranks - 1);
  {
    SCOPED_TRACE(backend + " " + std::to_string(ranks) + " ranks, no fault");
    const Outcome control = run(command("none"), env, deadline);
    EXPECT_EQ(control.exit_code, 0) << control.output;
  }
  for (const std::string& scenario : kScenarios) {
    SCOPED_TRACE(backend + " " + std::to_string(ranks) + " ranks, " + scenario);
    double slowest = 0;
    int named = 0, ended = 0;
    for (int rep = 0; rep < repetitions(); ++rep) {
      const Outcome o = run(command(scenario), env, deadline);
      slowest = std::max(slowest, o.seconds);
      EXPECT_FALSE(o.hung) << "the job did not end within " << deadline << " s:\n" << o.output;
      EXPECT_NE(o.exit_code, 0) << o.output;
      ended += !o.hung && o.exit_code != 0;
      EXPECT_LE(o.seconds, kTimeoutSeconds + kMarginSeconds) << o.output;
      const bool names = o.output.find(bad) != std::string::npos;
      named += names;
      EXPECT_TRUE(names) << "no message names " << bad << ":\n" << o.output;
      // The faulty call must not return anywhere (the skipping rank never made it).
      for (int r = 0; r < ranks; ++r) {
        if (scenario == "p2p" && r != 0 && r != ranks - 1) continue;  // not in the exchange
        const std::string completed = "tessera-fault: rank " + std::to_string(r) + " completed";
        EXPECT_EQ(o.output.find(completed), std::string::npos) << completed << " with a " << scenario << " fault:\n"
                                                               << o.output;
      }
    }
    std::printf("failure matrix | %-10s | np %d | %-5s | %2d/%2d runs ended non-zero | slowest %5.2f s fault->end | "
                "%2d/%2d name %s\n",
                backend.c_str(), ranks, scenario.c_str(), ended, repetitions(), slowest, named, repetitions(),
                bad.c_str());
    std::fflush(stdout);
  }
}

TEST(FailureMatrix, Threads) {
  for (int ranks : {2, 4, 8}) check_matrix("threads", ranks);
}

#ifdef TESSERA_MPIEXEC
TEST(FailureMatrix, MpirunNp2) { check_matrix("mpi", 2); }
TEST(FailureMatrix, MpirunNp4) { check_matrix("mpi", 4); }
TEST(FailureMatrix, MpirunNp8) { check_matrix("mpi", 8); }

// 3 hosts x 2 ranks over TCP, where this machine can make network namespaces: the faulty rank
// shares its host with one rank and not with the four others. (2 hosts x 2 ranks added nothing
// that this layout and the mpirun rows do not cover, for 140 s of CI time.)
TEST(FailureMatrix, MultiHost) {
  const Outcome can = run({TESSERA_MULTIHOST_SCRIPT, "check"}, {}, 30);
  if (can.exit_code != 0) GTEST_SKIP() << can.output;
  check_matrix("multi-host", 6);
}
#endif

}  // namespace
