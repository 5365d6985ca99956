#pragma once
// Counter-based random numbers (Philox 4x32-10). Every value is a pure function of
// (seed, offset, global element index), so any sub-block of a random tensor can be generated
// alone and equals the same block of the whole tensor bit for bit — the basis for sharded
// rand/randn/dropout that equal the unsharded result on any mesh.
#include <array>
#include <cstdint>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>

namespace tessera TESSERA_API {

/// The Philox 4x32-10 block function (Salmon et al., SC'11): 10 rounds over a 128-bit counter
/// with a 64-bit key. Pure.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

/// What a random tensor holds: the distribution and its parameters.
enum class Distribution : uint8_t { uniform, normal, bernoulli };

/// One random tensor, fully determined: distribution, parameters, dtype, seed and offset.
/// Element i of the global (row-major flattened) tensor depends only on these and i.
struct RandomDraw {
  Distribution distribution = Distribution::uniform;
  double a = 0;  ///< uniform: low; normal: mean; bernoulli: probability of true/1
  double b = 1;  ///< uniform: high; normal: standard deviation; bernoulli: unused
  DType dtype = DType::f32;
  uint64_t seed = 0;
  uint64_t offset = 0;  ///< stream position: each draw from a Generator takes the next offset
};

/// Seed of every thread's default generator until manual_seed: 0, so programs are reproducible
/// by default (each rank thread starts from the same (seed, offset) = (0, 0)).
inline constexpr uint64_t kDefaultSeed = 0;

/// Seed and offset of the draws of one thread. Each draw takes the current offset and advances it.
class Generator {
 public:
  explicit Generator(uint64_t seed = kDefaultSeed) : seed_(seed) {}
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }
  /// The draw for the next random tensor; advances the offset by one.
  RandomDraw next(Distribution distribution, double a, double b, DType dtype) {
    return RandomDraw{distribution, a, b, dtype, seed_, offset_++};
  }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

/// The calling thread's generator (each in-process rank is a thread with its own); it starts
/// at seed kDefaultSeed, offset 0.
Generator& default_generator();
/// Seeds the calling thread's generator and resets its offset.
void manual_seed(uint64_t seed);

/// The block [begin, begin + block_shape) of the global random tensor `draw` of global_shape,
/// generated without generating the rest; a contiguous tensor of block_shape and draw.dtype.
/// Pure: equals the same narrow() of random_block(draw, global_shape, zeros, global_shape) bit
/// for bit. Throws ValueError if begin or block_shape do not have global_shape's rank, the block
/// leaves the global shape, the dtype does not fit the distribution (uniform and normal need a
/// floating dtype) or the parameters are invalid (uniform: finite a <= b; normal: finite mean,
/// finite std >= 0; bernoulli: 0 <= a <= 1).
Tensor random_block(const RandomDraw& draw, const Shape& global_shape, const Shape& begin, const Shape& block_shape);

/// Uniform in [0, 1) (never 1, in every dtype). Takes one draw from the calling thread's
/// generator. Throws ValueError for a non-floating dtype or a negative size.
Tensor rand(const Shape& shape, DType dtype = DType::f32);
/// Standard normal. Takes one draw from the calling thread's generator. Throws ValueError for a
/// non-floating dtype or a negative size.
Tensor randn(const Shape& shape, DType dtype = DType::f32);
/// 1 with probability p, else 0, in any dtype. Takes one draw from the calling thread's
/// generator. Throws ValueError if p is outside [0, 1] or a size is negative.
Tensor bernoulli(const Shape& shape, double p, DType dtype = DType::f32);
/// Keep-mask for dropout: true with probability 1 - p (b8). Takes one draw from the calling
/// thread's generator. Throws ValueError if p is outside [0, 1] or a size is negative.
Tensor dropout_mask(const Shape& shape, double p);
/// x * mask / (1 - p) when training (mask = dropout_mask(x.shape(), p), so one draw), x itself
/// otherwise or when p == 0 (no draw). Floating x only; the result is contiguous, in x's dtype.
/// Throws ValueError if x is undefined or not floating, or p is outside [0, 1).
Tensor dropout(const Tensor& x, double p, bool training = true);

}  // namespace tessera
