#pragma once
// How a loss reduces its per-element values (cross_entropy, nll_loss, mse_loss).

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {

enum class Reduction { none, mean, sum };

}  // namespace tessera
