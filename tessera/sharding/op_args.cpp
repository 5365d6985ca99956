#include <tessera/sharding/op_args.hpp>

#include <functional>

namespace tessera {

namespace {

struct Hasher {
  size_t h;
  void mix(size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); }
  void mix(const DimVector& dims) {
    mix(static_cast<size_t>(dims.size()));
    for (int64_t d : dims) mix(static_cast<size_t>(d));
  }
  void operator()(std::monostate) {}
  void operator()(const ElementwiseArgs& a) {
    mix(static_cast<size_t>(a.slot));
    mix(static_cast<size_t>(a.kinds[0] + 1) | static_cast<size_t>(a.kinds[1] + 1) << 8);
  }
  void operator()(const ReduceArgs& a) {
    mix(a.dims);
    mix(static_cast<size_t>(a.keepdim));
    mix(static_cast<size_t>(a.correction));
  }
  void operator()(const DimArgs& a) { mix(static_cast<size_t>(a.dim)); }
  void operator()(const NormArgs& a) { mix(static_cast<size_t>(a.normalized_ndim)); }
  void operator()(const ShapeArgs& a) { mix(a.shape); }
  void operator()(const EquationArgs& a) { mix(std::hash<std::string>{}(a.equation)); }
  void operator()(const NarrowArgs& a) {
    mix(static_cast<size_t>(a.dim));
    mix(static_cast<size_t>(a.start));
    mix(static_cast<size_t>(a.length));
  }
  void operator()(const DiagonalArgs& a) { mix(static_cast<size_t>(a.diagonal)); }
  void operator()(const PadArgs& a) {
    mix(a.before);
    mix(a.after);
    mix(static_cast<size_t>(a.mode));
    mix(static_cast<size_t>(a.value.kind()));
    mix(static_cast<size_t>(a.value.to_int()));
    // Every NaN hashes alike (PadArgs's == treats NaN fills as equal).
    const double v = a.value.to_double();
    mix(v == v ? std::hash<double>{}(v) : 0x7ff8ULL);
  }
};

const char* kind_name(int8_t kind) {
  switch (static_cast<Scalar::Kind>(kind)) {
    case Scalar::Kind::boolean: return "b";
    case Scalar::Kind::integral: return "i";
    case Scalar::Kind::floating: return "f";
  }
  return "?";
}

std::string pad_text(const PadArgs& a) {
  static constexpr const char* kModes[] = {"constant", "reflect", "replicate", "circular"};
  std::string text = "(pads " + a.before.to_string() + ", " + a.after.to_string() + ", ";
  text += a.mode < 4 ? kModes[a.mode] : "?";
  if (a.mode == 0) text.append(" ").append(a.value.to_string());
  return text + ")";
}

struct Printer {
  std::string operator()(std::monostate) const { return "()"; }
  std::string operator()(const ElementwiseArgs& a) const {
    if (a.slot == ScalarSlot::none && a.kinds[0] < 0) return "()";
    std::string text = a.slot == ScalarSlot::left ? "(scalar left" : a.slot == ScalarSlot::right ? "(scalar right" : "(scalars";
    for (int8_t k : a.kinds)
      if (k >= 0) text += std::string(" ") + kind_name(k);
    return text + ")";
  }
  std::string operator()(const ReduceArgs& a) const {
    std::string text = "(dims " + a.dims.to_string();
    if (a.keepdim) text += ", keepdim";
    if (a.correction != 0) text += ", correction " + std::to_string(a.correction);
    return text + ")";
  }
  std::string operator()(const DimArgs& a) const { return "(dim " + std::to_string(a.dim) + ")"; }
  std::string operator()(const NormArgs& a) const { return "(normalized dims " + std::to_string(a.normalized_ndim) + ")"; }
  std::string operator()(const ShapeArgs& a) const {
    std::string text = "(";  // appended, not "(" + ...: GCC 12 -O3 warns falsely (-Wrestrict) on that form
    text += a.shape.to_string();
    return text + ")";
  }
  std::string operator()(const EquationArgs& a) const { return "(" + a.equation + ")"; }
  std::string operator()(const NarrowArgs& a) const {
    return "(dim " + std::to_string(a.dim) + ", start " + std::to_string(a.start) + ", length " +
           std::to_string(a.length) + ")";
  }
  std::string operator()(const DiagonalArgs& a) const { return "(diagonal " + std::to_string(a.diagonal) + ")"; }
  std::string operator()(const PadArgs& a) const { return pad_text(a); }
};

}  // namespace

size_t hash_value(const OpArgs& args) {
  Hasher hasher{args.index() * 0x9e3779b97f4a7c15ULL};
  std::visit(hasher, args);
  return hasher.h;
}

std::string to_string(const OpArgs& args) { return std::visit(Printer{}, args); }

}  // namespace tessera
