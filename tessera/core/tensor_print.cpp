// Readable text for tensors, in the style PyTorch users know; large tensors are summarised.
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <vector>

#include <tessera/core/tensor.hpp>

#include <tessera/core/internal/tensor_raw.hpp>

namespace tessera {

namespace {

constexpr int64_t kSummariseAbove = 1000;  // elements
constexpr int64_t kEdgeItems = 3;

struct Printer {
  const Tensor& values;  // f64 or i64 copy of the tensor, contiguous
  bool integral;
  bool boolean;
  bool summarise;
  int width = 0;

  // Floats as PyTorch prints them: "1." when every value is integral, fixed with 4 decimals
  // for moderate magnitudes, scientific otherwise.
  enum class FloatMode { integral, fixed, scientific } float_mode = FloatMode::fixed;

  void choose_float_mode() {
    if (integral) return;
    double max_abs = 0, min_abs = INFINITY;
    bool all_integral = true;
    const double* p = values.data<double>();
    for (int64_t i = 0; i < values.numel(); ++i) {
      if (!std::isfinite(p[i])) continue;
      const double a = std::abs(p[i]);
      max_abs = std::max(max_abs, a);
      if (a > 0) min_abs = std::min(min_abs, a);
      all_integral = all_integral && std::nearbyint(p[i]) == p[i];
    }
    if (all_integral && max_abs < 1e8) float_mode = FloatMode::integral;
    else if (max_abs < 1e8 && (min_abs >= 1e-4 || min_abs == INFINITY)) float_mode = FloatMode::fixed;
    else float_mode = FloatMode::scientific;
  }

  std::string format_value(int64_t flat) const {
    std::ostringstream out;
    if (boolean) {
      out << (values.data<int64_t>()[flat] ? "true" : "false");
    } else if (integral) {
      out << values.data<int64_t>()[flat];
    } else {
      const double v = values.data<double>()[flat];
      if (std::isnan(v)) return "nan";
      if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
      if (float_mode == FloatMode::integral) out << std::fixed << std::setprecision(0) << v << '.';
      else if (float_mode == FloatMode::fixed) out << std::fixed << std::setprecision(4) << v;
      else out << std::scientific << std::setprecision(4) << v;
    }
    return out.str();
  }

  // Indices of dim d to show: all, or the first and last kEdgeItems with a gap marker (-1).
  std::vector<int64_t> shown(int64_t size) const {
    std::vector<int64_t> idx;
    if (!summarise || size <= 2 * kEdgeItems) {
      for (int64_t i = 0; i < size; ++i) idx.push_back(i);
    } else {
      for (int64_t i = 0; i < kEdgeItems; ++i) idx.push_back(i);
      idx.push_back(-1);
      for (int64_t i = size - kEdgeItems; i < size; ++i) idx.push_back(i);
    }
    return idx;
  }

  void measure(int64_t dim, int64_t flat) {
    const Shape& shape = values.shape();
    if (dim == shape.size()) {
      width = std::max(width, static_cast<int>(format_value(flat).size()));
      return;
    }
    const int64_t stride = values.strides()[dim];
    for (int64_t i : shown(shape[dim]))
      if (i >= 0) measure(dim + 1, flat + i * stride);
  }

  void print(std::ostream& out, int64_t dim, int64_t flat, int indent) const {
    const Shape& shape = values.shape();
    if (dim == shape.size()) {
      const std::string text = format_value(flat);
      out << std::string(static_cast<size_t>(width) - text.size(), ' ') << text;
      return;
    }
    const int64_t stride = values.strides()[dim];
    const bool innermost = dim + 1 == shape.size();
    // Inner rows: ", "; outer rows: a newline per nesting level, then the indent.
    std::string separator = ",";
    if (innermost) separator += ' ';
    else separator.append(static_cast<size_t>(shape.size() - dim - 1), '\n').append(static_cast<size_t>(indent + 1), ' ');
    out << '[';
    bool first = true;
    for (int64_t i : shown(shape[dim])) {
      if (!first) out << separator;
      first = false;
      if (i < 0) out << "...";
      else print(out, dim + 1, flat + i * stride, indent + 1);
    }
    out << ']';
  }
};

}  // namespace

std::string Tensor::to_string() const {
  if (!defined()) return "tensor(undefined)";
  const bool integral = !is_floating(dtype_);
  const Tensor values = detail::raw_contiguous(detail::raw_to(*this, integral ? DType::i64 : DType::f64));
  Printer printer{values, integral, dtype_ == DType::b8, numel() > kSummariseAbove};
  printer.choose_float_mode();
  printer.measure(0, 0);
  std::ostringstream out;
  out << "tensor(";
  if (numel() == 0) out << "[], shape=" << shape_.to_string();
  else printer.print(out, 0, 0, static_cast<int>(std::string("tensor(").size()));
  out << ", dtype=" << name(dtype_) << ')';
  return out.str();
}

}  // namespace tessera
