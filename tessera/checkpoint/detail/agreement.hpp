#pragma once
// How the ranks of a save or load agree that all went well: each rank's failure ("" when none)
// is exchanged, so that every rank throws the same error and none goes on alone.
#include <string>

#include <tessera/core/export.hpp>

namespace tessera TESSERA_API {
namespace checkpoint::detail {

/// The lowest failed world rank's `failure` as "rank R failed: message", on every rank; "" when
/// none failed. Collective over the world.
std::string first_failure(const std::string& failure);

}  // namespace checkpoint::detail
}  // namespace tessera
