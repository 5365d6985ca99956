// Counter-based random tensors (Philox 4x32-10).
//
// Design. Every element is a pure function of (seed, offset, global element index i), where i is
// the row-major position of the element in the *global* tensor. Nothing else (block shape,
// thread, previous draws) enters, which is what lets a shard generate its slice alone and agree
// with the unsharded tensor bit for bit.
//
//   key     = (seed low 32, seed high 32)
//   counter = (b low 32, b high 32, offset low 32, offset high 32), b = Philox block index
//
// One Philox call yields 4 lanes of 32 bits. Which block and lanes element i reads:
//
//   distribution / dtype           elements per block   element i uses
//   uniform f32, f16, bf16         4                    block i/4, lane i%4
//   uniform f64                    2                    block i/2, lanes 2(i%2) (low word), 2(i%2)+1 (high)
//   normal  f32, f16, bf16         2                    block i/2, lanes 2(i%2) -> u1, 2(i%2)+1 -> u2
//   normal  f64                    1                    block i, lanes 0,1 (64-bit u1), lanes 2,3 (64-bit u2)
//   bernoulli (any dtype, b8 mask) 4                    block i/4, lane i%4
//
// Uniform [0, 1) takes exactly as many bits as the dtype has significand digits (24 for f32,
// 11 for f16, 8 for bf16, 53 for f64) and scales by 2^-digits, as PyTorch does: every value
// k * 2^-digits is exactly representable, so rounding can never produce 1.0. A range [a, b)
// maps u to a + (b - a) * u in double; if rounding to the dtype reaches b, the value becomes
// the largest one below b, so the result stays in [a, b).
//
// Normal uses Box–Muller with the cosine branch only (one normal per pair of uniforms, so an
// element never depends on its neighbour's block): z = sqrt(-2 ln u1) * cos(2 pi u2), with
// u1 = (x + 1) * 2^-bits in (0, 1] (never log(0); |z| <= 6.7 for 32-bit u1, 8.6 for 53-bit) and
// u2 = x * 2^-bits in [0, 1). Computed in double, then mean + std * z rounded to the dtype.
//
// Bernoulli(p) is true iff lane < p * 2^32 (exact in double), i.e. u = lane * 2^-32 < p: never
// for p == 0, always for p == 1. The same bits serve every dtype, so a b8 dropout mask and an
// f32 bernoulli of the same draw agree.
//
// The kernel walks the block row by row. Trailing dims the block covers completely are merged
// into the row, so a whole tensor is one row. For each row it computes the global index of the
// row start once and then calls Philox once per block of 2 or 4 elements (4 lanes), never once
// per element; the per-element transform is a lambda inlined into the loop.
#include <tessera/ops/random.hpp>

#include <tessera/ops/tensor_grad_ops.hpp>

#include <cmath>
#include <limits>
#include <numbers>

#include <tessera/core/internal/strided_loop.hpp>
#include <tessera/ops/elementwise.hpp>

namespace tessera {

namespace {

using Lanes = std::array<uint32_t, 4>;
using Key = std::array<uint32_t, 2>;

// Multipliers and Weyl key increments of Philox 4x32 (Salmon et al., SC'11; Random123 philox.h).
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

inline Lanes philox_rounds(Lanes c, Key k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // the key is bumped between rounds, not before the first
      k[0] += kPhiloxW0;
      k[1] += kPhiloxW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
  }
  return c;
}

inline Key key_of(uint64_t seed) { return {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}; }

inline Lanes counter_of(uint64_t block, uint64_t offset) {
  return {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), static_cast<uint32_t>(offset),
          static_cast<uint32_t>(offset >> 32)};
}

inline uint64_t join64(uint32_t low, uint32_t high) { return static_cast<uint64_t>(high) << 32 | low; }

constexpr double kTwoPow32 = 4294967296.0;
constexpr double kTwoPowMinus32 = 1.0 / 4294967296.0;
constexpr double kTwoPowMinus53 = 1.0 / 9007199254740992.0;

// Significand digits of each floating storage type: the bits a uniform of that type uses.
template <class T>
constexpr int uniform_digits() {
  if constexpr (std::is_same_v<T, Half>) return 11;
  else if constexpr (std::is_same_v<T, BFloat16>) return 8;
  else return std::numeric_limits<T>::digits;  // 24 for float, 53 for double
}

// The largest value of T strictly below value (value finite).
template <class T>
T next_below(T value) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    const uint16_t bits = value.bits;
    const uint16_t magnitude = bits & 0x7fffu;
    if (magnitude == 0) return T::from_bits(0x8001u);      // +-0 -> smallest negative subnormal
    if (bits & 0x8000u) return T::from_bits(bits + 1u);  // negative: away from zero
    return T::from_bits(static_cast<uint16_t>(bits - 1u));
  } else {
    return std::nextafter(value, -std::numeric_limits<T>::infinity());
  }
}

// u in [0, 1) mapped to [a, b) in T. With the default range the value is exact.
template <class T>
struct UniformMap {
  double a, b;
  bool unit;      // a == 0 && b == 1: u itself
  T below_b;      // the largest T below b, used when rounding reaches b
  bool can_clamp; // some T lies in [a, b)

  UniformMap(double low, double high) : a(low), b(high), unit(low == 0 && high == 1) {
    const T tb = convert<T>(b);
    below_b = static_cast<double>(static_cast<compute_t<T>>(tb)) >= b ? next_below(tb) : tb;
    can_clamp = a < b && static_cast<double>(static_cast<compute_t<T>>(below_b)) >= a;
  }
  T operator()(double u) const {
    if (unit) return convert<T>(u);
    const T t = convert<T>(a + (b - a) * u);
    if (can_clamp && static_cast<double>(static_cast<compute_t<T>>(t)) >= b) return below_b;
    return t;
  }
};

// Fills out[0, count) with elements first, first + 1, ... of the global index space, calling
// Philox once per PerBlock elements. value(lanes, slot) makes one element from its slot.
template <int PerBlock, class T, class Value>
void fill_run(T* out, uint64_t first, int64_t count, Key key, uint64_t offset, const Value& value) {
  uint64_t block = first / PerBlock;
  int64_t k = 0;
  if (const int head = static_cast<int>(first % PerBlock); head != 0) {  // the tail of a block
    const Lanes lanes = philox_rounds(counter_of(block++, offset), key);
    for (int slot = head; slot < PerBlock && k < count; ++slot, ++k) out[k] = value(lanes, slot);
  }
  for (; count - k >= PerBlock; k += PerBlock) {  // whole blocks
    const Lanes lanes = philox_rounds(counter_of(block++, offset), key);
    for (int slot = 0; slot < PerBlock; ++slot) out[k + slot] = value(lanes, slot);
  }
  if (k < count) {  // the head of a block
    const Lanes lanes = philox_rounds(counter_of(block, offset), key);
    for (int slot = 0; k < count; ++slot, ++k) out[k] = value(lanes, slot);
  }
}

// Fills the contiguous out (of block_shape) with the box [begin, begin + block_shape) of the
// global index space, row by row.
template <int PerBlock, class T, class Value>
void fill_box(T* out, const Shape& global_shape, const Shape& begin, const Shape& block_shape, Key key,
              uint64_t offset, const Value& value) {
  const int64_t ndim = global_shape.size();
  const Strides gstrides = contiguous_strides(global_shape);
  // Dims [full, ndim) are covered completely, so they are contiguous in the global index and join
  // the row; dim full - 1 (if any) contributes its partial extent to the row too.
  int64_t full = ndim;
  while (full > 0 && begin[full - 1] == 0 && block_shape[full - 1] == global_shape[full - 1]) --full;
  if (full == 0) {
    fill_run<PerBlock>(out, 0, global_shape.numel(), key, offset, value);
    return;
  }
  const int64_t row_dim = full - 1;
  const int64_t row_length = block_shape[row_dim] * gstrides[row_dim];
  // Odometer over the outer dims [0, row_dim); start is the global index of the current row.
  DimVector index = DimVector::filled(row_dim, 0);
  int64_t start = 0;
  for (int64_t d = 0; d <= row_dim; ++d) start += begin[d] * gstrides[d];
  while (true) {
    fill_run<PerBlock>(out, static_cast<uint64_t>(start), row_length, key, offset, value);
    out += row_length;
    int64_t d = row_dim - 1;
    for (; d >= 0; --d) {
      start += gstrides[d];
      if (++index[d] < block_shape[d]) break;
      start -= gstrides[d] * block_shape[d];
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

const char* distribution_name(Distribution distribution) {
  switch (distribution) {
    case Distribution::uniform: return "uniform";
    case Distribution::normal: return "normal";
    case Distribution::bernoulli: return "bernoulli";
  }
  return "unknown";
}

void check_box(const Shape& global_shape, const Shape& begin, const Shape& block_shape) {
  TESSERA_CHECK(begin.size() == global_shape.size() && block_shape.size() == global_shape.size(), ValueError,
                "random_block", "rank mismatch: global shape ", global_shape.to_string(), ", begin ", begin.to_string(),
                ", block shape ", block_shape.to_string(), "; expected begin and block shape of rank ",
                global_shape.size());
  for (int64_t d = 0; d < global_shape.size(); ++d) {
    TESSERA_CHECK(global_shape[d] >= 0 && begin[d] >= 0 && block_shape[d] >= 0 &&
                      begin[d] <= global_shape[d] - block_shape[d],
                  ValueError, "random_block", "block leaves the global shape at dim ", d, ": begin ",
                  begin.to_string(), ", block shape ", block_shape.to_string(), ", global shape ",
                  global_shape.to_string(), "; expected 0 <= begin <= begin + block shape <= global shape");
  }
}

void check_parameters(const RandomDraw& draw) {
  switch (draw.distribution) {
    case Distribution::uniform:
      TESSERA_CHECK(std::isfinite(draw.a) && std::isfinite(draw.b) && draw.a <= draw.b, ValueError, "random_block",
                    "invalid uniform range [", draw.a, ", ", draw.b, "); expected finite a <= b");
      break;
    case Distribution::normal:
      TESSERA_CHECK(std::isfinite(draw.a) && std::isfinite(draw.b) && draw.b >= 0, ValueError, "random_block",
                    "invalid normal parameters mean ", draw.a, ", std ", draw.b,
                    "; expected a finite mean and a finite std >= 0");
      break;
    case Distribution::bernoulli:
      TESSERA_CHECK(draw.a >= 0 && draw.a <= 1, ValueError, "random_block", "invalid bernoulli probability ", draw.a,
                    "; expected 0 <= p <= 1");
      break;
  }
}

void check_shape(const Shape& shape, const char* op) {
  for (int64_t s : shape) TESSERA_CHECK(s >= 0, ValueError, op, "negative size in shape ", shape.to_string(),
                                        "; expected sizes >= 0");
}

// The whole tensor of one fresh draw from the calling thread's generator.
Tensor draw_whole(Distribution distribution, double a, double b, DType dtype, const Shape& shape) {
  const RandomDraw draw = default_generator().next(distribution, a, b, dtype);
  return random_block(draw, shape, DimVector::filled(shape.size(), 0), shape);
}

}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
  return philox_rounds(counter, key);
}

Generator& default_generator() {
  thread_local Generator generator(kDefaultSeed);
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

Tensor random_block(const RandomDraw& draw, const Shape& global_shape, const Shape& begin, const Shape& block_shape) {
  check_box(global_shape, begin, block_shape);
  check_parameters(draw);
  if (draw.distribution != Distribution::bernoulli) {
    TESSERA_CHECK(is_floating(draw.dtype), ValueError, "random_block", "unsupported dtype ", name(draw.dtype),
                  " for a ", distribution_name(draw.distribution),
                  " draw; expected a floating dtype (f32, f64, f16, bf16)");
  }
  Tensor out = empty(block_shape, draw.dtype);
  if (out.numel() == 0) return out;
  const Key key = key_of(draw.seed);
  const uint64_t offset = draw.offset;

  visit(draw.dtype, [&]<class T>(TypeTag<T>) {
    T* data = out.data<T>();
    auto fill = [&]<int PerBlock>(const auto& value) {
      fill_box<PerBlock>(data, global_shape, begin, block_shape, key, offset, value);
    };
    if (draw.distribution == Distribution::bernoulli) {
      const double threshold = draw.a * kTwoPow32;
      fill.template operator()<4>(
          [threshold](const Lanes& lanes, int slot) { return convert<T>(static_cast<double>(lanes[slot]) < threshold); });
      return;
    }
    if constexpr (is_floating_v<T>) {
      if (draw.distribution == Distribution::uniform) {
        const UniformMap<T> map(draw.a, draw.b);
        if constexpr (std::is_same_v<T, double>) {
          fill.template operator()<2>([&map](const Lanes& lanes, int slot) {
            const uint64_t x = join64(lanes[2 * slot], lanes[2 * slot + 1]);
            return map(static_cast<double>(x >> 11) * kTwoPowMinus53);
          });
        } else {
          constexpr int digits = uniform_digits<T>();
          constexpr float scale = 1.0f / static_cast<float>(uint32_t{1} << digits);
          if (map.unit) {  // the common case: exact in float, no range mapping
            fill.template operator()<4>([](const Lanes& lanes, int slot) {
              return static_cast<T>(static_cast<float>(lanes[slot] >> (32 - digits)) * scale);
            });
          } else {
            fill.template operator()<4>([&map](const Lanes& lanes, int slot) {
              return map(static_cast<double>(lanes[slot] >> (32 - digits)) * scale);
            });
          }
        }
      } else {  // normal
        const double mean = draw.a;
        const double stddev = draw.b;
        constexpr double two_pi = 2 * std::numbers::pi;
        if constexpr (std::is_same_v<T, double>) {
          fill.template operator()<1>([mean, stddev](const Lanes& lanes, int) {
            const double u1 = static_cast<double>((join64(lanes[0], lanes[1]) >> 11) + 1) * kTwoPowMinus53;
            const double u2 = static_cast<double>(join64(lanes[2], lanes[3]) >> 11) * kTwoPowMinus53;
            return mean + stddev * (std::sqrt(-2 * std::log(u1)) * std::cos(two_pi * u2));
          });
        } else {
          fill.template operator()<2>([mean, stddev](const Lanes& lanes, int slot) {
            const double u1 = (static_cast<double>(lanes[2 * slot]) + 1) * kTwoPowMinus32;
            const double u2 = static_cast<double>(lanes[2 * slot + 1]) * kTwoPowMinus32;
            return convert<T>(mean + stddev * (std::sqrt(-2 * std::log(u1)) * std::cos(two_pi * u2)));
          });
        }
      }
    } else {
      TESSERA_ASSERT(false, "non-floating dtype reached a floating distribution");
    }
  });
  return out;
}

Tensor rand(const Shape& shape, DType dtype) {
  visit_floating(dtype, "rand", [](auto) {});
  check_shape(shape, "rand");
  return draw_whole(Distribution::uniform, 0, 1, dtype, shape);
}

Tensor randn(const Shape& shape, DType dtype) {
  visit_floating(dtype, "randn", [](auto) {});
  check_shape(shape, "randn");
  return draw_whole(Distribution::normal, 0, 1, dtype, shape);
}

Tensor bernoulli(const Shape& shape, double p, DType dtype) {
  TESSERA_CHECK(p >= 0 && p <= 1, ValueError, "bernoulli", "probability p = ", p, " is outside [0, 1]; expected 0 <= p <= 1");
  check_shape(shape, "bernoulli");
  return draw_whole(Distribution::bernoulli, p, 0, dtype, shape);
}

Tensor dropout_mask(const Shape& shape, double p) {
  TESSERA_CHECK(p >= 0 && p <= 1, ValueError, "dropout_mask", "drop probability p = ", p,
                " is outside [0, 1]; expected 0 <= p <= 1");
  check_shape(shape, "dropout_mask");
  return draw_whole(Distribution::bernoulli, 1.0 - p, 0, DType::b8, shape);
}

Tensor dropout(const Tensor& x, double p, bool training) {
  TESSERA_CHECK(x.defined(), ValueError, "dropout", "input tensor is undefined; expected a defined tensor");
  TESSERA_CHECK(p >= 0 && p < 1, ValueError, "dropout", "drop probability p = ", p,
                " is outside [0, 1); expected 0 <= p < 1");
  return visit_floating(x.dtype(), "dropout", [&]<class T>(TypeTag<T>) -> Tensor {
    if (p == 0 || !training) return x;
    using C = compute_t<T>;
    const Tensor mask = dropout_mask(x.shape(), p);
    Tensor out = empty(x.shape(), x.dtype());
    // x * (mask / (1 - p)): the factor is 0 or 1 / (1 - p), in the compute type.
    const C scale = static_cast<C>(1.0 / (1.0 - p));
    detail::strided_loop<3>(x.shape(), {&out.strides(), &x.strides(), &mask.strides()},
                            {detail::bytes(out), detail::bytes(x), detail::bytes(mask)},
                            {out.itemsize(), x.itemsize(), mask.itemsize()}, [scale](const detail::Run<3>& run) {
                              for (int64_t k = 0; k < run.count; ++k) {
                                const T v = *reinterpret_cast<const T*>(run.ptr[1] + k * run.stride[1]);
                                const bool keep = *reinterpret_cast<const bool*>(run.ptr[2] + k * run.stride[2]);
                                *reinterpret_cast<T*>(run.ptr[0] + k * run.stride[0]) =
                                    static_cast<T>(static_cast<C>(v) * (keep ? scale : C(0)));
                              }
                            });
    if (autograd::needs_grad<Tensor>({&x}))
      autograd::record<Tensor>("dropout", out, {&x}, [mask, scale = 1.0 / (1.0 - p)](const Tensor& g) {
        return std::vector<Tensor>{where(mask, mul(g, Scalar(scale)), Scalar(0.0))};
      });
    return out;
  });
}

}  // namespace tessera
