# The compiler cache and the linker (docs/dev/build-and-test.md, "Build speed").
#
# ccache, when installed (KGATE_CCACHE, on by default; CCACHE_DISABLE=1 turns it off per run):
#   - the cache is ccache's own: $CCACHE_DIR when set, else its default (~/.cache/ccache),
#     outside every checkout, so a fresh clone in another folder (CI's) finds what was built;
#   - base_dir is the source root and hash_dir is off, so absolute paths under the clone are
#     hashed relative to the build folder and the folder's name is not part of the key;
#   - depend mode: a miss is one compile, the key taken from the compiler's own -MD list, where
#     ccache would otherwise preprocess every unit a second time only to hash it (~1.3 s a unit
#     here, ~40 s of a cold start's wall on 2 cores); Ninja's rules already pass -MD;
#   - -ffile-prefix-map maps the clone's root to "." in __FILE__ and in any debug info, so the
#     objects themselves do not name the folder they were built in.
# Must be included before the first target is created: the launcher is a default of new targets.
option(KGATE_CCACHE "Compile through ccache when it is installed" ON)
option(KGATE_FAST_LINKER "Link with mold, or lld, when one is installed" ON)

if(KGATE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(KGATE_CCACHE_PROGRAM ccache)
  if(KGATE_CCACHE_PROGRAM)
    set(CMAKE_CXX_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env
      CCACHE_BASEDIR=${PROJECT_SOURCE_DIR} CCACHE_NOHASHDIR=1 CCACHE_DEPEND=1 ${KGATE_CCACHE_PROGRAM})
    message(STATUS "kgate: compiling through ${KGATE_CCACHE_PROGRAM} (base_dir ${PROJECT_SOURCE_DIR})")
  else()
    message(STATUS "kgate: ccache not found, compiling without a cache")
  endif()
endif()
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  add_compile_options(-ffile-prefix-map=${PROJECT_SOURCE_DIR}=.)
endif()

# The link of kgate took ~20 s with GNU ld (bfd) and ~1 s with mold (docs/dev/build-and-test.md has the figures).
if(KGATE_FAST_LINKER AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  find_program(KGATE_MOLD mold)
  find_program(KGATE_LLD ld.lld)
  # GCC 12 knows -fuse-ld=mold; clang 14 takes it too when mold is on PATH.
  if(KGATE_MOLD)
    add_link_options(-fuse-ld=mold)
    message(STATUS "kgate: linking with ${KGATE_MOLD}")
  elseif(KGATE_LLD)
    add_link_options(-fuse-ld=lld)
    message(STATUS "kgate: linking with ${KGATE_LLD}")
  else()
    message(STATUS "kgate: linking with the compiler's default linker")
  endif()
endif()
