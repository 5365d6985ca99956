#pragma once
// How a loss reduces its per-element values (cross_entropy, nll_loss, mse_loss).

namespace tessera {

enum class Reduction { none, mean, sum };

}  // namespace tessera
