#include <tessera/debug/comm_debug_mode.hpp>

#include <algorithm>
#include <array>
#include <sstream>
#include <string_view>

namespace tessera {

CommDebugMode::CommDebugMode() { add_comm_observer(this); }

// remove_comm_observer throws only if this scope was not registered on this thread, which a
// non-movable local cannot cause; should it happen anyway, terminating is the loud answer.
CommDebugMode::~CommDebugMode() { remove_comm_observer(this); }

void CommDebugMode::on_call(const Communicator& /*comm*/, const CollectiveCall& call) { calls_.push_back(call); }

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
}

std::string CommDebugMode::to_string() const {
  if (calls_.empty()) return "no communication";
  struct Row {
    std::string kind;
    int64_t count = 0, sent = 0, received = 0;
  };
  std::vector<Row> rows;
  // std::map orders kinds as the X-macro list does, so the table reads in a fixed order.
  for (const auto& [kind, n] : counts()) rows.push_back({std::string(name(kind)), n, bytes_sent(kind), bytes_received(kind)});
  rows.push_back({"total", total_count(), total_bytes_sent(), total_bytes_received()});

  const std::array<std::string, 4> header = {"kind", "count", "bytes sent", "bytes received"};
  std::array<size_t, 4> width{};
  for (size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const Row& r : rows) {
    width[0] = std::max(width[0], r.kind.size());
    width[1] = std::max(width[1], std::to_string(r.count).size());
    width[2] = std::max(width[2], std::to_string(r.sent).size());
    width[3] = std::max(width[3], std::to_string(r.received).size());
  }
  std::ostringstream out;
  // Names left-aligned, numbers right-aligned, two spaces between columns, no trailing spaces.
  auto line = [&](const std::string& kind, const std::string& a, const std::string& b, const std::string& c) {
    out << kind << std::string(width[0] - kind.size(), ' ');
    out << "  " << std::string(width[1] - a.size(), ' ') << a;
    out << "  " << std::string(width[2] - b.size(), ' ') << b;
    out << "  " << std::string(width[3] - c.size(), ' ') << c << '\n';
  };
  line(header[0], header[1], header[2], header[3]);
  for (const Row& r : rows) line(r.kind, std::to_string(r.count), std::to_string(r.sent), std::to_string(r.received));
  std::string text = out.str();
  text.pop_back();  // no trailing newline, like the other to_string()s
  return text;
}

}  // namespace tessera
