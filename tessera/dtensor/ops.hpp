#pragma once
// The op library on DTensor: the same names and signatures as on Tensor (ops/*.hpp), decided by
// sharding rules (sharding/op_rules.hpp) and run on the shards. Every rank of the mesh makes the
// same calls (SPMD); an op communicates only where its inputs must be redistributed.
//
// Mixed operands: a Scalar, or a 0-d Tensor, is a replicated operand; any other Tensor beside a
// DTensor throws ShardingError naming the op. Operands on different meshes throw ShardingError.
// Shape errors throw ValueError as the Tensor op does.
#include <optional>
#include <utility>
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/scalar.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/ops/attention.hpp>
#include <tessera/ops/einsum.hpp>
#include <tessera/ops/nn.hpp>
#include <tessera/ops/op_table.hpp>
#include <tessera/ops/shape_ops.hpp>
#include <tessera/ops/values_indices.hpp>

namespace tessera TESSERA_API {

// --- elementwise: every elementwise row of the op table (ops/op_table.hpp); binary ops broadcast,
// take a Scalar or a 0-d Tensor on either side; dtypes as in ops/elementwise.hpp -------------------
#define TESSERA_DTENSOR_UNARY_DECL(name, ...) DTensor name(const DTensor& x);
TESSERA_UNARY_OPS(TESSERA_DTENSOR_UNARY_DECL)
#undef TESSERA_DTENSOR_UNARY_DECL
#define TESSERA_DTENSOR_BINARY_DECL(name, ...)       \
  DTensor name(const DTensor& a, const DTensor& b); \
  DTensor name(const DTensor& a, Scalar b);         \
  DTensor name(Scalar a, const DTensor& b);         \
  DTensor name(const DTensor& a, const Tensor& b);  \
  DTensor name(const Tensor& a, const DTensor& b);
TESSERA_BINARY_OPS(TESSERA_DTENSOR_BINARY_DECL)
TESSERA_COMPARISON_OPS(TESSERA_DTENSOR_BINARY_DECL)
#undef TESSERA_DTENSOR_BINARY_DECL
DTensor logical_not(const DTensor& x);

DTensor operator+(const DTensor& a, const DTensor& b);
DTensor operator-(const DTensor& a, const DTensor& b);
DTensor operator*(const DTensor& a, const DTensor& b);
DTensor operator/(const DTensor& a, const DTensor& b);
DTensor operator+(const DTensor& a, Scalar b);
DTensor operator+(Scalar a, const DTensor& b);
DTensor operator-(const DTensor& a, Scalar b);
DTensor operator-(Scalar a, const DTensor& b);
DTensor operator*(const DTensor& a, Scalar b);
DTensor operator*(Scalar a, const DTensor& b);
DTensor operator/(const DTensor& a, Scalar b);
DTensor operator/(Scalar a, const DTensor& b);
DTensor operator-(const DTensor& x);

DTensor clamp(const DTensor& x, Scalar lo, Scalar hi);

/// cond ? a : b; with a Partial a and b of one op (cond not Partial) the result stays Partial.
DTensor where(const DTensor& cond, const DTensor& a, const DTensor& b);
DTensor where(const DTensor& cond, const DTensor& a, Scalar b);
DTensor where(const DTensor& cond, Scalar a, const DTensor& b);
DTensor masked_fill(const DTensor& x, const DTensor& mask, Scalar value);

// --- reductions (a sharded reduced dim gives a Partial: sum -> P(sum), amax -> P(max),
// amin -> P(min), prod -> P(product), mean -> P(avg) when every rank reduces as many elements,
// else P(sum) of local sums over the global count; var/argmax/argmin gather the reduced dims) --
DTensor sum(const DTensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
DTensor mean(const DTensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
DTensor prod(const DTensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
DTensor amax(const DTensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
DTensor amin(const DTensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
DTensor var(const DTensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
DTensor argmax(const DTensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
DTensor argmin(const DTensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
/// Composites of the reductions above, so a sharded reduced dim is reduced once, on the small
/// result (semantics as on Tensor, ops/reduce.hpp): logsumexp (amax then a P(sum)), std,
/// vector_norm (ord 2, 1, inf, -inf, 0, p), all, any, max/min along a dim with indices.
DTensor logsumexp(const DTensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
DTensor std(const DTensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
DTensor vector_norm(const DTensor& x, double ord = 2, const std::vector<int64_t>& dims = {}, bool keepdim = false);
DTensor all(const DTensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
DTensor any(const DTensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
ValuesIndices<DTensor> max(const DTensor& x, int64_t dim, bool keepdim = false);
ValuesIndices<DTensor> min(const DTensor& x, int64_t dim, bool keepdim = false);

// --- indexing along one dim (semantics as on Tensor, ops/indexing.hpp) ------------------------
// The indexed dim is gathered where it holds positions; the other dims stay sharded where x,
// index and src agree in size (sharding/index_rules.cpp). index_add with a sharded index adds
// each rank's rows into a Partial(sum); its alpha scales src where src lies. On DTensor, src must
// have index's shape.
DTensor gather(const DTensor& x, int64_t dim, const DTensor& index);
DTensor scatter(const DTensor& x, int64_t dim, const DTensor& index, const DTensor& src);
DTensor scatter_add(const DTensor& x, int64_t dim, const DTensor& index, const DTensor& src);
DTensor index_select(const DTensor& x, int64_t dim, const DTensor& index);
DTensor index_add(const DTensor& x, int64_t dim, const DTensor& index, const DTensor& src, Scalar alpha = 1);

// --- scans and sorting along one dim (semantics as on Tensor, ops/sort_scan.hpp) --------------
/// A sharded dim is scanned in place: a local scan, then an exclusive scan of the pieces' totals
/// (one all_gather of one slice per piece over the mesh dims sharding it, all of them at once, in
/// any shard order); the result keeps x's layout. cumsum keeps P(sum)/P(avg) (linear), cumprod
/// reduces Partials first.
DTensor cumsum(const DTensor& x, int64_t dim);
DTensor cumprod(const DTensor& x, int64_t dim);
/// The dim is gathered (Replicate) first; the other dims stay sharded.
ValuesIndices<DTensor> sort(const DTensor& x, int64_t dim = -1, bool descending = false);
/// Over a sharded dim: a local topk on each piece, the k candidates of each piece gathered over
/// the mesh dims sharding it (k per piece moves, not the dim, in any shard order), a topk of the
/// candidates; the result's dim is replicated over those mesh dims. Other dims stay sharded.
ValuesIndices<DTensor> topk(const DTensor& x, int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true);

// --- linear algebra: S(0) x R -> S(0), R x S(1) -> S(1), S(1) x S(0) -> P(sum), batch dims pass
DTensor matmul(const DTensor& a, const DTensor& b);
DTensor bmm(const DTensor& a, const DTensor& b);
/// x @ weight^T + bias; with a sharded contraction the bias joins the Partial output once.
DTensor linear(const DTensor& x, const DTensor& weight, const std::optional<DTensor>& bias = std::nullopt);

/// Einstein summation (ops/einsum.hpp); its equation is its sharding rule: a letter sharded on
/// every operand that has it stays sharded, a contracted letter sharded gives P(sum). A repeated
/// letter (a diagonal) is first contracted with a replicated identity, so its two dims may be
/// sharded alike (a local slice of the identity) or apart (a Partial).
DTensor einsum(std::string_view equation, const std::vector<DTensor>& operands);
/// beta * input + alpha * (mat1 @ mat2) / bmm(batch1, batch2), as on Tensor.
DTensor addmm(const DTensor& input, const DTensor& mat1, const DTensor& mat2, double beta = 1.0, double alpha = 1.0);
DTensor baddbmm(const DTensor& input, const DTensor& batch1, const DTensor& batch2, double beta = 1.0,
                double alpha = 1.0);

// --- nn ------------------------------------------------------------------------------------------
/// The normalised dim is gathered if sharded; the others stay sharded.
DTensor softmax(const DTensor& x, int64_t dim);
DTensor log_softmax(const DTensor& x, int64_t dim);
DTensor layer_norm(const DTensor& x, const Shape& normalized_shape, const std::optional<DTensor>& weight = std::nullopt,
                   const std::optional<DTensor>& bias = std::nullopt, double eps = 1e-5);
DTensor rms_norm(const DTensor& x, const Shape& normalized_shape, const std::optional<DTensor>& weight = std::nullopt,
                 double eps = 1e-6);
/// Vocabulary-sharded weight (S(0)): each rank looks up the rows it holds, a Partial(sum) reduced
/// on demand; weight sharded on the embedding dim (S(1)): output sharded on its last dim.
/// padding_idx as on Tensor: row padding_idx gets no gradient (zeroed by the rank holding it).
DTensor embedding(const DTensor& weight, const DTensor& indices, std::optional<int64_t> padding_idx = std::nullopt);
/// Class dim sharded (vocabulary parallel): the loss without gathering the logits (max and
/// sum-exp reduced across the class shards). Semantics as the Tensor cross_entropy.
DTensor cross_entropy(const DTensor& logits, const DTensor& target, int64_t ignore_index = -100,
                      Reduction reduction = Reduction::mean);

/// x * mask / (1 - p) with the mask of the unsharded dropout (one draw, each rank generating its
/// block of it): equals dropout(x.full_tensor(), p) bit for bit; x itself when p == 0 or not
/// training. No communication.
DTensor dropout(const DTensor& x, double p, bool training = true);
/// -log_probs[target] reduced as cross_entropy; with the class dim sharded each rank picks the
/// classes it holds (a P(sum)): the log-probabilities are never gathered.
DTensor nll_loss(const DTensor& log_probs, const DTensor& target, int64_t ignore_index = -100,
                 Reduction reduction = Reduction::mean);
/// Mean (sum, none) of (input - target)^2.
DTensor mse_loss(const DTensor& input, const DTensor& target, Reduction reduction = Reduction::mean);
/// scaled_dot_product_attention on DTensors (the Tensor op's arguments and errors): the batch and
/// head dims shard together on q, k, v (and the mask); q's sequence dim L may be sharded too (each
/// rank attends with its rows, and k's and v's gradients come back P(sum) over those ranks); k's
/// and v's sequence dim S and the feature dims are needed whole. Causal masking and dropout use
/// global positions, so the result equals the unsharded op on any mesh (dropout: bit for bit the
/// same keep-mask, one draw from the calling thread's generator).
DTensor scaled_dot_product_attention(const DTensor& q, const DTensor& k, const DTensor& v,
                                     const std::optional<DTensor>& attn_mask = std::nullopt, double dropout_p = 0.0,
                                     bool is_causal = false, std::optional<double> scale = std::nullopt);

/// Reduces the Partial mesh dims of each tensor (to Replicate), in buckets as DDP reduces
/// gradients: tensors reduced over the same mesh dims with the same op and dtype travel in one
/// flat all_reduce per `bucket_bytes` (sized by the global tensors, so every rank closes the same
/// buckets), instead of one collective each. Tensors without Partial come back as they are; one
/// with two reduce ops goes through redistribute. Collective: every rank of each mesh passes the
/// same tensors in the same order.
std::vector<DTensor> reduce_partials(const std::vector<DTensor>& tensors, int64_t bucket_bytes = int64_t{25} << 20);
/// reduce_partials into given layouts: each tensor comes back in targets[i] (its own layout with
/// the Partial dims reduced, then any move to the target). A tensor Partial over one mesh dim
/// whose target is Shard(0) there (split after the target's other splits of dim 0: FSDP's
/// gradient) travels in a bucket of one flat reduce_scatter, and comes back as a view of it; the
/// rest as above. Collective, like reduce_partials.
std::vector<DTensor> reduce_partials(const std::vector<DTensor>& tensors, const std::vector<Layout>& targets,
                                     int64_t bucket_bytes = int64_t{25} << 20);

/// reduce_partials into targets with every bucket's collective left in flight (DDP's overlap of
/// gradient reduction with backward): the tensors are packed at the call. wait() returns what
/// reduce_partials would (the same vector on every later call). Copyable; all copies share one
/// operation; a handle dropped unwaited lets the collectives finish first. Collective.
class PendingReduction {
 public:
  PendingReduction() = default;
  std::vector<DTensor> wait() const;
  bool valid() const { return state_ != nullptr; }
  struct State;

 private:
  friend PendingReduction reduce_partials_async(const std::vector<DTensor>&, const std::vector<Layout>&, int64_t);
  std::shared_ptr<State> state_;
};
PendingReduction reduce_partials_async(const std::vector<DTensor>& tensors, const std::vector<Layout>& targets,
                                       int64_t bucket_bytes = int64_t{25} << 20);

/// FSDP2's foreach_all_gather: each tensor moved to targets[i], with the value and gradient of
/// redistribute. The tensors that are Shard(0) on one mesh dim where their target is Replicate
/// (split last there; everything else equal) travel in one flat all_gather per (mesh dim,
/// dtype), instead of one each; any other move goes through the planner. Backward: a leaf's
/// gradient reaches it Partial, and during DTensor::backward the gradients of one call's tensors
/// are reduce-scattered together (reduce_partials_async with targets) once backward has passed
/// them, one bucket per call in flight while backward goes on: FSDP's per-unit reduce_scatter.
/// Collective: every rank of the mesh passes the same tensors in the same order.
std::vector<DTensor> foreach_all_gather(const std::vector<DTensor>& tensors, const std::vector<Layout>& targets);

/// foreach_all_gather with its all_gathers left in flight (FSDP's prefetch of the next unit): the
/// tensors are packed at once, so later writes to them do not change the result. wait() returns
/// what foreach_all_gather would (the same vector on every later call), recording autograd if it
/// was on at the call. Copyable; all copies share one operation; a handle dropped unwaited lets the
/// collectives finish first. Collective, like foreach_all_gather.
class PendingGather {
 public:
  PendingGather() = default;
  std::vector<DTensor> wait() const;
  bool valid() const { return state_ != nullptr; }

 private:
  friend PendingGather foreach_all_gather_async(const std::vector<DTensor>&, const std::vector<Layout>&);
  struct State;
  std::shared_ptr<State> state_;
};
PendingGather foreach_all_gather_async(const std::vector<DTensor>& tensors, const std::vector<Layout>& targets);

/// The fused backward kernels (ops/fused_backward.hpp) on each rank's block: gelu_backward with
/// grad brought to x's layout (Partial reduced first); norm_backward where every block holds
/// whole rows (the normalised dims unsharded, the weight replicated; the results in x's layout),
/// else op by op (the results in the layouts those ops give). No communication unless a layout
/// must change.
DTensor gelu_backward(const DTensor& grad, const DTensor& x);
/// With y = gelu(x) brought to x's layout too (see the Tensor form).
DTensor gelu_backward(const DTensor& grad, const DTensor& x, const DTensor& y);
std::pair<DTensor, DTensor> norm_backward(const DTensor& grad, const DTensor& x, const std::optional<DTensor>& weight,
                                          int64_t count, double eps, bool centred);

// --- views: sharding kept where the sharded dim maps cleanly, else a planned redistribution ----
DTensor reshape(const DTensor& x, const Shape& shape);  ///< one -1 allowed
DTensor view(const DTensor& x, const Shape& shape);
DTensor flatten(const DTensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
DTensor unsqueeze(const DTensor& x, int64_t dim);
DTensor squeeze(const DTensor& x);
DTensor squeeze(const DTensor& x, int64_t dim);
DTensor transpose(const DTensor& x, int64_t dim0, int64_t dim1);
DTensor permute(const DTensor& x, const std::vector<int64_t>& dims);
DTensor expand(const DTensor& x, const Shape& shape);
/// No data moves: a sharded dim's pieces are clipped (explicit, possibly empty, piece sizes).
DTensor narrow(const DTensor& x, int64_t dim, int64_t start, int64_t length);
/// x.narrow(dim, index, 1) with that dim then gathered (one slice moves) and removed.
DTensor select(const DTensor& x, int64_t dim, int64_t index);
DTensor cat(const std::vector<DTensor>& tensors, int64_t dim = 0);
DTensor stack(const std::vector<DTensor>& tensors, int64_t dim = 0);
std::vector<DTensor> chunk(const DTensor& x, int64_t chunks, int64_t dim = 0);
std::vector<DTensor> split(const DTensor& x, int64_t split_size, int64_t dim = 0);
std::vector<DTensor> split(const DTensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);

// --- shape ops that copy ---------------------------------------------------------------------------
// Semantics and errors as the Tensor ops (ops/shape_ops.hpp). Dims the op does not touch stay
// sharded; touched dims are gathered first (flip, repeat), except that roll and pad keep a sharded
// dim sharded and move only the rows that change piece (point-to-point between those pieces).
// Every Partial passes through (a constant pad with a non-zero fill reduces a P(sum) first).
/// Flipped dims are gathered (they could stay sharded with the blocks exchanged in reverse order).
DTensor flip(const DTensor& x, const std::vector<int64_t>& dims);
/// A rolled sharded dim keeps its layout: each piece receives the rows that roll into it (at most
/// two runs, from the pieces holding them). With no dims, rolls the flattened tensor (a reshape
/// to 1-d and back).
DTensor roll(const DTensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims = {});
/// No communication for any sharding: each rank masks its block by the global row and column.
DTensor tril(const DTensor& x, int64_t diagonal = 0);
/// No communication for any sharding, as tril.
DTensor triu(const DTensor& x, int64_t diagonal = 0);
/// Dims repeated once stay sharded; new leading dims and repeated dims are whole.
DTensor repeat(const DTensor& x, const std::vector<int64_t>& repeats);
/// repeat with reps padded by leading 1s.
DTensor tile(const DTensor& x, const std::vector<int64_t>& reps);
/// A padded or cropped sharded dim stays sharded: the first piece takes the rows before, the last
/// the rows after (explicit piece sizes; a crop shrinks or empties the end pieces). Constant
/// padding moves nothing; reflect, replicate and circular move only the rows the end pieces read
/// from other pieces (as a halo does).
DTensor pad(const DTensor& x, const std::vector<int64_t>& pads, PadMode mode = PadMode::constant, Scalar value = 0);

}  // namespace tessera
