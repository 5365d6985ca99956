#pragma once
// Helpers of the communicator tests: typed byte buffers whose every element is a known function
// of (world rank, index), an independent reduction oracle, and the group shapes every collective
// is tested on (the world and sub-groups of 2-d and 3-d layouts built with split).
//
// Values are written and read here element by element (no code under test involved); results
// are compared bit for bit, which also proves them bit-identical on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <tessera/comm/communicator.hpp>
#include <tessera/runtime/runtime.hpp>

#include <rank_test_util.hpp>
#include <test_util.hpp>

namespace tessera::testing {

/// A contiguous buffer of elements of one dtype.
struct Buffer {
  DType dtype = DType::f32;
  std::vector<std::byte> bytes;

  Buffer() = default;
  Buffer(DType dt, int64_t n) : dtype(dt), bytes(static_cast<size_t>(n * itemsize(dt))) {}
  int64_t count() const { return static_cast<int64_t>(bytes.size()) / itemsize(dtype); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  /// Element i as double (16-bit floats through float, bool as 0/1).
  double get(int64_t i) const {
    return visit(dtype, [&]<class T>(TypeTag<T>) {
      T v;
      std::memcpy(&v, bytes.data() + i * itemsize(dtype), sizeof(T));
      return to_double(v);
    });
  }
  void set(int64_t i, double v) {
    visit(dtype, [&]<class T>(TypeTag<T>) {
      const T t = from_double<T>(v);
      std::memcpy(bytes.data() + i * itemsize(dtype), &t, sizeof(T));
    });
  }
};

/// n elements of dtype, element i = f(i).
template <class F>
Buffer filled(DType dtype, int64_t n, F f) {
  Buffer b(dtype, n);
  for (int64_t i = 0; i < n; ++i) b.set(i, f(i));
  return b;
}

/// Bit-for-bit equality, reporting the first differing element.
inline ::testing::AssertionResult same_bits(const Buffer& got, const Buffer& want, const std::string& what) {
  if (got.dtype != want.dtype || got.bytes.size() != want.bytes.size())
    return ::testing::AssertionFailure() << what << ": " << got.count() << " " << name(got.dtype) << " elements, expected "
                                         << want.count() << " " << name(want.dtype);
  const int64_t size = itemsize(got.dtype);
  for (int64_t i = 0; i < got.count(); ++i)
    if (std::memcmp(got.bytes.data() + i * size, want.bytes.data() + i * size, static_cast<size_t>(size)) != 0)
      return ::testing::AssertionFailure() << what << ": element " << i << " of " << got.count() << " is " << got.get(i)
                                           << ", expected " << want.get(i) << " (" << name(got.dtype) << ")";
  return ::testing::AssertionSuccess();
}

/// A value that moves unchanged (no arithmetic): distinct per (who, i, salt) as far as the dtype
/// can hold, exactly representable in it.
inline double pattern(DType dtype, int who, int64_t i, int salt = 0) {
  const int64_t x = who * 131 + i * 7 + salt * 17 + (i * i) % 13;
  switch (dtype) {
    case DType::b8:
      return (x % 3) == 0 ? 1 : 0;
    case DType::u8:
      return static_cast<double>(x % 251);
    case DType::bf16:
      return static_cast<double>(x % 251) - 125;
    case DType::f16:
      return static_cast<double>(x % 2039) - 1019;
    default:
      return static_cast<double>(x % 1000003) - 500001;
  }
}

/// A contribution to a reduction of `op` by world rank `who` at index i: small values whose
/// sums and products stay exact in every dtype (and never overflow), so the result depends only
/// on the reduction semantics. b8: i % (who + 2) != 0, so both and and or give true and false.
inline double contribution(DType dtype, ReduceOp op, int who, int64_t i) {
  if (dtype == DType::b8) return (i % (who + 2)) != 0 ? 1 : 0;
  const bool is_signed = dtype != DType::u8;
  const bool is_float = is_floating(dtype);
  if (op == ReduceOp::product) {  // at most two of each factor among 8 consecutive ranks
    const int64_t m = (i + who) % 6;
    static constexpr double kFloat[] = {2, 1, -1, 1, 0.5, 1.5};
    static constexpr double kSigned[] = {2, 1, -1, 1, 1, 3};
    static constexpr double kUnsigned[] = {2, 1, 1, 1, 1, 3};
    return is_float ? kFloat[m] : is_signed ? kSigned[m] : kUnsigned[m];
  }
  double v = static_cast<double>((who * 5 + i * 3) % 11);
  if (is_signed) v -= 4;
  if (is_float) v += 0.25 * static_cast<double>((i + who) % 4);
  return v;
}

/// The reduction oracle: op over members (in group order) of value(member, i), computed in the
/// accumulation type of the dtype (f32 for f16/bf16) and rounded once; avg divides the sum by
/// the number of members (integers truncate toward zero); b8 sum/max are or, product/min and.
template <class F>
double reduce_expected(DType dtype, ReduceOp op, const std::vector<int>& members, int64_t i, F value) {
  return visit(dtype, [&]<class T>(TypeTag<T>) -> double {
    using A = compute_t<T>;
    auto elem = [&](int who) { return static_cast<A>(from_double<T>(value(who, i))); };
    A acc = elem(members[0]);
    for (size_t k = 1; k < members.size(); ++k) {
      const A x = elem(members[k]);
      if constexpr (std::is_same_v<A, bool>) {
        acc = (op == ReduceOp::product || op == ReduceOp::min) ? (acc && x) : (acc || x);
      } else {
        switch (op) {
          case ReduceOp::sum:
          case ReduceOp::avg:
            acc = static_cast<A>(acc + x);
            break;
          case ReduceOp::product:
            acc = static_cast<A>(acc * x);
            break;
          case ReduceOp::max:
            acc = x > acc ? x : acc;
            break;
          case ReduceOp::min:
            acc = x < acc ? x : acc;
            break;
        }
      }
    }
    if constexpr (!std::is_same_v<A, bool>)
      if (op == ReduceOp::avg) acc = static_cast<A>(acc / static_cast<A>(members.size()));
    return to_double(static_cast<T>(acc));  // the one rounding (16-bit floats)
  });
}

inline const std::vector<ReduceOp>& all_reduce_ops() {
  static const std::vector<ReduceOp> ops = {ReduceOp::sum, ReduceOp::avg, ReduceOp::product, ReduceOp::max,
                                            ReduceOp::min};
  return ops;
}

/// True for the (dtype, op) pairs that are defined (avg of b8 is rejected).
inline bool defined(DType dtype, ReduceOp op) { return !(dtype == DType::b8 && op == ReduceOp::avg); }

/// One group a rank belongs to: the communicator and its members' world ranks in group order,
/// computed by the test (not read from the communicator).
struct GroupCase {
  std::string label;
  std::shared_ptr<Communicator> comm;
  std::vector<int> members;

  int size() const { return static_cast<int>(members.size()); }
  /// World rank of group rank r.
  int who(int r) const { return members[static_cast<size_t>(r)]; }
  std::string describe() const { return label + " " + comm->to_string() + " rank " + std::to_string(comm->rank()); }
};

/// rows x cols with rows the largest divisor of n not above sqrt(n): 1x1 1x2 1x3 2x2 2x4.
inline std::pair<int, int> layout_2d(int n) {
  int rows = 1;
  for (int d = 1; d * d <= n; ++d)
    if (n % d == 0) rows = d;
  return {rows, n / rows};
}

/// Splits `parent` by (color, key) functions of the world rank and checks the result against
/// the membership the test computes itself: members of my color ordered by (key, world rank).
template <class Color, class Key>
GroupCase split_case(Communicator& parent, const std::string& label, Color color, Key key) {
  const int me = rank(), n = world_size();
  GroupCase g{label, parent.split(color(me), key(me)), {}};
  if (color(me) < 0) {
    EXPECT_EQ(g.comm, nullptr) << label << ": a negative color must give no communicator";
    return g;
  }
  std::vector<std::pair<int, int>> order;
  for (int r = 0; r < n; ++r)
    if (color(r) == color(me)) order.push_back({key(r), r});
  std::sort(order.begin(), order.end());
  for (const auto& [k, r] : order) g.members.push_back(r);
  EXPECT_NE(g.comm, nullptr) << label;
  if (g.comm) {
    EXPECT_EQ(g.comm->world_ranks(), g.members) << label;
    const auto pos = std::find(g.members.begin(), g.members.end(), me) - g.members.begin();
    EXPECT_EQ(g.comm->rank(), pos) << label;
    EXPECT_EQ(g.comm->size(), g.size()) << label;
  }
  return g;
}

/// The groups every collective is tested on, the same list in the same order on every rank:
/// the world; rows, columns and reversed columns (key = -row) of the 2-d layout
/// r = i * cols + j; for 8 ranks one group per dim of the 2x2x2 layout (dim 0 being the columns
/// of 2x4); the even ranks in reverse order (odd ranks pass a negative color and are left out).
inline std::vector<GroupCase> group_cases() {
  const int n = world_size();
  std::vector<GroupCase> cases;
  {
    std::vector<int> all(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) all[static_cast<size_t>(r)] = r;
    cases.push_back({"world", world_ptr(), all});
  }
  Communicator& w = world();
  const auto [rows, cols] = layout_2d(n);
  const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
  cases.push_back(split_case(w, "rows of " + shape, [c = cols](int r) { return r / c; },
                             [c = cols](int r) { return r % c; }));
  if (n != 8)  // for 8 ranks the columns of 2x4 are dim 0 of 2x2x2 below, the same groups
    cases.push_back(split_case(w, "cols of " + shape, [c = cols](int r) { return r % c; },
                               [c = cols](int r) { return r / c; }));
  cases.push_back(split_case(w, "reversed cols of " + shape, [c = cols](int r) { return r % c; },
                             [c = cols](int r) { return -(r / c); }));
  if (n == 8) {  // r = (a * 2 + b) * 2 + c
    for (int dim = 0; dim < 3; ++dim) {
      const int stride = 1 << (2 - dim);
      cases.push_back(split_case(
          w, "dim " + std::to_string(dim) + " of 2x2x2",
          [stride](int r) { return (r / (2 * stride)) * stride + r % stride; },  // the other two coordinates
          [stride](int r) { return (r / stride) % 2; }));
    }
  }
  cases.push_back(split_case(w, "even ranks reversed", [](int r) { return r % 2 == 0 ? 0 : -1; },
                             [](int r) { return -r; }));
  return cases;
}

/// Restores the global comm timeout when it leaves scope.
class TimeoutGuard {
 public:
  explicit TimeoutGuard(double seconds) : saved_(comm_timeout_seconds()) { set_comm_timeout_seconds(seconds); }
  ~TimeoutGuard() { set_comm_timeout_seconds(saved_); }
  TimeoutGuard(const TimeoutGuard&) = delete;
  TimeoutGuard& operator=(const TimeoutGuard&) = delete;

 private:
  double saved_;
};

/// The world sizes of the threads backend (under MPI for_each_world runs once on its world).
inline const std::vector<int>& world_sizes() {
  static const std::vector<int> sizes = {1, 2, 3, 4, 8};
  return sizes;
}

}  // namespace tessera::testing
