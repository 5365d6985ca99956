#pragma once
// Free-function forms of the views (the same as the Tensor methods), and joins/splits.
#include <vector>

#include <tessera/core/export.hpp>
#include <tessera/core/tensor.hpp>

namespace tessera TESSERA_API {

inline Tensor reshape(const Tensor& x, const Shape& shape) { return x.reshape(shape); }
inline Tensor view(const Tensor& x, const Shape& shape) { return x.view(shape); }
inline Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) { return x.transpose(dim0, dim1); }
inline Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) { return x.permute(dims); }
inline Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) { return x.narrow(dim, start, length); }
inline Tensor select(const Tensor& x, int64_t dim, int64_t index) { return x.select(dim, index); }
inline Tensor unsqueeze(const Tensor& x, int64_t dim) { return x.unsqueeze(dim); }
inline Tensor squeeze(const Tensor& x) { return x.squeeze(); }
inline Tensor squeeze(const Tensor& x, int64_t dim) { return x.squeeze(dim); }
inline Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1) { return x.flatten(start_dim, end_dim); }
inline Tensor expand(const Tensor& x, const Shape& shape) { return x.expand(shape); }
inline Tensor broadcast_to(const Tensor& x, const Shape& shape) { return x.expand(shape); }
inline Tensor contiguous(const Tensor& x) { return x.contiguous(); }

/// Joins tensors along an existing dim; dtypes promote. Throws ValueError if the list is
/// empty or the other dims differ.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// Joins tensors of equal shape along a new dim.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// `chunks` views along dim of ceil(size/chunks) elements each (the last may be shorter; fewer
/// than `chunks` pieces when the size runs out, as torch.chunk). Throws ValueError if chunks < 1.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
/// Views of split_size elements each along dim (the last may be shorter).
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
/// Views of the given sizes along dim. Throws ValueError if they do not add up to the size.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);

// --- shape ops that copy ------------------------------------------------------------------------
// torch semantics. Each returns a new contiguous tensor and records its derivative. The shape
// functions below are pure and shared by the Tensor and DTensor ops, so a mistake gives the same
// ValueError text on either.

/// How pad fills the new elements (torch.nn.functional.pad's modes).
enum class PadMode : uint8_t {
  constant,   ///< the fill value; negative pads crop
  reflect,    ///< mirrored without repeating the edge: pad < dim size
  replicate,  ///< the edge element repeated: dim size > 0
  circular,   ///< wrapped around: pad <= dim size
};
/// "constant", "reflect", "replicate", "circular".
const char* to_string(PadMode mode);

/// flip's dims, normalised with normalize_dim and ascending (none for a 0-d shape or no dims).
/// Pure. Throws ValueError naming "flip" and the shape for a dim out of range or repeated.
DimVector flip_dims(const std::vector<int64_t>& dims, const Shape& shape);

/// roll's shift of every dim of `shape`, in [0, size) (0 where not rolled; shifts of a repeated
/// dim add up); with no dims, the one shift of the flattened shape [numel]. Pure. Throws
/// ValueError naming "roll" and the shape if shifts and dims differ in length (no dims: if shifts
/// does not hold exactly one), or for a dim out of range.
/// Example: (shifts [1, -1], dims [0, -1], [5, 3]) -> [1, 2].
DimVector roll_shifts(const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims, const Shape& shape);

/// The shape repeat(x, repeats) gives: x's shape with leading 1s up to repeats.size(), times
/// repeats. Pure. Throws ValueError naming `op` and the shape if repeats has fewer entries than
/// dims or a negative entry. Example: ([2, 3], [2, 1, 2]) -> [2, 2, 6].
Shape repeat_shape(const Shape& shape, const std::vector<int64_t>& repeats, const char* op = "repeat");

/// tril and triu's check: `shape` has at least 2 dims. Pure. Throws ValueError naming `op` and the
/// shape otherwise.
void check_triangle_shape(const Shape& shape, const char* op);

/// tile's reps as repeat's: leading 1s up to the shape's ndim. Pure.
std::vector<int64_t> tile_repeats(const Shape& shape, const std::vector<int64_t>& reps);

/// What pad does to each dim of its input: elements added before and after it (negative: cropped)
/// and the result's shape.
struct PadSpec {
  DimVector before, after;
  Shape shape;
};
/// pad's `pads` (from the last dim backwards, (before, after) pairs) per dim of `shape`. Pure.
/// Throws ValueError naming "pad", the shape and the pads for an odd count, more pairs than
/// dims, a negative result size, a negative pad outside constant mode, reflect with a pad >= the
/// dim size, circular with a pad > the dim size, or replicate of a zero-size dim that is padded.
PadSpec pad_spec(const Shape& shape, const std::vector<int64_t>& pads, PadMode mode);

/// x with the order of the elements along `dims` reversed (torch.flip).
Tensor flip(const Tensor& x, const std::vector<int64_t>& dims);
/// x shifted by shifts[i] along dims[i], elements leaving one end re-entering at the other; with
/// no dims, the flattened x shifted by shifts[0] (torch.roll).
Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims = {});
/// The lower triangle of the last two dims: elements with col - row <= diagonal, zeros elsewhere;
/// batch dims pass. Throws ValueError naming "tril" and the shape for fewer than 2 dims.
Tensor tril(const Tensor& x, int64_t diagonal = 0);
/// The upper triangle: elements with col - row >= diagonal. Throws as tril ("triu").
Tensor triu(const Tensor& x, int64_t diagonal = 0);
/// x tiled repeats[i] times along dim i, with new leading dims (torch.Tensor.repeat).
/// Throws ValueError as repeat_shape.
Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats);
/// torch.tile: repeat with reps padded by leading 1s to x's ndim. Throws ValueError naming "tile".
Tensor tile(const Tensor& x, const std::vector<int64_t>& reps);
/// torch.nn.functional.pad: `pads` from the last dim backwards as (before, after) pairs.
/// Throws ValueError as pad_spec.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, PadMode mode = PadMode::constant, Scalar value = 0);

}  // namespace tessera
