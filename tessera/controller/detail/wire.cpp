#include <tessera/controller/detail/wire.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <thread>

#include <tessera/core/error.hpp>
#include <tessera/sharding/layout_words.hpp>

namespace tessera::controller::detail {

namespace {

class Writer {
 public:
  void put(int64_t v) { words_.push_back(v); }
  void put(double v) { words_.push_back(std::bit_cast<int64_t>(v)); }
  void put(const std::string& s) {
    put(static_cast<int64_t>(s.size()));
    for (size_t i = 0; i < s.size(); i += 8) {
      int64_t w = 0;
      std::memcpy(&w, s.data() + i, std::min<size_t>(8, s.size() - i));
      words_.push_back(w);
    }
  }
  void put(const std::vector<int64_t>& v) {
    put(static_cast<int64_t>(v.size()));
    words_.insert(words_.end(), v.begin(), v.end());
  }
  void put(const std::vector<double>& v) {
    put(static_cast<int64_t>(v.size()));
    for (double d : v) put(d);
  }
  void put(const Placements& placements) { append_placement_words(placements, words_); }
  std::vector<int64_t> take() { return std::move(words_); }

 private:
  std::vector<int64_t> words_;
};

class Reader {
 public:
  explicit Reader(const std::vector<int64_t>& words) : words_(words, "controller") {}
  int64_t integer() { return words_.next(); }
  double real() { return std::bit_cast<double>(integer()); }
  std::string text() {
    const auto n = static_cast<size_t>(integer());
    std::string s(n, '\0');
    for (size_t i = 0; i < n; i += 8) {
      const int64_t w = integer();
      std::memcpy(s.data() + i, &w, std::min<size_t>(8, n - i));
    }
    return s;
  }
  std::vector<int64_t> integers() {
    std::vector<int64_t> v(static_cast<size_t>(integer()));
    for (int64_t& x : v) x = integer();
    return v;
  }
  std::vector<double> reals() {
    std::vector<double> v(static_cast<size_t>(integer()));
    for (double& x : v) x = real();
    return v;
  }
  Placements placements() { return words_.placements(); }

 private:
  WordReader words_;
};

}  // namespace

std::vector<int64_t> encode_command(const Command& c) {
  Writer w;
  w.put(static_cast<int64_t>(c.kind));
  w.put(c.mesh), w.put(c.stream), w.put(c.target);
  w.put(c.mesh_shape);
  w.put(static_cast<int64_t>(c.mesh_names.size()));
  for (const std::string& name : c.mesh_names) w.put(name);
  w.put(c.parent);
  w.put(static_cast<int64_t>(c.at.size()));
  for (const auto& [axis, index] : c.at) w.put(axis), w.put(index);
  w.put(c.op);
  w.put(int64_t{c.remote ? 1 : 0});
  w.put(std::vector<int64_t>(c.inputs.begin(), c.inputs.end()));
  w.put(c.args.scalars), w.put(c.args.ints);
  w.put(std::vector<int64_t>(c.args.shape.begin(), c.args.shape.end()));
  w.put(c.args.placements);
  w.put(static_cast<int64_t>(c.args.dtype));
  w.put(static_cast<int64_t>(c.output));
  w.put(std::vector<int64_t>(c.outputs.begin(), c.outputs.end()));
  w.put(static_cast<int64_t>(c.request));
  w.put(static_cast<int64_t>(c.event));
  return w.take();
}

Command decode_command(const std::vector<int64_t>& words) {
  Reader r(words);
  Command c;
  c.kind = static_cast<Command::Kind>(r.integer());
  c.mesh = r.integer(), c.stream = r.integer(), c.target = r.integer();
  c.mesh_shape = r.integers();
  c.mesh_names.resize(static_cast<size_t>(r.integer()));
  for (std::string& name : c.mesh_names) name = r.text();
  c.parent = r.integer();
  const int64_t at = r.integer();
  for (int64_t i = 0; i < at; ++i) {
    std::string axis = r.text();
    c.at[axis] = r.integer();
  }
  c.op = r.text();
  c.remote = r.integer() != 0;
  for (int64_t id : r.integers()) c.inputs.push_back(static_cast<uint64_t>(id));
  c.args.scalars = r.reals(), c.args.ints = r.integers();
  c.args.shape = Shape(r.integers());
  c.args.placements = r.placements();
  c.args.dtype = static_cast<DType>(r.integer());
  c.output = static_cast<uint64_t>(r.integer());
  for (int64_t id : r.integers()) c.outputs.push_back(static_cast<uint64_t>(id));
  c.request = static_cast<uint64_t>(r.integer());
  c.event = static_cast<uint64_t>(r.integer());
  return c;
}

void wait_polling(const Work& work) {
  auto pause = std::chrono::microseconds(5);
  while (!work.is_completed()) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
  work.wait();  // rethrows a failure
}

std::vector<int64_t> encode_reply(const Reply& reply) {
  Writer w;
  w.put(int64_t{reply.ok ? 1 : 0});
  if (!reply.ok) {
    w.put(reply.error);
    return w.take();
  }
  w.put(int64_t{reply.is_tensor ? 0 : 1});
  if (reply.is_tensor) {
    w.put(static_cast<int64_t>(reply.dtype));
    w.put(std::vector<int64_t>(reply.shape.begin(), reply.shape.end()));
  } else {
    w.put(reply.layout_words);
  }
  return w.take();
}

Reply decode_reply(const std::vector<int64_t>& words) {
  Reader r(words);
  Reply reply;
  reply.ok = r.integer() != 0;
  if (!reply.ok) {
    reply.error = r.text();
    return reply;
  }
  reply.is_tensor = r.integer() == 0;
  if (reply.is_tensor) {
    reply.dtype = static_cast<DType>(r.integer());
    reply.shape = Shape(r.integers());
  } else {
    reply.layout_words = r.integers();
  }
  return reply;
}

}  // namespace tessera::controller::detail
