// The translation unit of tessera_tests_pch (tests/CMakeLists.txt): CMake compiles a precompiled
// header only for a target with a source, and the test targets reuse this target's header.
