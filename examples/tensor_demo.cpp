// tensor_demo: a tour of what Tessera has today, the local tensor that every rank will hold
// and compute on. `make demo` builds and runs it. Exits 1 if the random sub-block check fails.
#include <iostream>

#include <tessera/tessera.hpp>

using namespace tessera;

namespace {
void section(const char* title) { std::cout << "\n== " << title << "\n"; }
// A label on its own line, then the tensor (multi-line tensors stay aligned).
void show(const char* label, const Tensor& t) { std::cout << label << "\n" << t << "\n"; }
}  // namespace

int main() {
  section("tensors");
  Tensor x = arange(6, DType::f32).reshape({2, 3});  // [[0, 1, 2], [3, 4, 5]]
  show("x = arange(6, f32).reshape({2, 3})", x);
  std::cout << "shape " << x.shape().to_string() << ", dtype " << name(x.dtype()) << ", numel " << x.numel() << "\n";
  show("eye(3)", eye(3));

  section("views share storage, no copies");
  Tensor xt = x.t();  // [3, 2], strides swapped
  show("x.t()", xt);
  std::cout << "strides " << xt.strides().to_string() << ", same storage as x: " << std::boolalpha << (xt.storage() == x.storage())
            << ", contiguous: " << xt.is_contiguous() << "\n";
  Tensor y = x.clone();
  y.narrow(1, 1, 2).fill_(-1);  // writes through the view into y
  show("y = x.clone(); y.narrow(1, 1, 2).fill_(-1); y", y);
  std::cout << "x.select(0, 1) = " << x.select(0, 1) << ", x.unsqueeze(0).shape() = "
            << x.unsqueeze(0).shape().to_string() << "\n";

  section("broadcasting arithmetic and type promotion");
  Tensor bias = from_vector<float>({10, 20, 30});      // [3]
  Tensor scale = arange(1, 3, 1).reshape({2, 1});      // [2, 1] = [[1], [2]]
  show("x + bias, bias = [10, 20, 30]", x + bias);
  show("x * scale, scale = [[1], [2]]", x * scale);
  show("(x - 1) / 2", (x - 1) / 2);
  Tensor counts = arange(3);  // i64
  std::cout << "i64 + 2 -> " << name((counts + 2).dtype()) << ", i64 + 2.5 -> " << name((counts + 2.5).dtype())
            << ", i64 + bf16 -> " << name((counts + ones({3}, DType::bf16)).dtype())
            << ", f16 + bf16 -> " << name(promote_types(DType::f16, DType::bf16)) << "\n";

  section("matmul (BLAS), softmax, reductions");
  Tensor w = arange(12, DType::f32).reshape({3, 4}) / 10;
  show("matmul(x, w), w = arange(12).reshape({3, 4}) / 10", matmul(x, w));
  Tensor p = softmax(x, 1);
  show("softmax(x, 1)", p);
  std::cout << "row sums of softmax: " << sum(p, {1}) << "\n";
  std::cout << "sum(x) = " << sum(x).item() << "\n";
  std::cout << "mean(x, {0}) = " << mean(x, {0}) << "\n";
  std::cout << "argmax(x, 1) = " << argmax(x, 1) << "\n";
  show("amax(x, {1}, keepdim=true)", amax(x, {1}, true));

  section("errors name the op and the shapes");
  try {
    add(ones({2, 3}), ones({4}));
  } catch (const Error& e) {
    std::cout << "add([2, 3], [4]) threw: " << e.what() << "\n";
  }

  section("counter-based random (Philox 4x32-10)");
  manual_seed(42);
  show("manual_seed(42); rand({2, 3})", rand({2, 3}));
  show("randn({2, 3})", randn({2, 3}));
  // One draw of a [4, 6] uniform tensor: generate it whole, and generate only its
  // [1:3, 2:5] block on its own. The block equals the same slice of the whole, bit for bit.
  const RandomDraw draw = default_generator().next(Distribution::uniform, 0, 1, DType::f32);
  const Shape global{4, 6};
  Tensor whole = random_block(draw, global, {0, 0}, global);
  Tensor block = random_block(draw, global, {1, 2}, {2, 3});
  const bool same = equal(block, whole.narrow(0, 1, 2).narrow(1, 2, 3));
  show("the whole [4, 6] tensor", whole);
  show("only its block [1:3, 2:5], generated alone", block);
  std::cout << "sub-block equals the slice of the whole tensor: " << (same ? "yes (bit for bit)" : "NO") << "\n";
  return same ? 0 : 1;
}
