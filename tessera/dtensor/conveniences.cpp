// The DTensor conveniences torch users reach for: in-place ops on the local shard, to(dtype),
// item, equal, the *_like factories and printing. The in-place ops decide everything from
// metadata that every rank holds alike (layouts, placements, the scalar), so a bad call throws
// the same error on every rank before anything is written or sent.
#include <ostream>

#include <tessera/core/error.hpp>
#include <tessera/dtensor/dtensor.hpp>
#include <tessera/ops/elementwise.hpp>
#include <tessera/ops/random.hpp>
#include <tessera/runtime/runtime.hpp>

namespace tessera {

namespace {

void check_defined(const DTensor& x, const char* op, const char* what) {
  TESSERA_CHECK(x.defined(), ShardingError, op, what, " is an undefined DTensor (default-constructed)");
}

// The target of an in-place op: defined, and not part of a graph (the write would not be recorded,
// so a later backward would use the overwritten values). The message mirrors Tensor::copy_'s.
void check_target(const DTensor& self, const char* op) {
  check_defined(self, op, "the target");
  TESSERA_CHECK(!autograd::needs_grad<DTensor>({&self}), ValueError, op, "in-place write into ", self.to_string(),
                " that requires a gradient; do it under autograd::NoGradGuard or on detach()");
}

// A DTensor operand: defined, not carrying a gradient the unrecorded write would drop, and laid
// out as the target up to dtype, so the locals line up element for element.
void check_operand(const DTensor& self, const DTensor& other, const char* op, const char* what) {
  check_defined(other, op, what);
  TESSERA_CHECK(!autograd::needs_grad<DTensor>({&other}), ValueError, op, what, " ", other.to_string(),
                " requires a gradient, which an in-place op does not record; use the out-of-place op or detach() it");
  const bool same = other.dtype() == self.dtype() ? other.layout() == self.layout()
                                                  : other.layout().with_dtype(self.dtype()) == self.layout();
  TESSERA_CHECK(same, ShardingError, op, what, " has layout ", other.layout().to_string(), " but the target has ",
                self.layout().to_string(), "; expected the same global shape, mesh and placements: redistribute ",
                what, " to the target's layout first");
}

// torch's in-place rule: the result may not be of a higher category than the target
// (b8 < integer < floating), e.g. an i32 DTensor cannot take add_(2.5).
int category(DType dtype) { return dtype == DType::b8 ? 0 : is_floating(dtype) ? 2 : 1; }

void check_result_dtype(const DTensor& self, DType result, const char* op, const std::string& operand) {
  TESSERA_CHECK(category(result) <= category(self.dtype()), ValueError, op, "result dtype ", name(result), " of ",
                self.to_string(), " with ", operand, " cannot be written in place into ", name(self.dtype()),
                "; use the out-of-place op, or to(", name(result), ") first");
}

// Throws for a Partial placement whose reduction `allowed` rejects, naming the op and why.
template <class Allowed>
void check_partials(const DTensor& self, const char* op, Allowed&& allowed, const char* why) {
  for (const Placement& p : self.placements())
    if (const auto* partial = std::get_if<Partial>(&p))
      TESSERA_CHECK(allowed(partial->op), ShardingError, op, self.to_string(), " holds ", to_string(p), ": ", why,
                    "; redistribute to Replicate first");
}

bool on_nonzero_coordinate(const DTensor& self, ReduceOp op) {
  const auto coordinate = self.device_mesh().coordinate();
  for (size_t m = 0; m < self.placements().size(); ++m)
    if (const auto* partial = std::get_if<Partial>(&self.placements()[m]); partial && partial->op == op)
      if (coordinate[m] != 0) return true;
  return false;
}

DType or_default(std::optional<DType> dtype, const DTensor& x) { return dtype ? *dtype : x.dtype(); }

// x's layout in `dtype`, checked for the *_like factories.
Layout like_layout(const DTensor& x, DType dtype, const char* op, bool partial_ok) {
  check_defined(x, op, "the input");
  if (!partial_ok)
    TESSERA_CHECK(!x.layout().has_partial(), ShardingError, op, "the input ", x.to_string(),
                  " is Partial: the value of every rank's local is ambiguous; redistribute to Replicate first");
  return x.dtype() == dtype ? x.layout() : x.layout().with_dtype(dtype);
}

// Each member rank builds its block of `layout` with make(block shape).
template <class Make>
DTensor build_like(const DTensor& x, Layout layout, Make&& make) {
  const DeviceMesh& mesh = x.device_mesh();
  if (!mesh.is_member()) return DTensor(Tensor(), mesh, std::move(layout));
  Tensor local = make(layout.local_shape(mesh.coordinate()));
  return DTensor(std::move(local), mesh, std::move(layout));
}

// As the rand/randn factories (dtensor/factories.cpp), over x's exact layout: every rank takes the
// one draw (members or not, so generators stay in step) and generates its block of it.
DTensor random_like(const DTensor& x, std::optional<DType> dtype, Distribution distribution, const char* op) {
  Layout layout = like_layout(x, or_default(dtype, x), op, false);
  const RandomDraw draw = default_generator().next(distribution, 0, 1, layout.dtype());
  const DeviceMesh& mesh = x.device_mesh();
  const Block block = mesh.is_member() ? layout.block(mesh.coordinate())
                                       : Block{Shape::filled(x.ndim(), 0), Shape::filled(x.ndim(), 0)};
  Tensor local = random_block(draw, x.shape(), block.begin, block.shape());  // validates the dtype
  if (!mesh.is_member()) return DTensor(Tensor(), mesh, std::move(layout));
  return DTensor(std::move(local), mesh, std::move(layout));
}

}  // namespace

// --- in-place ops ---------------------------------------------------------------------------------

DTensor& DTensor::add_(const DTensor& other) {
  check_target(*this, "add_");
  check_operand(*this, other, "add_", "other");
  check_result_dtype(*this, promote_types(dtype(), other.dtype()), "add_", other.to_string());
  check_partials(
      *this, "add_", [](ReduceOp op) { return op == ReduceOp::sum || op == ReduceOp::avg; },
      "adding the pending values rank by rank is right only for P(sum) and P(avg)");
  if (!mesh_.is_member()) return *this;
  local_.copy_(tessera::add(local_, other.local_));
  return *this;
}

DTensor& DTensor::add_(Scalar value) {
  check_target(*this, "add_");
  check_result_dtype(*this, value.result_dtype(dtype()), "add_", value.to_string());
  check_partials(
      *this, "add_", [](ReduceOp op) { return op != ReduceOp::product; },
      "a scalar added on each rank does not add to a product");
  if (!mesh_.is_member()) return *this;
  // A P(sum) dim would count the scalar once per rank: only its coordinate-0 ranks add it. Along
  // P(avg)/P(max)/P(min) dims every rank adding it shifts the reduced value by exactly the scalar.
  if (on_nonzero_coordinate(*this, ReduceOp::sum)) return *this;
  local_.copy_(tessera::add(local_, value));
  return *this;
}

DTensor& DTensor::mul_(const DTensor& other) {
  check_target(*this, "mul_");
  check_operand(*this, other, "mul_", "other");
  check_result_dtype(*this, promote_types(dtype(), other.dtype()), "mul_", other.to_string());
  check_partials(
      *this, "mul_", [](ReduceOp) { return false; },
      "a product of pending values is not the product of the reduced values");
  if (!mesh_.is_member()) return *this;
  local_.copy_(tessera::mul(local_, other.local_));
  return *this;
}

DTensor& DTensor::mul_(Scalar value) {
  check_target(*this, "mul_");
  check_result_dtype(*this, value.result_dtype(dtype()), "mul_", value.to_string());
  check_partials(
      *this, "mul_", [](ReduceOp op) { return op != ReduceOp::product; },
      "each rank's factor would count in the product");
  if (value.to_double() < 0)
    check_partials(
        *this, "mul_", [](ReduceOp op) { return op != ReduceOp::max && op != ReduceOp::min; },
        ("a negative factor " + value.to_string() + " turns maxima into minima and back").c_str());
  if (!mesh_.is_member()) return *this;
  local_.copy_(tessera::mul(local_, value));
  return *this;
}

DTensor& DTensor::fill_(Scalar value) {
  check_target(*this, "fill_");
  if (!mesh_.is_member()) return *this;
  // The value must survive the reduction once: a P(sum) dim adds the other ranks' 0s, a
  // P(product) dim multiplies by their 1s; P(avg)/P(max)/P(min) of equal values is the value.
  if (on_nonzero_coordinate(*this, ReduceOp::sum)) local_.fill_(0);
  else if (on_nonzero_coordinate(*this, ReduceOp::product)) local_.fill_(1);
  else local_.fill_(value);
  return *this;
}

DTensor& DTensor::zero_() {
  check_target(*this, "zero_");
  if (mesh_.is_member()) local_.fill_(0);
  return *this;
}

DTensor& DTensor::copy_(const DTensor& src) {
  check_target(*this, "copy_");
  check_operand(*this, src, "copy_", "src");
  if (mesh_.is_member()) local_.copy_(src.local_);
  return *this;
}

DTensor& DTensor::masked_fill_(const DTensor& mask, Scalar value) {
  check_target(*this, "masked_fill_");
  check_operand(*this, mask, "masked_fill_", "mask");
  check_partials(
      *this, "masked_fill_", [](ReduceOp) { return false; },
      "neither the pending values nor the mask are known on one rank");
  if (!mesh_.is_member()) return *this;
  local_.copy_(tessera::masked_fill(local_, mask.local_, value));
  return *this;
}

// --- conversion and values ------------------------------------------------------------------------

DTensor DTensor::to(DType dtype) const {
  check_defined(*this, "DTensor::to", "the input");
  if (dtype == this->dtype()) return *this;
  DTensor out(mesh_.is_member() ? local_.to(dtype) : Tensor(), mesh_, layout_->with_dtype(dtype));
  if (is_floating(dtype) && autograd::needs_grad<DTensor>({this}))
    autograd::record<DTensor>("to", out, {this}, [from = this->dtype()](const DTensor& g) {
      return std::vector<DTensor>{g.to(from)};
    });
  return out;
}

Scalar DTensor::item() const {
  check_defined(*this, "item", "the input");
  TESSERA_CHECK(numel() == 1, ValueError, "item", to_string(), " has shape ", shape().to_string(), " with ", numel(),
                " elements; expected exactly one");
  const Tensor whole = full_tensor();
  return visit(whole.dtype(), [&]<class T>(TypeTag<T>) { return Scalar(whole.item<T>()); });
}

bool equal(const DTensor& a, const DTensor& b) {
  check_defined(a, "equal", "a");
  check_defined(b, "equal", "b");
  TESSERA_CHECK(a.layout().mesh() == b.layout().mesh(), ShardingError, "equal", "a is ", a.to_string(), " but b is ",
                b.to_string(), ": they live on different meshes; move one with redistribute(mesh, placements)");
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;  // metadata: the same on every rank
  const DeviceMesh& mesh = a.device_mesh();
  const autograd::NoGradGuard no_grad;  // a comparison, not part of any computation
  TESSERA_CHECK(mesh.is_member(), ShardingError, "equal", "world rank ", rank(), " is not in ", mesh.to_string());
  // a's layout without pending reductions (no plan moves into a Partial), then each rank compares
  // its block and the mesh agrees on the verdict.
  const Layout target = gradient_layout(a.layout());
  const DTensor lhs = a.layout() == target ? a : a.redistribute(mesh, target);
  const DTensor rhs = b.layout() == target ? b : b.redistribute(mesh, target);
  int64_t verdict = equal(lhs.to_local(), rhs.to_local()) ? 1 : 0;
  for (int64_t m = 0; m < mesh.ndim(); ++m)
    if (mesh.size(m) > 1) mesh.comm(m).all_reduce(&verdict, 1, DType::i64, ReduceOp::min);
  return verdict == 1;
}

std::ostream& operator<<(std::ostream& out, const DTensor& x) { return out << x.to_string(); }

// --- *_like factories -----------------------------------------------------------------------------

DTensor empty_like(const DTensor& x, std::optional<DType> dtype) {
  const DType dt = or_default(dtype, x);
  return build_like(x, like_layout(x, dt, "empty_like", true), [&](const Shape& s) { return empty(s, dt); });
}

DTensor zeros_like(const DTensor& x, std::optional<DType> dtype) {
  const DType dt = or_default(dtype, x);
  return build_like(x, like_layout(x, dt, "zeros_like", true), [&](const Shape& s) { return zeros(s, dt); });
}

DTensor ones_like(const DTensor& x, std::optional<DType> dtype) {
  const DType dt = or_default(dtype, x);
  return build_like(x, like_layout(x, dt, "ones_like", false), [&](const Shape& s) { return ones(s, dt); });
}

DTensor full_like(const DTensor& x, Scalar value, std::optional<DType> dtype) {
  const DType dt = or_default(dtype, x);
  return build_like(x, like_layout(x, dt, "full_like", false), [&](const Shape& s) { return full(s, value, dt); });
}

DTensor rand_like(const DTensor& x, std::optional<DType> dtype) {
  return random_like(x, dtype, Distribution::uniform, "rand_like");
}

DTensor randn_like(const DTensor& x, std::optional<DType> dtype) {
  return random_like(x, dtype, Distribution::normal, "randn_like");
}

}  // namespace tessera
