#include <tessera/core/scalar.hpp>

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

}  // namespace tessera
