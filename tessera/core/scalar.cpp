#include <tessera/core/scalar.hpp>

#include <limits>
#include <sstream>

namespace tessera {

DType Scalar::result_dtype(DType tensor_dtype) const {
  if (tessera::is_floating(tensor_dtype)) return tensor_dtype;
  if (kind_ == Kind::floating) return DType::f32;
  if (tessera::is_integral(tensor_dtype)) return tensor_dtype;
  return kind_ == Kind::integral ? DType::i64 : DType::b8;  // bool tensor
}

std::string Scalar::to_string() const {
  std::ostringstream out;
  if (kind_ == Kind::floating) out << double_;
  else if (kind_ == Kind::boolean) out << (int_ ? "true" : "false");
  else out << int_;
  return out.str();
}

namespace {
Scalar extreme(DType dtype, bool lowest) {
  switch (dtype) {
    case DType::i32: return lowest ? Scalar(std::numeric_limits<int32_t>::min()) : Scalar(std::numeric_limits<int32_t>::max());
    case DType::i64: return lowest ? Scalar(std::numeric_limits<int64_t>::min()) : Scalar(std::numeric_limits<int64_t>::max());
    case DType::u8: return lowest ? Scalar(0) : Scalar(255);
    case DType::b8: return Scalar(!lowest);
    default: return Scalar(lowest ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity());
  }
}
}  // namespace

Scalar lowest_value(DType dtype) { return extreme(dtype, true); }
Scalar highest_value(DType dtype) { return extreme(dtype, false); }

}  // namespace tessera
