#include <tessera/core/dtype.hpp>

namespace tessera {

namespace {
enum class Category { boolean, integer, floating };

Category category_of(DType dtype) {
  switch (dtype) {
#define TESSERA_DTYPE_CATEGORY(name, type, category) \
  case DType::name:                                  \
    return std::string_view(#category) == "float"  ? Category::floating \
           : std::string_view(#category) == "int" ? Category::integer  \
                                                  : Category::boolean;
    TESSERA_FORALL_DTYPES(TESSERA_DTYPE_CATEGORY)
#undef TESSERA_DTYPE_CATEGORY
  }
  return Category::boolean;
}
}  // namespace

std::string_view name(DType dtype) {
  switch (dtype) {
#define TESSERA_DTYPE_NAME(name, type, category) \
  case DType::name:                              \
    return #name;
    TESSERA_FORALL_DTYPES(TESSERA_DTYPE_NAME)
#undef TESSERA_DTYPE_NAME
  }
  return "?";
}

std::string to_string(DType dtype) { return std::string(name(dtype)); }

DType dtype_from_string(std::string_view text) {
#define TESSERA_DTYPE_PARSE(name, type, category) \
  if (text == #name) return DType::name;
  TESSERA_FORALL_DTYPES(TESSERA_DTYPE_PARSE)
#undef TESSERA_DTYPE_PARSE
  throw ValueError(detail::concat("[dtype_from_string] unknown dtype '", text,
                                  "'; expected one of f32 f64 f16 bf16 i32 i64 u8 b8"));
}

bool is_floating(DType dtype) { return category_of(dtype) == Category::floating; }
bool is_integral(DType dtype) { return category_of(dtype) == Category::integer; }

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  const Category ca = category_of(a), cb = category_of(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == Category::floating) {
    // f16 and bf16 have no common 16-bit supertype.
    if ((a == DType::f16 && b == DType::bf16) || (a == DType::bf16 && b == DType::f16)) return DType::f32;
    return itemsize(a) >= itemsize(b) ? a : b;
  }
  // Integers: u8 < i32 < i64 (every pair has a signed supertype here).
  return itemsize(a) >= itemsize(b) ? a : b;
}

}  // namespace tessera
