# tessera_apply_sanitizers(target [TEST]): adds -fsanitize=<TESSERA_SANITIZE> to compile and link.
# A TEST target's own code is instrumented only with TESSERA_SANITIZE_TESTS: it always links the
# sanitizers' runtimes, so the library it calls is checked either way.
option(TESSERA_SANITIZE_TESTS "Instrument the tests' own code too, not only the library they call" ON)
function(tessera_apply_sanitizers target)
  cmake_parse_arguments(ARG "TEST" "" "" ${ARGN})
  if(TESSERA_SANITIZE)
    string(REPLACE ";" "," _san "${TESSERA_SANITIZE}")
    if(NOT ARG_TEST OR TESSERA_SANITIZE_TESTS)
      target_compile_options(${target} PRIVATE -fsanitize=${_san} -fno-omit-frame-pointer -fno-sanitize-recover=all)
    endif()
    target_link_options(${target} PRIVATE -fsanitize=${_san})
    # Sanitized builds free every block at once so use-after-free is caught (no allocator cache).
    target_compile_definitions(${target} PRIVATE TESSERA_SANITIZED=1)
  endif()
endfunction()
