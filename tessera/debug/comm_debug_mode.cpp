#include <tessera/debug/comm_debug_mode.hpp>

#include <algorithm>
#include <array>
#include <sstream>
#include <string_view>

namespace tessera {

CommDebugMode::CommDebugMode() {
  clear_modules();
  add_comm_observer(this);
  add_op_observer(this);
  nn::add_forward_observer(this);
}

// The removals throw only if this scope was not registered on this thread, which a non-movable
// local cannot cause; should it happen anyway, terminating is the loud answer.
CommDebugMode::~CommDebugMode() {
  nn::remove_forward_observer(this);
  remove_op_observer(this);
  remove_comm_observer(this);
}

void CommDebugMode::on_call(const Communicator& /*comm*/, const CollectiveCall& call) {
  calls_.push_back(call);
  // Against Global and every module the call was issued in (PyTorch's module_parents_dict).
  const auto& position = detail::module_position();
  const bool backward = position && position->backward;
  const auto count = [&](const std::string& module) {
    ModuleCounts& counts = module_counts_[module];
    ++(backward ? counts.backward : counts.forward)[call.kind];
  };
  count("Global");
  if (position)
    for (const std::string& module : position->modules) count(module);
}

void CommDebugMode::on_done(const Communicator& /*comm*/, const CollectiveCall& call, double seconds) {
  seconds_[call.kind] += seconds;
}

double CommDebugMode::seconds(CollectiveKind kind) const {
  const auto it = seconds_.find(kind);
  return it == seconds_.end() ? 0.0 : it->second;
}

double CommDebugMode::total_seconds() const {
  double total = 0;
  for (const auto& [kind, s] : seconds_) total += s;
  return total;
}

// The accessors scan calls_ instead of keeping per-kind totals: a debug scope records few calls,
// and one source of truth cannot drift from calls().
int64_t CommDebugMode::count(CollectiveKind kind) const {
  return std::count_if(calls_.begin(), calls_.end(), [&](const CollectiveCall& c) { return c.kind == kind; });
}

int64_t CommDebugMode::bytes_sent(CollectiveKind kind) const {
  int64_t sum = 0;
  for (const CollectiveCall& c : calls_)
    if (c.kind == kind) sum += c.bytes_sent;
  return sum;
}

int64_t CommDebugMode::bytes_received(CollectiveKind kind) const {
  int64_t sum = 0;
  for (const CollectiveCall& c : calls_)
    if (c.kind == kind) sum += c.bytes_received;
  return sum;
}

int64_t CommDebugMode::total_bytes_sent() const {
  int64_t sum = 0;
  for (const CollectiveCall& c : calls_) sum += c.bytes_sent;
  return sum;
}

int64_t CommDebugMode::total_bytes_received() const {
  int64_t sum = 0;
  for (const CollectiveCall& c : calls_) sum += c.bytes_received;
  return sum;
}

std::map<CollectiveKind, int64_t> CommDebugMode::counts() const {
  std::map<CollectiveKind, int64_t> out;
  for (const CollectiveCall& c : calls_) ++out[c.kind];
  return out;
}

void CommDebugMode::reset() {
  calls_.clear();
  seconds_.clear();
  clear_modules();
}

void CommDebugMode::clear_modules() {
  module_order_ = {"Global"};
  modules_.clear();
  modules_["Global"] = ModuleInfo{};
  module_counts_.clear();
  module_counts_["Global"] = ModuleCounts{};
  operations_.clear();
}

namespace {

struct Row {
  std::string label;
  int64_t count = 0, sent = 0, received = 0;
};

// Rows under `first`, "count", "bytes sent", "bytes received": labels left-aligned, numbers
// right-aligned, two spaces between columns, no trailing spaces or newline.
std::string table(const std::string& first, const std::vector<Row>& rows, bool right_labels) {
  const std::array<std::string, 4> header = {first, "count", "bytes sent", "bytes received"};
  std::array<size_t, 4> width{};
  for (size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const Row& r : rows) {
    width[0] = std::max(width[0], r.label.size());
    width[1] = std::max(width[1], std::to_string(r.count).size());
    width[2] = std::max(width[2], std::to_string(r.sent).size());
    width[3] = std::max(width[3], std::to_string(r.received).size());
  }
  std::ostringstream out;
  auto line = [&](const std::string& label, const std::string& a, const std::string& b, const std::string& c,
                  bool right) {
    const std::string pad(width[0] - label.size(), ' ');
    out << (right ? pad + label : label + pad);
    out << "  " << std::string(width[1] - a.size(), ' ') << a;
    out << "  " << std::string(width[2] - b.size(), ' ') << b;
    out << "  " << std::string(width[3] - c.size(), ' ') << c << '\n';
  };
  line(header[0], header[1], header[2], header[3], false);
  for (const Row& r : rows)
    line(r.label, std::to_string(r.count), std::to_string(r.sent), std::to_string(r.received),
         right_labels && r.label != "total");
  std::string text = out.str();
  text.pop_back();  // no trailing newline, like the other to_string()s
  return text;
}

// Takes a scope off its thread's observers until it goes (a gather the scope makes about itself
// is not its own communication), and puts it back however the gather ends.
class Unobserved {
 public:
  explicit Unobserved(CommObserver* scope) : scope_(scope) { remove_comm_observer(scope_); }
  ~Unobserved() { add_comm_observer(scope_); }
  Unobserved(const Unobserved&) = delete;
  Unobserved& operator=(const Unobserved&) = delete;

 private:
  CommObserver* scope_;
};

}  // namespace

std::string CommDebugMode::to_string() const {
  if (calls_.empty()) return "no communication";
  std::vector<Row> rows;
  // std::map orders kinds as the X-macro list does, so the table reads in a fixed order.
  for (const auto& [kind, n] : counts())
    rows.push_back({std::string(name(kind)), n, bytes_sent(kind), bytes_received(kind)});
  rows.push_back({"total", total_count(), total_bytes_sent(), total_bytes_received()});
  return table("kind", rows, /*right_labels=*/false);
}

std::vector<CommDebugMode::RankFigures> CommDebugMode::all_ranks(Communicator& comm) {
  const std::array<int64_t, 3> mine = {total_count(), total_bytes_sent(), total_bytes_received()};
  std::vector<int64_t> every(3 * static_cast<size_t>(comm.size()));
  {
    const Unobserved quiet(this);
    comm.all_gather(mine.data(), every.data(), 3, DType::i64);
  }
  std::vector<RankFigures> out;
  for (int r = 0; r < comm.size(); ++r) {
    const size_t at = 3 * static_cast<size_t>(r);
    out.push_back({r, every[at], every[at + 1], every[at + 2]});
  }
  return out;
}

std::string CommDebugMode::all_ranks_table(Communicator& comm) {
  std::vector<Row> rows;
  Row total{"total"};
  for (const RankFigures& f : all_ranks(comm)) {
    rows.push_back({std::to_string(f.rank), f.calls, f.bytes_sent, f.bytes_received});
    total.count += f.calls, total.sent += f.bytes_sent, total.received += f.bytes_received;
  }
  rows.push_back(total);
  return table("rank", rows, /*right_labels=*/true);
}

}  // namespace tessera
