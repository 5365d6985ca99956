#pragma once
// Free-function forms of the views (the same as the Tensor methods), and joins/splits.
#include <vector>

#include <tessera/core/tensor.hpp>

namespace tessera {

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

}  // namespace tessera
