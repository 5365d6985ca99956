// Links against an installed Tessera and checks one computed value: exit 0 when it matches.
#include <cmath>
#include <iostream>

#include <tessera/tessera.hpp>

int main() {
  using namespace tessera;
  // x = [[0, 1, 2], [3, 4, 5]] as f32; y = x @ x^T = [[5, 14], [14, 50]].
  Tensor x = arange(6, DType::f32).reshape({2, 3});
  Tensor y = matmul(x, x.t());
  // sum(y) + mean(x) = 83 + 2.5
  const double got = sum(y).item() + mean(x).item();
  const double want = 85.5;
  std::cout << "y = " << y << "\n";
  if (std::abs(got - want) > 1e-9) {
    std::cerr << "tessera_consumer: got " << got << ", want " << want << "\n";
    return 1;
  }
  std::cout << "tessera_consumer: ok (" << got << ")\n";
  return 0;
}
