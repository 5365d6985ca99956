#include <tessera/controller/detail/wire.hpp>

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <tuple>
#include <variant>

#include <tessera/core/error.hpp>
#include <tessera/sharding/layout_words.hpp>

namespace tessera::controller::detail {

namespace {

// One overload per field type of the protocol's structs; a struct is its `fields` in order, a
// variant its alternative's index and then that alternative.
class Writer {
 public:
  void put(int64_t v) { words_.push_back(v); }
  void put(uint64_t v) { put(static_cast<int64_t>(v)); }
  void put(bool v) { put(int64_t{v ? 1 : 0}); }
  void put(double v) { put(std::bit_cast<int64_t>(v)); }
  void put(DType v) { put(static_cast<int64_t>(v)); }
  void put(MeshReduction v) { put(static_cast<int64_t>(v)); }
  void put(const std::string& s) {
    put(static_cast<int64_t>(s.size()));
    for (size_t i = 0; i < s.size(); i += 8) {
      int64_t w = 0;
      std::memcpy(&w, s.data() + i, std::min<size_t>(8, s.size() - i));
      put(w);
    }
  }
  void put(const Shape& shape) { put(std::vector<int64_t>(shape.begin(), shape.end())); }
  void put(const Placements& placements) { append_placement_words(placements, words_); }
  template <class T>
  void put(const std::vector<T>& items) {
    put(static_cast<int64_t>(items.size()));
    for (const T& item : items) put(item);
  }
  template <class K, class V>
  void put(const std::map<K, V>& items) {
    put(static_cast<int64_t>(items.size()));
    for (const auto& [key, value] : items) put(key), put(value);
  }
  template <class... Ts>
  void put(const std::variant<Ts...>& v) {
    put(static_cast<int64_t>(v.index()));
    std::visit([&](const auto& alternative) { put_fields(alternative); }, v);
  }
  template <class T>
  void put_fields(const T& s) {
    std::apply([&](const auto&... field) { (put(field), ...); }, T::fields(s));
  }
  std::vector<int64_t> take() { return std::move(words_); }

 private:
  std::vector<int64_t> words_;
};

class Reader {
 public:
  explicit Reader(const std::vector<int64_t>& words) : words_(words, "controller") {}
  void get(int64_t& v) { v = words_.next(); }
  void get(uint64_t& v) { v = static_cast<uint64_t>(words_.next()); }
  void get(bool& v) { v = words_.next() != 0; }
  void get(double& v) { v = std::bit_cast<double>(words_.next()); }
  void get(DType& v) { v = static_cast<DType>(enumerator(kNumDTypes, "dtype")); }
  void get(MeshReduction& v) { v = static_cast<MeshReduction>(enumerator(kMeshReductionCount, "mesh reduction")); }
  void get(std::string& s) {
    s.assign(count(), '\0');
    for (size_t i = 0; i < s.size(); i += 8) {
      const int64_t w = words_.next();
      std::memcpy(s.data() + i, &w, std::min<size_t>(8, s.size() - i));
    }
  }
  void get(Shape& shape) {
    std::vector<int64_t> dims;
    get(dims);
    shape = Shape(dims);
  }
  void get(Placements& placements) { placements = words_.placements(); }
  template <class T>
  void get(std::vector<T>& items) {
    items.assign(count(), T{});
    for (T& item : items) get(item);
  }
  template <class K, class V>
  void get(std::map<K, V>& items) {
    items.clear();
    for (size_t n = count(); n > 0; --n) {
      K key{};
      get(key);
      get(items[key]);
    }
  }
  template <class... Ts>
  void get(std::variant<Ts...>& v) {
    const int64_t index = words_.next();
    TESSERA_CHECK(index >= 0 && index < static_cast<int64_t>(sizeof...(Ts)), CommError, "controller",
                  "a message names alternative ", index, " of ", sizeof...(Ts), "; the sender speaks another protocol");
    v = alternative<std::variant<Ts...>>(static_cast<size_t>(index));
    std::visit([&](auto& chosen) { get_fields(chosen); }, v);
  }
  template <class T>
  void get_fields(T& s) {
    std::apply([&](auto&... field) { (get(field), ...); }, T::fields(s));
  }

 private:
  // A count read from the message, checked against the words left so a corrupt count cannot ask
  // for more memory than the message holds.
  size_t count() {
    const int64_t n = words_.next();
    TESSERA_CHECK(n >= 0 && n <= static_cast<int64_t>(words_.left()) * 8, CommError, "controller",
                  "a message announces ", n, " items with ", words_.left(), " words left");
    return static_cast<size_t>(n);
  }
  int64_t enumerator(int64_t count, const char* what) {
    const int64_t v = words_.next();
    TESSERA_CHECK(v >= 0 && v < count, CommError, "controller", "a message names ", what, " ", v, " of ", count);
    return v;
  }
  // The default-constructed alternative `index` of V.
  template <class V, size_t I = 0>
  static V alternative(size_t index) {
    if constexpr (I + 1 < std::variant_size_v<V>) {
      if (index != I) return alternative<V, I + 1>(index);
    }
    return V(std::in_place_index<I>);
  }

  WordReader words_;
};

}  // namespace

std::vector<int64_t> encode_command(const Command& command) {
  Writer w;
  w.put(command);
  return w.take();
}

Command decode_command(const std::vector<int64_t>& words) {
  Reader r(words);
  Command command;
  r.get(command);
  return command;
}

std::vector<int64_t> encode_reply(const Reply& reply) {
  Writer w;
  w.put_fields(reply);
  return w.take();
}

Reply decode_reply(const std::vector<int64_t>& words) {
  Reader r(words);
  Reply reply;
  r.get_fields(reply);
  return reply;
}

}  // namespace tessera::controller::detail
