#pragma once
// Symbol visibility. The library is built with hidden visibility (-fvisibility=hidden), so only
// what a public header declares is exported: every public header opens its namespace as
// `namespace tessera TESSERA_API {`. Internals (detail/ headers, definitions local to a .cpp)
// stay out of the shared library's symbol table, so users cannot come to depend on them and the
// linker can bind calls inside the library directly.
#if defined(__GNUC__) || defined(__clang__)
#define TESSERA_API __attribute__((visibility("default")))
#else
#define TESSERA_API
#endif
