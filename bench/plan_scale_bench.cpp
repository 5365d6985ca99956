// The planner at scale (issue 34): plan() on meshes of 8 to 16,384 ranks, 1-d to 4-d, for the
// common pairs (S <-> R, S(i) -> S(j), P -> R, P -> S, mixed multi-dim) on an even and an uneven
// tensor, and the first dispatch of matmul, add of a Partial and layer_norm on those meshes. All
// pure: layouts over a MeshSpec, no ranks, one thread.
//
// The cases come from bench/peers/plan_pairs.json, which bench/peers/torch_planner.py reads too
// (make bench-peers prints PyTorch's planner on the same pairs and the ratio).
//
// Per plan: the first plan's time, the median of --repeats more (they stop early once their sum
// passes the cap), the peak of the bytes allocated during the first plan over what was live
// before it, the bytes the returned Plan keeps, the steps, and the busiest rank's received bytes
// over plan_lower_bound (n/a for a Partial destination or a zero bound).
// Per op: the first dispatch with the process's plan cache cleared, mirroring the dispatcher's
// miss (see first_dispatch).
// Goals (reported, never asserted): every plan under 1 ms, every first dispatch under 5 ms,
// memory per plan independent of the rank count, bytes / bound unchanged.
//
// Cases run in a forked worker process so that a planner taking minutes on a large mesh can be
// stopped: a first plan (or dispatch) not done within --cap-s is killed, printed as stopped, and
// the larger meshes of that pair and tensor (or that op) with as many mesh dims are skipped.
//
// Usage: tessera_plan_scale_bench [--pairs plan_pairs.json] [--max-ranks 16384] [--mesh 8x8x8 ...]
//        [--ndims 1,2] [--tensors even,uneven] [--family "P -> R"] [--repeats 5] [--cap-s 2]
//        [--no-dispatch | --dispatch-only] [--json PATH]
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <tessera/dtensor/dispatch.hpp>
#include <tessera/tessera.hpp>

// ---- allocation counting --------------------------------------------------------------------
// Replacing the global operator new in the executable also catches the library's allocations
// (the shared library's calls bind to the executable's definition), so the peak of live bytes
// during one plan is the planner's working memory, whatever containers it uses.
namespace {
std::atomic<int64_t> live_bytes{0};
std::atomic<int64_t> peak_bytes{0};

void note_alloc(void* p) {
  if (!p) return;
  const int64_t now = live_bytes.fetch_add(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed) +
                      static_cast<int64_t>(malloc_usable_size(p));
  int64_t peak = peak_bytes.load(std::memory_order_relaxed);
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
void note_free(void* p) {
  if (p) live_bytes.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
}
void* counted_alloc(std::size_t size, std::size_t align = 0) {
  void* p = nullptr;
  if (align > alignof(std::max_align_t)) {
    if (posix_memalign(&p, align, size == 0 ? 1 : size) != 0) p = nullptr;
  } else {
    p = std::malloc(size == 0 ? 1 : size);
  }
  note_alloc(p);
  return p;
}
// Out of line: inlined into a replaced operator delete, GCC would see free() on memory from
// operator new and warn (-Wmismatched-new-delete) although this new allocates with malloc.
[[gnu::noinline]] void counted_free(void* p) {
  note_free(p);
  std::free(p);
}
}  // namespace

void* operator new(std::size_t size) {
  if (void* p = counted_alloc(size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return operator new(size); }
void* operator new(std::size_t size, std::align_val_t align) {
  if (void* p = counted_alloc(size, static_cast<std::size_t>(align))) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size, std::align_val_t align) { return operator new(size, align); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return counted_alloc(size); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return counted_alloc(size); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using namespace tessera;

struct Options {
  std::string pairs = TESSERA_PLAN_PAIRS_JSON;
  int64_t max_ranks = 16384;
  std::vector<std::string> meshes;  // "8x8x8"; empty: every mesh of the file
  std::vector<int> ndims;
  std::vector<std::string> tensors = {"even", "uneven"};
  std::string family;
  int repeats = 5;
  double cap_s = 2.0;
  bool dispatch = true;
  bool plans = true;
  std::string json_path;
};

struct PairSpec {
  std::string family;
  std::string src_text, dst_text;  // as the file spells them: torch_planner.py's rows match on them
  Placements src, dst;
};

struct DispatchSpec {
  Placements x, w, partial;
};

struct Config {
  DType dtype = DType::f32;
  std::vector<std::pair<std::string, Shape>> tensors;
  std::vector<Shape> meshes;
  std::vector<PairSpec> pairs;
  std::vector<DispatchSpec> dispatch;  // index: mesh dims - 1
};

Config read_config(const Options& options) {
  std::ifstream in(options.pairs);
  TESSERA_CHECK(in.good(), ValueError, "tessera_plan_scale_bench", "cannot read the pair list ", options.pairs,
                "; expected bench/peers/plan_pairs.json (pass --pairs PATH)");
  const json doc = json::parse(in);
  Config config;
  config.dtype = dtype_from_string(doc.at("dtype").get<std::string>());
  for (const std::string& name : options.tensors) {
    TESSERA_CHECK(doc.at("tensors").contains(name), ValueError, "tessera_plan_scale_bench", "unknown tensor '", name,
                  "'; expected one of ", doc.at("tensors").dump());
    config.tensors.emplace_back(name, Shape(doc.at("tensors").at(name).get<std::vector<int64_t>>()));
  }
  for (const json& m : doc.at("meshes")) config.meshes.emplace_back(m.get<std::vector<int64_t>>());
  for (const json& p : doc.at("pairs")) {
    const std::string src = p.at("src").get<std::string>(), dst = p.at("dst").get<std::string>();
    config.pairs.push_back({p.at("family").get<std::string>(), src, dst, parse_placements(src), parse_placements(dst)});
  }
  for (const json& d : doc.at("dispatch"))
    config.dispatch.push_back({parse_placements(d.at("x").get<std::string>()),
                               parse_placements(d.at("w").get<std::string>()),
                               parse_placements(d.at("partial").get<std::string>())});
  return config;
}

std::string mesh_text(const Shape& shape) {
  std::string text;
  for (int64_t d = 0; d < shape.size(); ++d) text.append(d ? "x" : "").append(std::to_string(shape[d]));
  return text;
}

MeshSpec mesh_spec(const Shape& shape) {
  static const std::vector<std::string> all_names = {"a", "b", "c", "d", "e", "f"};
  TESSERA_CHECK(shape.size() >= 1 && shape.size() <= static_cast<int64_t>(all_names.size()), ValueError,
                "tessera_plan_scale_bench", "mesh ", shape.to_string(), " has ", shape.size(), " dims; expected 1 to ",
                all_names.size());
  return MeshSpec(shape, std::vector<std::string>(all_names.begin(), all_names.begin() + shape.size()));
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// --cpu-time: plans and dispatches are timed by the CPU time of the thread that runs them, which
// other work on a busy machine does not inflate (the wall clock counts the time it waits).
bool time_cpu = false;

double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

// A stopwatch on the clock the options chose.
struct Stopwatch {
  Clock::time_point wall = Clock::now();
  double cpu = time_cpu ? thread_cpu_ms() : 0;
  double ms() const { return time_cpu ? thread_cpu_ms() - cpu : ms_since(wall); }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

// ---- cases in a worker process ------------------------------------------------------------
// A forked worker runs the cases in order and writes one JSON object per line, each tagged with
// its case's index; the parent reads them with deadlines. A case whose first line (its first plan
// or dispatch) is not in within the cap is stopped: the worker is killed and a new one forked for
// the cases after it. One worker for many cases, warmed up once, so that a case's first plan pays
// neither the fork's copy-on-write faults nor the first calls' symbol binding.
struct Job {
  std::string skip_key;              // a stopped case skips the later cases with the same key
  json row;                          // what the case is (mesh, ranks, pair or op, ...)
  std::function<void()> work;        // runs in the worker, emit()s the case's fields
};

struct Outcome {
  enum class Status { ok, partial, stopped, skipped, error } status = Status::ok;
  json fields = json::object();
  std::string error;
};

int emit_fd = -1;       // in a worker: the pipe to the parent
int64_t emit_job = -1;  // in a worker: the case running

void emit(json line) {
  line["job"] = emit_job;
  const std::string text = line.dump() + "\n";
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = write(emit_fd, text.data() + done, text.size() - done);
    if (n <= 0) _exit(1);  // the parent is gone
    done += static_cast<size_t>(n);
  }
}

Clock::time_point after_s(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

class Worker {
 public:
  ~Worker() { stop(); }
  bool alive() const { return pid_ > 0; }

  /// Forks a worker running `warm_up`, then jobs[from..] except those whose key is in `skipped`.
  void start(const std::vector<Job>& jobs, size_t from, const std::set<std::string>& skipped,
             const std::function<void()>& warm_up) {
    int fds[2];
    TESSERA_CHECK(pipe(fds) == 0, InternalError, "tessera_plan_scale_bench", "pipe() failed");
    std::fflush(stdout);
    pid_ = fork();
    TESSERA_CHECK(pid_ >= 0, InternalError, "tessera_plan_scale_bench", "fork() failed");
    if (pid_ == 0) {
      close(fds[0]);
      emit_fd = fds[1];
      warm_up();
      emit({{"ready", true}});
      for (size_t j = from; j < jobs.size(); ++j) {
        if (skipped.count(jobs[j].skip_key)) continue;
        emit_job = static_cast<int64_t>(j);
        try {
          jobs[j].work();
        } catch (const std::exception& e) {
          emit({{"error", e.what()}});
        }
        emit({{"end", true}});
      }
      _exit(0);
    }
    close(fds[1]);
    fd_ = fds[0];
  }

  enum class Read { line, timeout, eof };
  /// The next line, waiting until `deadline`.
  Read next(Clock::time_point deadline, json& line) {
    for (;;) {
      if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
        line = json::parse(buffer_.substr(0, nl));
        buffer_.erase(0, nl + 1);
        return Read::line;
      }
      const double left_ms = std::chrono::duration<double, std::milli>(deadline - Clock::now()).count();
      pollfd p{fd_, POLLIN, 0};
      if (left_ms <= 0 || poll(&p, 1, static_cast<int>(std::ceil(left_ms))) == 0) return Read::timeout;
      char chunk[4096];
      const ssize_t n = read(fd_, chunk, sizeof chunk);
      if (n <= 0) return Read::eof;
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

  void stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    close(fd_);
    pid_ = -1;
    fd_ = -1;
    buffer_.clear();
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buffer_;
};

/// Runs every job (in workers) and hands each outcome to `report`, in order.
void run_jobs(const std::vector<Job>& jobs, double cap_s, const std::function<void()>& warm_up,
              const std::function<void(const Job&, const Outcome&)>& report) {
  const double later_s = 2 * cap_s + 5;  // the repeats stop at the cap; the bound is cheap
  std::set<std::string> skipped;
  Worker worker;
  for (size_t j = 0; j < jobs.size(); ++j) {
    Outcome outcome;
    if (skipped.count(jobs[j].skip_key)) {
      outcome.status = Outcome::Status::skipped;
      report(jobs[j], outcome);
      continue;
    }
    json line;
    if (!worker.alive()) {
      worker.start(jobs, j, skipped, warm_up);
      if (worker.next(after_s(later_s), line) != Worker::Read::line || !line.contains("ready")) {
        worker.stop();
        outcome.status = Outcome::Status::error;
        outcome.error = "the worker did not start";
        report(jobs[j], outcome);
        continue;
      }
    }
    bool first = true, restart = false;
    for (auto deadline = after_s(cap_s);;) {
      const Worker::Read got = worker.next(deadline, line);
      if (got != Worker::Read::line) {
        worker.stop();
        if (got == Worker::Read::eof) {
          outcome.status = Outcome::Status::error;
          outcome.error = "the worker died";
        } else {
          outcome.status = first ? Outcome::Status::stopped : Outcome::Status::partial;
          if (first) skipped.insert(jobs[j].skip_key);
        }
        break;
      }
      TESSERA_CHECK(line.value("job", int64_t{-1}) == static_cast<int64_t>(j), InternalError,
                    "tessera_plan_scale_bench", "case ", j, " got the line of another: ", line.dump());
      if (line.contains("end")) break;
      if (line.contains("error")) {
        outcome.status = Outcome::Status::error;
        outcome.error = line["error"].get<std::string>();
      }
      line.erase("job");
      outcome.fields.update(line);
      if (first && line.contains("first_ms")) {
        first = false;
        deadline = after_s(later_s);
        // The worker may have run ahead of the parent's clock: its own time decides as well, and
        // a new worker (forked after this case) leaves the skipped cases out.
        if (line["first_ms"].get<double>() > cap_s * 1e3) {
          skipped.insert(jobs[j].skip_key);
          restart = true;
        }
      }
    }
    if (restart) worker.stop();
    report(jobs[j], outcome);
  }
}

// Runs `once` (one plan or one dispatch, returning its own fields) and times it: the first call
// with its peak memory, then up to `repeats` more while their sum stays under the cap. `reset`
// runs untimed before each call; `describe`, untimed after the first, adds the fields that take
// work of their own to find (a plan's busiest rank visits its steps' classes of ranks).
void measure(int repeats, double cap_s, const std::function<json(bool first)>& once,
             const std::function<void()>& reset = [] {}, const std::function<json()>& describe = [] { return json(); }) {
  reset();
  const int64_t before = live_bytes.load();
  peak_bytes.store(before);
  Stopwatch watch;
  json fields = once(true);
  const double first_ms = watch.ms();
  fields["first_ms"] = first_ms;
  fields["peak_bytes"] = peak_bytes.load() - before;
  const json described = describe();
  for (const auto& [key, value] : described.items()) fields[key] = value;
  emit(fields);
  std::vector<double> times;
  double spent_ms = 0;
  for (int r = 0; r < repeats && spent_ms < cap_s * 1e3; ++r) {
    reset();
    watch = Stopwatch{};
    once(false);
    times.push_back(watch.ms());
    spent_ms += times.back();
  }
  emit({{"median_ms", times.empty() ? first_ms : median(times)}, {"repeats", times.size()}});
}

// ---- plans ---------------------------------------------------------------------------------
void plan_case(const Layout& src, const Layout& dst, const Options& options) {
  std::optional<Plan> first_plan;
  measure(
      options.repeats, options.cap_s,
      [&](bool first) {
        const int64_t before = live_bytes.load();
        Plan p = plan(src, dst);
        if (!first) return json();
        const int64_t kept = live_bytes.load() - before;
        first_plan = std::move(p);
        return json{{"plan_bytes", kept}};
      },
      [] {},
      [&] {
        return json{{"steps", first_plan->steps.size()},
                    {"max_bytes_received", first_plan->max_bytes_received()},
                    {"estimated_us", first_plan->estimated_us}};
      });
  const Stopwatch watch;
  const int64_t bound = plan_lower_bound(src, dst);
  emit({{"lower_bound", bound}, {"bound_ms", watch.ms()}});
}

// ---- first dispatch ------------------------------------------------------------------------
// What the dispatcher's miss does for these inputs, without ranks: decide() in
// tessera/dtensor/dispatch.cpp. The op's rule proposes strategies; cheapest_proposal prices them
// with plan_cost_lower_bound first and cached_plan(...)->cost for those it cannot rule out
// (options plan_options(true): a Partial destination allowed; outside a rank the threads cost
// model); the chosen strategy's moved inputs get their (now cached) plans, and every chosen
// layout its block at the calling rank's coordinate (here the first rank's). The plan cache is
// cleared first, as on the first call of a process.
struct Chosen {
  std::string strategy;
  int moved = 0;
};

Chosen first_dispatch(OpId op, const std::vector<const Layout*>& inputs, const OpArgs& args) {
  const auto rule = rule_registry().rule(RuleRegistry::id(op));
  TESSERA_CHECK(rule != nullptr, ShardingError, "tessera_plan_scale_bench", "no rule for ", op_name(op));
  std::vector<OpProposal> proposals = (*rule)(inputs, args);
  const PlanOptions options = plan_options(true);
  const auto cost = [&](const Layout& from, const Layout& to) { return cached_plan(from, to, options)->cost; };
  const auto bound = [&](const Layout& from, const Layout& to) { return plan_cost_lower_bound(from, to, options); };
  const OpProposal& chosen = proposals[cheapest_proposal(proposals, inputs, cost, op_name(op), bound)];
  const std::vector<int64_t> coordinate(static_cast<size_t>(inputs.front()->mesh().ndim()), 0);
  Chosen out;
  int64_t elements = 0;  // keeps the block computations observable
  for (size_t i = 0; i < inputs.size(); ++i) {
    elements += chosen.inputs[i].block(coordinate).numel();
    if (!(chosen.inputs[i] == *inputs[i])) {
      cached_plan(*inputs[i], chosen.inputs[i], options);
      ++out.moved;
    }
  }
  elements += chosen.output.block(coordinate).numel();
  out.strategy = tessera::to_string(chosen.output.placements()) + (elements < 0 ? "?" : "");
  return out;
}

void dispatch_case(OpId op, const std::vector<const Layout*>& inputs, const OpArgs& args, const Options& options) {
  measure(
      options.repeats, options.cap_s,
      [&](bool first) {
        const uint64_t plans = plan_call_count();
        const Chosen chosen = first_dispatch(op, inputs, args);
        if (!first) return json();
        return json{{"plans", plan_call_count() - plans}, {"output", chosen.strategy}, {"moved_inputs", chosen.moved}};
      },
      [] { clear_plan_cache(); });
}

// ---- printing ------------------------------------------------------------------------------
std::string kib(const json& f, const char* key) {
  return f.contains(key) ? std::to_string((f[key].get<int64_t>() + 1023) / 1024) : "-";
}
std::string ms(const json& f, const char* key) {
  if (!f.contains(key)) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", f[key].get<double>());
  return text;
}

struct Slowest {
  double ms = -1;
  std::string what;
  int over = 0, stopped = 0, skipped = 0, errors = 0, done = 0;
  void note(double t, const std::string& text, double goal_ms) {
    ++done;
    if (t > goal_ms) ++over;
    if (t > ms) ms = t, what = text;
  }
  void summary(const char* kind, double goal_ms, double cap_s) const {
    if (ms < 0)
      std::printf("slowest %s: none ran; ", kind);
    else
      std::printf("slowest %s: %.3f ms (%s); ", kind, ms, what.c_str());
    const bool all = over == 0 && stopped == 0 && skipped == 0 && errors == 0 && done > 0;
    std::printf("every %s under %g ms: %s", kind, goal_ms, all ? "yes" : "no");
    if (!all)
      std::printf(" (%d of %d done over it, %d stopped at the %g s cap, %d skipped after one, %d errors)", over, done,
                  stopped, cap_s, skipped, errors);
    std::printf("\n");
  }
};

// The first plan and dispatch of a worker, untimed: binds the library's symbols and touches the
// allocator's pages, which every later case would otherwise pay on its first call.
void warm_up() {
  const MeshSpec mesh(Shape{2, 2}, {"a", "b"});
  const Layout src(Shape{8, 8}, DType::f32, mesh, {Shard{0}, Partial{}});
  const Layout dst(Shape{8, 8}, DType::f32, mesh, {Replicate{}, Shard{1}});
  const Layout w(Shape{8, 8}, DType::f32, mesh, {Replicate{}, Replicate{}});
  plan(src, dst);
  plan_lower_bound(src, dst);
  first_dispatch(OpId::matmul, {&dst, &w}, OpArgs{});
  first_dispatch(OpId::add, {&src, &dst}, ElementwiseArgs{});
  clear_plan_cache();
}

std::string status_text(Outcome::Status status) {
  switch (status) {
    case Outcome::Status::ok: return "ok";
    case Outcome::Status::partial: return "partial";
    case Outcome::Status::stopped: return "stopped";
    case Outcome::Status::skipped: return "skipped";
    case Outcome::Status::error: return "error";
  }
  return "?";
}

// The columns every row starts with, or the whole line when the case did not finish. True when
// it finished (the caller prints the rest).
bool print_head(const char* format, const Job& job, const std::string& what, const Outcome& o, double cap_s,
                Slowest& slowest) {
  const Shape mesh(job.row["mesh"].get<std::vector<int64_t>>());
  std::printf(format, mesh_text(mesh).c_str(), static_cast<long long>(mesh.numel()), what.c_str());
  switch (o.status) {
    case Outcome::Status::skipped:
      ++slowest.skipped;
      std::printf(" %10s\n", "skipped");
      return false;
    case Outcome::Status::stopped:
      ++slowest.stopped;
      std::printf(" %9s%g s: stopped, larger meshes skipped\n", "> ", cap_s);
      return false;
    case Outcome::Status::error:
      ++slowest.errors;
      std::printf(" error: %s\n", o.error.c_str());
      return false;
    default:
      return true;
  }
}

void run(const Options& options) {
  const Config config = read_config(options);
  rule_registry();  // builds the built-in rules once, before any worker forks
  warm_up();        // binds the symbols once in the parent, so that workers inherit them bound

  std::vector<Shape> meshes;
  for (const Shape& m : config.meshes) {
    const bool named = options.meshes.empty() ||
                       std::find(options.meshes.begin(), options.meshes.end(), mesh_text(m)) != options.meshes.end();
    const bool dims = options.ndims.empty() ||
                      std::find(options.ndims.begin(), options.ndims.end(), m.size()) != options.ndims.end();
    if (named && dims && m.numel() <= options.max_ranks) meshes.push_back(m);
  }
  std::stable_sort(meshes.begin(), meshes.end(), [](const Shape& a, const Shape& b) {
    return a.size() != b.size() ? a.size() < b.size() : a.numel() < b.numel();
  });

  json rows = json::array(), dispatch_rows = json::array();
  Slowest plans, dispatches;
  const auto record = [](json& into, const Job& job, const Outcome& o) {
    json row = job.row;
    row.update(o.fields);
    row["status"] = status_text(o.status);
    if (!o.error.empty()) row["error"] = o.error;
    into.push_back(row);
    return row;
  };

  if (options.plans) {
    std::vector<Job> jobs;
    for (const Shape& m : meshes) {
      const MeshSpec spec = mesh_spec(m);
      for (const auto& [tensor, shape] : config.tensors) {
        for (size_t i = 0; i < config.pairs.size(); ++i) {
          const PairSpec& pair = config.pairs[i];
          if (static_cast<int64_t>(pair.src.size()) != m.size()) continue;
          if (!options.family.empty() && pair.family != options.family) continue;
          auto src = std::make_shared<const Layout>(shape, config.dtype, spec, pair.src);
          auto dst = std::make_shared<const Layout>(shape, config.dtype, spec, pair.dst);
          jobs.push_back({std::to_string(i) + "/" + tensor,
                          {{"mesh", m.vec()}, {"ranks", m.numel()}, {"tensor", tensor}, {"family", pair.family},
                           {"src", pair.src_text}, {"dst", pair.dst_text},
                           {"pair", to_string(pair.src) + " -> " + to_string(pair.dst)},
                           {"partial_destination", dst->has_partial()}},
                          [src, dst, &options] { plan_case(*src, *dst, options); }});
        }
      }
    }
    std::printf("plan() on meshes of up to %lld ranks, %s, one thread; first plan, then the median of up to %d more;\n"
                "peak: bytes allocated during the first plan over those live before; plan: bytes the Plan keeps;\n"
                "recv/bound: max_bytes_received / plan_lower_bound. A first plan over %g s is stopped and the pair's\n"
                "larger meshes skipped.\n\n",
                static_cast<long long>(options.max_ranks), std::string(name(config.dtype)).c_str(), options.repeats,
                options.cap_s);
    std::printf("%-12s %6s %-68s %10s %10s %10s %9s %5s %10s\n", "mesh", "ranks", "tensor  pair", "first ms",
                "median ms", "peak KiB", "plan KiB", "steps", "recv/bound");
    run_jobs(jobs, options.cap_s, warm_up, [&](const Job& job, const Outcome& o) {
      json row = record(rows, job, o);
      const std::string tensor = row["tensor"].get<std::string>(), pair = row["pair"].get<std::string>();
      char what[160];
      std::snprintf(what, sizeof what, "%-7s %s", tensor.c_str(), pair.c_str());
      if (!print_head("%-12s %6lld %-68s", job, what, o, options.cap_s, plans)) return;
      const json& f = o.fields;
      std::string ratio = "n/a";
      if (f.value("lower_bound", int64_t{0}) > 0 && !row["partial_destination"].get<bool>()) {
        const double value = static_cast<double>(f["max_bytes_received"].get<int64_t>()) /
                             static_cast<double>(f["lower_bound"].get<int64_t>());
        rows.back()["ratio"] = value;
        char text[32];
        std::snprintf(text, sizeof text, "%.2f", value);
        ratio = text;
      }
      plans.note(f["first_ms"].get<double>(),
                 mesh_text(Shape(row["mesh"].get<std::vector<int64_t>>())) + " " + tensor + " " + pair, 1.0);
      std::printf(" %10s %10s %10s %9s %5lld %10s\n", ms(f, "first_ms").c_str(), ms(f, "median_ms").c_str(),
                  kib(f, "peak_bytes").c_str(), kib(f, "plan_bytes").c_str(),
                  static_cast<long long>(f.value("steps", int64_t{-1})), ratio.c_str());
    });
    std::printf("\n");
    plans.summary("plan", 1.0, options.cap_s);
  }

  if (options.dispatch) {
    const Shape shape = config.tensors.front().second;  // x [M, K], w [K, N], y [M, K]
    const Shape w_shape{shape[1], shape[1]}, norm_shape{shape[1]};
    std::vector<Job> jobs;
    for (const Shape& m : meshes) {
      if (m.size() > static_cast<int64_t>(config.dispatch.size())) continue;
      const DispatchSpec& d = config.dispatch[static_cast<size_t>(m.size() - 1)];
      const MeshSpec spec = mesh_spec(m);
      const Placements replicated(static_cast<size_t>(m.size()), Replicate{});
      auto x = std::make_shared<const Layout>(shape, config.dtype, spec, d.x);
      auto w = std::make_shared<const Layout>(w_shape, config.dtype, spec, d.w);
      auto y = std::make_shared<const Layout>(shape, config.dtype, spec, d.partial);
      auto gamma = std::make_shared<const Layout>(norm_shape, config.dtype, spec, replicated);
      struct OpCase {
        const char* label;
        OpId op;
        std::vector<std::shared_ptr<const Layout>> inputs;
        OpArgs args;
        std::string text;  // the inputs that are not replicated
      };
      const std::vector<OpCase> ops = {
          {"matmul", OpId::matmul, {x, w}, OpArgs{}, to_string(d.x) + " " + to_string(d.w)},
          {"add(P)", OpId::add, {x, y}, ElementwiseArgs{}, to_string(d.x) + " " + to_string(d.partial)},
          {"layer_norm", OpId::layer_norm, {y, gamma, gamma}, NormArgs{1}, to_string(d.partial)}};
      for (const OpCase& c : ops) {
        jobs.push_back({std::string("dispatch/") + c.label + "/" + std::to_string(m.size()),
                        {{"mesh", m.vec()}, {"ranks", m.numel()}, {"op", c.label}, {"inputs", c.text}},
                        [c, &options] {
                          std::vector<const Layout*> inputs;
                          for (const auto& l : c.inputs) inputs.push_back(l.get());
                          dispatch_case(c.op, inputs, c.args, options);
                        }});
      }
    }
    std::printf("\nfirst dispatch (rule, strategy pricing and plans; plan cache cleared; no ranks), %s tensor %s:\n"
                "matmul x @ w, add x + y (y Partial), layer_norm(y) over the last dim with weight and bias R\n\n",
                config.tensors.front().first.c_str(), shape.to_string().c_str());
    std::printf("%-12s %6s %-58s %10s %10s %10s %6s %s\n", "mesh", "ranks", "op          inputs", "first ms",
                "median ms", "peak KiB", "plans", "output");
    run_jobs(jobs, options.cap_s, warm_up, [&](const Job& job, const Outcome& o) {
      json row = record(dispatch_rows, job, o);
      char what[128];
      std::snprintf(what, sizeof what, "%-11s %s", row["op"].get<std::string>().c_str(),
                    row["inputs"].get<std::string>().c_str());
      if (!print_head("%-12s %6lld %-58s", job, what, o, options.cap_s, dispatches)) return;
      const json& f = o.fields;
      dispatches.note(f["first_ms"].get<double>(),
                      mesh_text(Shape(row["mesh"].get<std::vector<int64_t>>())) + " " + row["op"].get<std::string>(),
                      5.0);
      std::printf(" %10s %10s %10s %6lld %s\n", ms(f, "first_ms").c_str(), ms(f, "median_ms").c_str(),
                  kib(f, "peak_bytes").c_str(), static_cast<long long>(f.value("plans", int64_t{-1})),
                  f.value("output", "").c_str());
    });
    std::printf("\n");
    dispatches.summary("first dispatch", 5.0, options.cap_s);
  }
  if (!options.json_path.empty()) {
    std::ofstream(options.json_path) << json{{"cap_s", options.cap_s}, {"plans", rows}, {"dispatch", dispatch_rows}}
                                            .dump(2);
    std::printf("json: %s\n", options.json_path.c_str());
  }
  if (options.plans && (options.dispatch || !options.json_path.empty()))
    plans.summary("plan", 1.0, options.cap_s);  // the last line
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  bool no_dispatch = false, dispatch_only = false;
  CLI::App app{"Tessera's planner at scale: plan() and the first op dispatch on meshes of up to 16,384 ranks"};
  app.add_option("--pairs", options.pairs, "the pair list (bench/peers/plan_pairs.json)");
  app.add_option("--max-ranks", options.max_ranks, "skip meshes of more ranks")->check(CLI::PositiveNumber);
  app.add_option("--mesh", options.meshes, "only these meshes of the file, e.g. 8x8x8 (repeatable)");
  app.add_option("--ndims", options.ndims, "only meshes of these dims, e.g. 1,3")->delimiter(',');
  app.add_option("--tensors", options.tensors, "tensor shapes of the file: even, uneven")->delimiter(',');
  app.add_option("--family", options.family, "only this pair family, e.g. \"P -> R\"");
  app.add_option("--repeats", options.repeats, "timed plans after the first")->check(CLI::NonNegativeNumber);
  app.add_option("--cap-s", options.cap_s, "stop a first plan or dispatch after this many seconds")
      ->check(CLI::PositiveNumber);
  app.add_flag("--no-dispatch", no_dispatch, "plans only");
  app.add_flag("--dispatch-only", dispatch_only, "first dispatches only");
  app.add_option("--json", options.json_path, "also write every row as JSON here");
  app.add_flag("--cpu-time", time_cpu, "time by the measuring thread's CPU time (a busy machine)");
  app.allow_extras();  // Google Benchmark flags from `make bench BENCH_ARGS=...`
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  options.dispatch = !no_dispatch;
  options.plans = !dispatch_only;
  try {
    run(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera_plan_scale_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
