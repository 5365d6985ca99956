// The test files' precompiled header (tests/CMakeLists.txt): gtest, the standard headers most
// tests include and Tessera's public API. Parsed once per build instead of in each of ~90 test
// files, where it was about 3 s of every file's compile. A test file still includes what it uses.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <tessera/tessera.hpp>
