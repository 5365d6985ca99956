// Fused scaled dot-product attention on CPU.
//
// Forward (per batch entry): query rows in blocks of kRows, keys in blocks of kCols. For a tile
// the scores S = scale * Q_i K_j^T (+ mask) come from one gemm; the online softmax keeps per row
// the running max m and the running sum l of exp(S - m), rescaling the accumulator O_i when m
// grows; O_i += P_ij V_j is the second gemm. Memory beyond the operands: one kRows x kCols tile.
// The rows' log-sum-exp m + log(l) is kept for the backward.
//
// When a row's keys all fit one tile (S <= kCols), the forward's tile holds the final softmax:
// it is normalised there and, when a backward will run, kept (L x S per batch entry) for it.
//
// Backward (flash-attention's): with D_i = rowsum(dO_i * O_i) and P_ij = exp(S_ij - lse_i)
// recomputed per tile (or read from the forward's), dV_j += P^T dO_i, dP = dO_i V_j^T, dS = P * (dP - D_i),
// dQ_i += scale * dS K_j, dK_j += scale * dS^T Q_i. Dropout multiplies P by the keep-mask Z / (1-p)
// where the forward did (in O and dV) and dP by it; D_i is unchanged since sum_j P Z dO.V = dO.O.
//
// Tiles are held transposed, [keys, query rows] (S^T = K_j Q_i^T from Q^T, made once per batch
// entry): a query row's softmax statistics are then elementwise across a tile row, and every
// product is one OpenBLAS's small-matrix kernels take unpacked.
//
// Everything is computed in f32 (f64 for f64 inputs) with OpenBLAS gemms on the tiles.
#include <tessera/ops/attention.hpp>


#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include <tessera/core/error.hpp>
#include <tessera/core/grad_mode.hpp>
#include <tessera/grad/engine.hpp>
#include <tessera/ops/detail/gemm.hpp>
#include <tessera/ops/detail/parallel.hpp>
#include <tessera/ops/internal/attention_kernel.hpp>
#include <tessera/ops/detail/vector_math.hpp>
#include <tessera/ops/shape_ops.hpp>
#include <tessera/ops/tensor_grad_ops.hpp>

namespace tessera {

namespace {

constexpr int64_t kRows = 64;
constexpr int64_t kCols = 128;
// Causal: smaller row blocks, each with tiles only as wide as its last row attends, so that most
// of the masked triangle is never computed (a quarter of the scores at L = S = 64 with 32 rows).
constexpr int64_t kCausalRows = 32;
// Batch entries per chunk at least, when a rank's intra-op threads share them.
constexpr int64_t kBatchGrain = 4;

using detail::gemm;
using detail::parallel_for;

// The batch dims of a [batch..., L, X] shape.
Shape batch_of(const Shape& s) {
  Shape b;
  for (int64_t d = 0; d + 2 < s.size(); ++d) b.push_back(s[d]);
  return b;
}

// Element offset of each batch entry (row-major over the batch dims) in a tensor with these strides.
std::vector<int64_t> offsets_of_batches(const Shape& shape, const Strides& strides) {
  std::vector<int64_t> offsets{0};
  for (int64_t d = 0; d + 2 < shape.size(); ++d) {
    std::vector<int64_t> next;
    for (int64_t base : offsets)
      for (int64_t i = 0; i < shape[d]; ++i) next.push_back(base + i * strides[d]);
    offsets = std::move(next);
  }
  return offsets;
}

// An operand [batch..., rows, cols] as the kernels read (or write) it: per batch entry a row-major
// matrix with leading dimension `ld`. Heads split off a [b, s, h, d] tensor by a permute are read
// in place (ld = h * d), with no copy.
template <class T>
struct Matrices {
  T* data;
  std::vector<int64_t> offsets;
  int64_t ld;
  T* operator[](int64_t b) const { return data + offsets[static_cast<size_t>(b)]; }
};

template <class C, class Tn>
auto matrices(Tn& t) {
  using T = std::conditional_t<std::is_const_v<Tn>, const C, C>;
  const int64_t nd = t.ndim();
  const int64_t cols = t.shape()[nd - 1];
  T* data = t.template data<C>();
  const int64_t ld = std::max(t.strides()[nd - 2], std::max<int64_t>(cols, 1));
  return Matrices<T>{data, offsets_of_batches(t.shape(), t.strides()), ld};
}

// Whether the kernels can read `t` in place: rows contiguous and apart (BLAS needs ld >= cols).
bool readable_in_place(const Tensor& t) {
  const int64_t nd = t.ndim();
  const int64_t rows = t.shape()[nd - 2], cols = t.shape()[nd - 1];
  return (cols <= 1 || t.strides()[nd - 1] == 1) && (rows <= 1 || t.strides()[nd - 2] >= cols);
}

// A tensor of `shape` laid out in the dim order of `like` (its strides' order): gradients and
// outputs of operands read in place come out in their operands' layout, so that the permute
// back to [b, s, h, d] is a view again.
Tensor empty_in_order_of(const Shape& shape, DType dtype, const Tensor& like, bool zeroed) {
  const int64_t nd = shape.size();
  std::vector<int64_t> order(static_cast<size_t>(nd));
  for (int64_t d = 0; d < nd; ++d) order[static_cast<size_t>(d)] = d;
  const Strides& st = like.strides();
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return st[a] > st[b]; });
  order.erase(std::remove(order.begin(), order.end(), nd - 1), order.end());  // the last dim stays innermost
  order.push_back(nd - 1);
  DimVector permuted;
  for (int64_t d : order) permuted.push_back(shape[d]);
  const Tensor storage = zeroed ? zeros(Shape(permuted), dtype) : empty(Shape(permuted), dtype);
  std::vector<int64_t> inverse(static_cast<size_t>(nd));
  for (int64_t i = 0; i < nd; ++i) inverse[static_cast<size_t>(order[static_cast<size_t>(i)])] = i;
  return storage.permute(inverse);
}

// Per row r of a tile t [cols, rows]: acc[r] = op(acc[r], t[c, r]) over the columns c. The rows
// go a vector register at a time, held there across the columns: a running acc in memory would
// make each column wait on the last one's store.
template <class C, class Op>
void fold_columns(const C* t, int64_t rows, int64_t cols, C* acc, Op op) {
  constexpr int64_t kLanes = 64 / sizeof(C);
  int64_t r0 = 0;
  for (; r0 + kLanes <= rows; r0 += kLanes) {
    C lanes[kLanes];
    std::copy(acc + r0, acc + r0 + kLanes, lanes);
    for (int64_t c = 0; c < cols; ++c) {
      const C* column = t + c * rows + r0;
#pragma omp simd
      for (int64_t r = 0; r < kLanes; ++r) lanes[r] = op(lanes[r], column[r]);
    }
    std::copy(lanes, lanes + kLanes, acc + r0);
  }
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = r0; r < rows; ++r) acc[r] = op(acc[r], t[c * rows + r]);
}

// m [rows, cols] (leading dimension ld) transposed into out [cols, rows]: the tiles' products
// then read Q^T and dO^T as plain operands, since OpenBLAS's small-matrix kernels (no packing)
// take A B but not A B^T, which goes through the packed path at half the speed.
template <class C>
void transposed(const C* m, int64_t rows, int64_t cols, int64_t ld, std::vector<C>& out) {
  out.resize(static_cast<size_t>(rows * cols));
  if (rows > 0 && cols > 0) detail::transpose(rows, cols, m, ld, out.data(), rows);
}

// The scores [batch..., L, S] of q [batch..., L, E] and k [batch..., S, E], one batch entry and
// one tile at a time, transposed: st[c, r] = scale * k_c . q_r, then the causal mask and the
// attention mask, as -inf (masked) or added values. Transposed so that the softmax's statistics
// per query row (max, sum) are elementwise over a tile row instead of horizontal reductions.
template <class C>
class Scores {
 public:
  Scores(const detail::AttentionCall& call, const Shape& q, const Shape& k)
      : call_(call), shape_(batch_of(q)), nd_(q.size()), L_(q[nd_ - 2]), S_(k[nd_ - 2]) {
    shape_.push_back(L_);
    shape_.push_back(S_);
    if (call.mask) {
      // The mask in a compact dtype, broadcast to the scores (stride 0 where it repeats).
      mask_ = call.mask->dtype() == DType::b8 ? *call.mask : call.mask->to(compute_dtype(call.mask->dtype()));
      mask_ = mask_.expand(shape_);
      is_bool_ = mask_.dtype() == DType::b8;
      batch_offsets_ = offsets_of_batches(shape_, mask_.strides());
    }
    for (int64_t d = 0; d + 2 < nd_; ++d) batches_ *= shape_[d];
    if (call.dropout_p > 0) keep_scale_ = static_cast<C>(1.0 / (1.0 - call.dropout_p));
  }

  int64_t batches() const { return batches_; }

  // The global row of local row i, and column of local column j.
  int64_t row0() const { return call_.origin[nd_ - 2]; }
  int64_t col0() const { return call_.origin[nd_ - 1]; }

  // Whether the tile starting at column j0 lies wholly above the causal diagonal of rows ending at i_last.
  bool skipped(int64_t i_last, int64_t j0) const { return call_.is_causal && col0() + j0 > row0() + i_last; }

  // Query rows per block.
  int64_t row_block() const { return call_.is_causal ? kCausalRows : kRows; }
  // The width of the tile at column j0 for rows ending at i_last: the columns its last row attends.
  int64_t tile_cols(int64_t i_last, int64_t j0) const { return live(i_last, j0, std::min(kCols, S_ - j0)); }

  // How many of the columns j0 .. j0 + cols row i may attend to under the causal mask: they come
  // first (all of them without it).
  int64_t live(int64_t i, int64_t j0, int64_t cols) const {
    if (!call_.is_causal) return cols;
    return std::clamp<int64_t>(row0() + i - col0() - j0 + 1, 0, cols);
  }

  // The first of rows i0 .. i0 + rows that column j0 + c is live for under the causal mask (the
  // rows before it are masked; 0 without the mask).
  int64_t first_live(int64_t c, int64_t j0, int64_t i0, int64_t rows) const {
    if (!call_.is_causal) return 0;
    return std::clamp<int64_t>(col0() + j0 + c - row0() - i0, 0, rows);
  }

  // st[c, r] for columns j0.., rows i0..: scale * k_c . q_r, masked. qt: this batch entry's Q
  // transposed, [e, L]. The causally masked scores are set to -inf only with `causal_inf`: what
  // exponentiate() makes of them does not depend on it, only a max over the tile does.
  void fill(int64_t b, const C* k, int64_t ldk, const C* qt, int64_t e, int64_t i0, int64_t rows, int64_t j0,
            int64_t cols, C* st, bool causal_inf) const {
    gemm(false, false, cols, rows, e, static_cast<C>(call_.scale), k + j0 * ldk, ldk, qt + i0, L_, C(0), st, rows);
    const C minus_inf = -std::numeric_limits<C>::infinity();
    // The causal prefixes by a select over the whole column (vectorised): a fill per column was a
    // library call for a few elements.
    if (call_.is_causal && causal_inf) {
      for (int64_t c = 0; c < cols; ++c) {
        C* column = st + c * rows;
        const int64_t first = first_live(c, j0, i0, rows);
#pragma omp simd
        for (int64_t r = 0; r < rows; ++r) column[r] = r < first ? minus_inf : column[r];
      }
    }
    if (!mask_.defined()) return;
    const Strides& strides = mask_.strides();
    const int64_t sl = strides[nd_ - 2], ss = strides[nd_ - 1];
    const int64_t base = batch_offsets_[static_cast<size_t>(b)] + i0 * sl + j0 * ss;
    for (int64_t c = 0; c < cols; ++c) {
      C* row = st + c * rows;
      if (is_bool_) {
        const bool* m = mask_.data<bool>() + base + c * ss;
        for (int64_t r = 0; r < rows; ++r)
          if (!m[r * sl]) row[r] = minus_inf;
      } else {
        const C* m = mask_.data<C>() + base + c * ss;
        for (int64_t r = 0; r < rows; ++r) row[r] += m[r * sl];
      }
    }
  }

  // st[c, r] = exp(st[c, r] - shift[r]) over the tile at columns j0.., rows i0..: one exp for the
  // whole tile. The causally masked scores (first in each column) go in as 0 and come out as 0,
  // since libmvec's exp takes a slow scalar path for -inf. With `total`, each row's sum is added
  // to it.
  void exponentiate(C* st, const C* shift, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                    C* total = nullptr) const {
    for (int64_t c = 0; c < cols; ++c) {
      C* column = st + c * rows;
      const int64_t first = first_live(c, j0, i0, rows);
#pragma omp simd
      for (int64_t r = 0; r < rows; ++r) column[r] = r < first ? C(0) : column[r] - shift[r];
    }
    detail::vexp(st, st, rows * cols);
    for (int64_t c = 0; c < cols; ++c) {
      C* column = st + c * rows;
      const int64_t first = first_live(c, j0, i0, rows);
#pragma omp simd
      for (int64_t r = 0; r < rows; ++r) column[r] = r < first ? C(0) : column[r];
    }
    if (total) fold_columns(st, rows, cols, total, [](C a, C b) { return a + b; });
  }

  // st[c, r] scaled by the dropout keep-mask z [rows, cols] of the tile: kept / (1 - p), else 0.
  void drop(const Tensor& keep, int64_t rows, int64_t cols, const C* st, C* out) const {
    const bool* z = keep.data<bool>();
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < rows; ++r) out[c * rows + r] = z[r * cols + c] ? st[c * rows + r] * keep_scale_ : C(0);
  }

  // The dropout keep-mask of the tile (empty when there is no dropout): the same block of the
  // global draw whatever the sharding.
  Tensor keep(int64_t b, int64_t i0, int64_t rows, int64_t j0, int64_t cols) const {
    if (call_.dropout_p <= 0) return Tensor();
    Shape begin = call_.origin, block = Shape::filled(nd_, 1);
    int64_t rest = b;
    for (int64_t d = nd_ - 3; d >= 0; --d) {
      begin[d] += rest % shape_[d];
      rest /= shape_[d];
    }
    begin[nd_ - 2] += i0;
    begin[nd_ - 1] += j0;
    block[nd_ - 2] = rows;
    block[nd_ - 1] = cols;
    return random_block(call_.draw, call_.scores_shape, begin, block);
  }

  int64_t L() const { return L_; }
  int64_t S() const { return S_; }

 private:
  const detail::AttentionCall& call_;
  Shape shape_;
  int64_t nd_, L_, S_;
  Tensor mask_;
  bool is_bool_ = false;
  std::vector<int64_t> batch_offsets_;
  int64_t batches_ = 1;
  C keep_scale_ = 1;
};

// p [cols, rows] = the tile t [cols, rows] of exp(S - m) divided by its rows' sums l: the softmax
// P (p may be t). A row with nothing to attend to (l = 0) gets 0, as the backward's
// recomputation gives it; its output is set to NaN apart.
template <class C>
void normalise(const C* t, int64_t rows, int64_t cols, const C* l, C* p) {
  C inverse[kRows];
  for (int64_t r = 0; r < rows; ++r) inverse[r] = l[r] > C(0) ? C(1) / l[r] : C(0);
  for (int64_t c = 0; c < cols; ++c) {
    const C* column = t + c * rows;
    C* out = p + c * rows;
#pragma omp simd
    for (int64_t r = 0; r < rows; ++r) out[r] = column[r] * inverse[r];
  }
}

template <class C>
void forward_kernel(const Tensor& q, const Tensor& k, const Tensor& v, const detail::AttentionCall& call, Tensor& out,
                    Tensor& lse, Tensor& probs) {
  const Scores<C> scores(call, q.shape(), k.shape());
  const int64_t L = scores.L(), S = scores.S(), E = q.shape()[q.ndim() - 1], F = v.shape()[v.ndim() - 1];
  const auto qm = matrices<C>(q), km = matrices<C>(k), vm = matrices<C>(v);
  const auto om = matrices<C>(out);
  C* ld = lse.data<C>();
  C* saved = probs.defined() ? probs.data<C>() : nullptr;
  // A row's scores all in one tile: its softmax is final there, and P is normalised before P V.
  const bool one_tile = S <= kCols;
  const C minus_inf = -std::numeric_limits<C>::infinity();
  // Batch entries are independent: split over the rank's intra-op threads, each with its buffers.
  parallel_for(scores.batches(), kBatchGrain, [&](int64_t b_begin, int64_t b_end) {
    std::vector<C> st(static_cast<size_t>(kRows * kCols)), dropped(st.size()), acc(static_cast<size_t>(kRows * F)), qt;
    // Per query row of the block: the running max m and sum l, and the tile's max, shift, rescale and sum.
    std::vector<C> m(kRows), l(kRows), top(kRows), shift(kRows), rescale(kRows), total(kRows);
    for (int64_t b = b_begin; b < b_end; ++b) {
      transposed(qm[b], L, E, qm.ld, qt);
      const C* kb = km[b];
      const C* vb = vm[b];
      C* ob = om[b];
      for (int64_t i0 = 0; i0 < L; i0 += scores.row_block()) {
        const int64_t rows = std::min(scores.row_block(), L - i0);
        std::fill(m.begin(), m.end(), minus_inf);
        std::fill(l.begin(), l.end(), C(0));
        std::fill(acc.begin(), acc.end(), C(0));
        for (int64_t j0 = 0; j0 < S && !scores.skipped(i0 + rows - 1, j0); j0 += kCols) {
          const int64_t cols = scores.tile_cols(i0 + rows - 1, j0);
          C* t = st.data();
          scores.fill(b, kb, km.ld, qt.data(), E, i0, rows, j0, cols, t, /*causal_inf=*/true);
          // The rows' new maxima (masked scores are -inf), their shift (0 for a row with nothing to
          // attend to yet: its scores stay -inf) and the rescale of what they had, exp(m - top)
          // (exp(0) for a row's first scores, whose l and acc are still 0).
          std::copy(m.begin(), m.begin() + rows, top.begin());
          fold_columns(t, rows, cols, top.data(), [](C a, C b) { return std::max(a, b); });
          for (int64_t r = 0; r < rows; ++r) {
            shift[r] = top[r] == minus_inf ? C(0) : top[r];
            rescale[r] = m[r] == minus_inf ? C(0) : m[r] - top[r];
            total[r] = C(0);
          }
          detail::vexp(rescale.data(), rescale.data(), rows);
          // P = exp(S - shift), summed per row.
          scores.exponentiate(t, shift.data(), i0, rows, j0, cols, total.data());
          for (int64_t r = 0; r < rows; ++r) {
            l[r] = l[r] * rescale[r] + total[r];
            m[r] = top[r];
            for (int64_t f = 0; f < F; ++f) acc[r * F + f] *= rescale[r];
          }
          // With one tile: P itself, into the kept probabilities when the backward reads them.
          if (one_tile) {
            C* normalised = saved ? saved + (b * L + i0) * S : t;
            normalise(t, rows, cols, l.data(), normalised);
            t = normalised;
          }
          const Tensor keep = scores.keep(b, i0, rows, j0, cols);
          const C* p = t;
          if (keep.defined()) {
            scores.drop(keep, rows, cols, t, dropped.data());
            p = dropped.data();
          }
          // O_i += P V_j, with P^T in hand.
          gemm(true, false, rows, F, cols, C(1), p, rows, vb + j0 * vm.ld, vm.ld, C(1), acc.data(), F);
        }
        for (int64_t r = 0; r < rows; ++r) {
          // A row with every score masked has l = 0: 0/0 = NaN, as softmax gives.
          if (one_tile && l[r] > C(0))
            std::copy(acc.begin() + r * F, acc.begin() + (r + 1) * F, ob + (i0 + r) * om.ld);
          else
            for (int64_t f = 0; f < F; ++f) ob[(i0 + r) * om.ld + f] = acc[r * F + f] / l[r];
          ld[b * L + i0 + r] = m[r] + std::log(l[r]);
        }
      }
    }
  });
}

template <class C>
void backward_kernel(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor& lse, const Tensor& probs, const detail::AttentionCall& call, Tensor& dq, Tensor& dk,
                     Tensor& dv) {
  const Scores<C> scores(call, q.shape(), k.shape());
  const int64_t L = scores.L(), S = scores.S(), E = q.shape()[q.ndim() - 1], F = v.shape()[v.ndim() - 1];
  const C scale = static_cast<C>(call.scale);
  const auto qm = matrices<C>(q), km = matrices<C>(k), vm = matrices<C>(v), gm = matrices<C>(g), om = matrices<C>(out);
  const auto dqm = matrices<C>(dq), dkm = matrices<C>(dk), dvm = matrices<C>(dv);
  const C minus_inf = -std::numeric_limits<C>::infinity();
  const C* saved = probs.defined() ? probs.data<C>() : nullptr;
  parallel_for(scores.batches(), kBatchGrain, [&](int64_t b_begin, int64_t b_end) {
    std::vector<C> pt(static_cast<size_t>(kRows * kCols)), dpt(pt.size()), dropped(pt.size()), D(kRows), shift(kRows);
    std::vector<C> qt, gt, ot;
    for (int64_t b = b_begin; b < b_end; ++b) {
      const C* qb = qm[b];
      const C* kb = km[b];
      const C* vb = vm[b];
      const C* gb = gm[b];
      const C* ob = om[b];
      const C* lb = lse.data<C>() + b * L;
      C* dqb = dqm[b];
      C* dkb = dkm[b];
      C* dvb = dvm[b];
      if (!saved) transposed(qb, L, E, qm.ld, qt);
      transposed(gb, L, F, gm.ld, gt);
      transposed(ob, L, F, om.ld, ot);
      for (int64_t i0 = 0; i0 < L; i0 += scores.row_block()) {
        const int64_t rows = std::min(scores.row_block(), L - i0);
        // D_i = rowsum(dO_i * O_i), elementwise over the rows from dO^T and O^T.
        std::fill(D.begin(), D.end(), C(0));
        for (int64_t f = 0; f < F; ++f) {
          const C* gf = gt.data() + f * L + i0;
          const C* of = ot.data() + f * L + i0;
          C* d = D.data();
#pragma omp simd
          for (int64_t r = 0; r < rows; ++r) d[r] += gf[r] * of[r];
        }
        // A row masked everywhere has lse = -inf: shifted by 0 it stays -inf.
        for (int64_t r = 0; r < rows; ++r) shift[r] = lb[i0 + r] == minus_inf ? C(0) : lb[i0 + r];
        for (int64_t j0 = 0; j0 < S && !scores.skipped(i0 + rows - 1, j0); j0 += kCols) {
          const int64_t cols = scores.tile_cols(i0 + rows - 1, j0);
          // P^T = exp(S^T - lse), kept by the forward or recomputed.
          const C* p = saved ? saved + (b * L + i0) * S : pt.data();
          if (!saved) {
            scores.fill(b, kb, km.ld, qt.data(), E, i0, rows, j0, cols, pt.data(), /*causal_inf=*/false);
            scores.exponentiate(pt.data(), shift.data(), i0, rows, j0, cols);
          }
          // dP^T (of the dropped weights) = V_j dO_i^T.
          gemm(false, false, cols, rows, F, C(1), vb + j0 * vm.ld, vm.ld, gt.data() + i0, L, C(0), dpt.data(), rows);
          const Tensor keep = scores.keep(b, i0, rows, j0, cols);
          const C* weights = p;
          if (keep.defined()) {
            scores.drop(keep, rows, cols, p, dropped.data());
            scores.drop(keep, rows, cols, dpt.data(), dpt.data());
            weights = dropped.data();
          }
          // dV_j += (P Z/(1-p))^T dO_i.
          gemm(false, false, cols, F, rows, C(1), weights, rows, gb + i0 * gm.ld, gm.ld, C(1), dvb + j0 * dvm.ld,
               dvm.ld);
          // dS^T = P^T * (dP^T - D_i), into dpt.
          for (int64_t c = 0; c < cols; ++c)
            for (int64_t r = 0; r < rows; ++r) dpt[c * rows + r] = p[c * rows + r] * (dpt[c * rows + r] - D[r]);
          gemm(true, false, rows, E, cols, scale, dpt.data(), rows, kb + j0 * km.ld, km.ld, C(1), dqb + i0 * dqm.ld,
               dqm.ld);
          gemm(false, false, cols, E, rows, scale, dpt.data(), rows, qb + i0 * qm.ld, qm.ld, C(1), dkb + j0 * dkm.ld,
               dkm.ld);
        }
      }
    }
  });
}

// The operand in the compute dtype, as the kernels can read it: itself when it already is (a
// permuted view of heads included), else a contiguous copy.
Tensor compute_copy(const Tensor& t) {
  const Tensor c = t.to(compute_dtype(t.dtype()));
  return readable_in_place(c) ? c : c.contiguous();
}

}  // namespace

Shape attention_output_shape(const AttentionOperands& o, double dropout_p, bool is_causal, const char* op) {
  const auto shapes = [&] {
    return detail::concat("q ", o.q.to_string(), ", k ", o.k.to_string(), ", v ", o.v.to_string(),
                  o.mask ? ", attn_mask " + o.mask->to_string() : std::string());
  };
  TESSERA_CHECK(is_floating(o.dtype), ValueError, op, "unsupported dtype ", name(o.dtype),
                "; expected a floating dtype (f32, f64, f16, bf16)");
  TESSERA_CHECK(o.k_dtype == o.dtype && o.v_dtype == o.dtype, ValueError, op, "q, k and v differ in dtype (",
                name(o.dtype), ", ", name(o.k_dtype), ", ", name(o.v_dtype), ")");
  const int64_t nd = o.q.size();
  TESSERA_CHECK(nd >= 2 && o.k.size() == nd && o.v.size() == nd, ValueError, op, "shapes ", shapes(),
                ": expected q [..., L, E], k [..., S, E], v [..., S, Ev] with the same number of dims (at least 2)");
  TESSERA_CHECK(batch_of(o.q) == batch_of(o.k) && batch_of(o.q) == batch_of(o.v), ValueError, op, "shapes ",
                shapes(), ": the leading (batch, head) dims of q, k and v differ");
  TESSERA_CHECK(o.q[nd - 1] == o.k[nd - 1], ValueError, op, "shapes ", shapes(), ": q and k differ in the last dim E");
  TESSERA_CHECK(o.k[nd - 2] == o.v[nd - 2], ValueError, op, "shapes ", shapes(),
                ": k and v differ in the sequence dim S");
  TESSERA_CHECK(dropout_p >= 0 && dropout_p < 1, ValueError, op, "dropout_p = ", dropout_p,
                " is outside [0, 1); expected 0 <= p < 1");
  if (o.mask) {
    TESSERA_CHECK(!is_causal, ValueError, op, "is_causal and attn_mask were both given; pass one of them");
    TESSERA_CHECK(o.mask_dtype == DType::b8 || o.mask_dtype == o.dtype, ValueError, op, "attn_mask dtype ",
                  name(o.mask_dtype), ": expected b8 (true = attend) or q's dtype ", name(o.dtype),
                  " (added to the scores)");
    Shape scores = batch_of(o.q);
    scores.push_back(o.q[nd - 2]);
    scores.push_back(o.k[nd - 2]);
    bool fits = o.mask->size() <= scores.size();
    for (int64_t d = 0; fits && d < o.mask->size(); ++d) {
      const int64_t m = (*o.mask)[o.mask->size() - 1 - d];
      fits = m == 1 || m == scores[scores.size() - 1 - d];
    }
    TESSERA_CHECK(fits, ValueError, op, "shapes ", shapes(), ": attn_mask does not broadcast to the scores ",
                  scores.to_string());
  }
  Shape out = o.q;
  out[nd - 1] = o.v[nd - 1];
  return out;
}

detail::AttentionCall detail::attention_call(const AttentionOperands& operands, double dropout_p, bool is_causal,
                                             std::optional<double> scale, const char* op) {
  attention_output_shape(operands, dropout_p, is_causal, op);
  const int64_t nd = operands.q.size();
  AttentionCall call;
  call.is_causal = is_causal;
  call.scale = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(operands.q[nd - 1]));
  call.dropout_p = dropout_p;
  call.scores_shape = batch_of(operands.q);
  call.scores_shape.push_back(operands.q[nd - 2]);
  call.scores_shape.push_back(operands.k[nd - 2]);
  call.origin = Shape::filled(nd, 0);
  // After the checks, so every rank that gets here takes the draw (SPMD: generators stay in step).
  if (dropout_p > 0) call.draw = default_generator().next(Distribution::bernoulli, 1.0 - dropout_p, 0, DType::b8);
  return call;
}

Tensor detail::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionCall& call,
                                 Tensor& lse, Tensor* probs) {
  const Tensor qc = compute_copy(q), kc = compute_copy(k), vc = compute_copy(v);
  const DType c = qc.dtype();
  Shape out_shape = q.shape();
  out_shape[out_shape.size() - 1] = v.shape()[v.ndim() - 1];
  Tensor out = empty_in_order_of(out_shape, c, qc, false);
  Shape lse_shape = batch_of(q.shape());
  lse_shape.push_back(q.shape()[q.ndim() - 2]);
  lse = empty(lse_shape, c);
  Tensor kept;
  if (probs && k.shape()[k.ndim() - 2] <= kCols) kept = empty(Shape{lse.numel() * k.shape()[k.ndim() - 2]}, c);
  if (c == DType::f64) forward_kernel<double>(qc, kc, vc, call, out, lse, kept);
  else forward_kernel<float>(qc, kc, vc, call, out, lse, kept);
  if (probs) *probs = kept;
  return out.to(q.dtype());
}

std::array<Tensor, 3> detail::attention_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor& out, const Tensor& lse, const AttentionCall& call,
                                                 const Tensor& probs) {
  const Tensor gc = compute_copy(g), qc = compute_copy(q), kc = compute_copy(k), vc = compute_copy(v),
               oc = compute_copy(out);
  const DType c = qc.dtype();
  Tensor dq = empty_in_order_of(q.shape(), c, qc, true), dk = empty_in_order_of(k.shape(), c, kc, true),
         dv = empty_in_order_of(v.shape(), c, vc, true);
  if (c == DType::f64) backward_kernel<double>(gc, qc, kc, vc, oc, lse, probs, call, dq, dk, dv);
  else backward_kernel<float>(gc, qc, kc, vc, oc, lse, probs, call, dq, dk, dv);
  return {dq.to(q.dtype()), dk.to(k.dtype()), dv.to(v.dtype())};
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const std::optional<Tensor>& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale) {
  constexpr const char* op = "scaled_dot_product_attention";
  TESSERA_CHECK(q.defined() && k.defined() && v.defined() && (!attn_mask || attn_mask->defined()), ValueError, op,
                "an operand is undefined");
  detail::AttentionCall call = detail::attention_call(detail::attention_operands(q, k, v, attn_mask, op), dropout_p,
                                                     is_causal, scale, op);
  call.mask = attn_mask ? &*attn_mask : nullptr;
  const bool grads = autograd::needs_grad<Tensor>({&q, &k, &v});
  Tensor lse, probs;
  Tensor out = detail::attention_forward(q, k, v, call, lse, grads ? &probs : nullptr);
  if (grads) {
    const std::optional<Tensor> mask = attn_mask ? std::optional<Tensor>(attn_mask->detach()) : std::nullopt;
    autograd::record<Tensor>(op, out, {&q, &k, &v},
                             [q = q.detach(), k = k.detach(), v = v.detach(), o = out.detach(), lse, probs, mask,
                              call](const Tensor& g) mutable {
                               call.mask = mask ? &*mask : nullptr;
                               const auto grads = detail::attention_backward(g, q, k, v, o, lse, call, probs);
                               return std::vector<Tensor>{grads[0], grads[1], grads[2]};
                             });
  }
  return out;
}

}  // namespace tessera
