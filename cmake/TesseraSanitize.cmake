# tessera_apply_sanitizers(target): adds -fsanitize=<TESSERA_SANITIZE> to compile and link.
function(tessera_apply_sanitizers target)
  if(TESSERA_SANITIZE)
    string(REPLACE ";" "," _san "${TESSERA_SANITIZE}")
    target_compile_options(${target} PRIVATE -fsanitize=${_san} -fno-omit-frame-pointer -fno-sanitize-recover=all)
    target_link_options(${target} PRIVATE -fsanitize=${_san})
    # Sanitized builds free every block at once so use-after-free is caught (no allocator cache).
    target_compile_definitions(${target} PRIVATE TESSERA_SANITIZED=1)
  endif()
endfunction()
