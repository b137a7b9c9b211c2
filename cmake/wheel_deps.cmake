# FSDP_PLAN_WHEEL=ON: the libraries a wheel cannot expect on the machine it is
# installed on, linked into the binary instead of found at run time.
#
# - libyaml, RE2 and zlib: Debian's static archives (libyaml-dev, libre2-dev,
#   zlib1g-dev ship libyaml.a, libre2.a and libz.a), as the same targets the
#   normal build links (lib/CMakeLists.txt: PkgConfig::LIBYAML, PkgConfig::RE2,
#   ZLIB::ZLIB).
# - spdlog and fmt: header-only (Debian ships no libspdlog.a or libfmt.a), as
#   an INTERFACE target under the name app/CMakeLists.txt links, spdlog::spdlog.
# - libstdc++ and libgcc: -static-libstdc++ -static-libgcc, so the binary
#   needs no GLIBCXX symbol version newer than the target machine has.
# - libzip: Debian ships no libzip.a; it stays a shared library (found by
#   pkg-config in the top-level CMakeLists.txt) that auditwheel repair copies
#   into the wheel with what it needs (libbz2, libcrypto).
# - simdjson: Debian ships no libsimdjson.a either; libsimdjson.so.14 is copied
#   into the wheel the same way (the top-level CMakeLists.txt finds it).
#
# Each is found by path, so a missing archive fails here, by name, and not as
# a shared library silently linked instead.

find_library(FSDP_PLAN_LIBYAML_A NAMES libyaml.a)
find_path(FSDP_PLAN_LIBYAML_INCLUDE yaml.h)
if(NOT FSDP_PLAN_LIBYAML_A OR NOT FSDP_PLAN_LIBYAML_INCLUDE)
  message(FATAL_ERROR "FSDP_PLAN_WHEEL: no static libyaml (libyaml.a and yaml.h; Debian: libyaml-dev)")
endif()
add_library(PkgConfig::LIBYAML STATIC IMPORTED)
set_target_properties(PkgConfig::LIBYAML PROPERTIES
  IMPORTED_LOCATION ${FSDP_PLAN_LIBYAML_A}
  INTERFACE_INCLUDE_DIRECTORIES ${FSDP_PLAN_LIBYAML_INCLUDE})

find_library(FSDP_PLAN_RE2_A NAMES libre2.a)
find_path(FSDP_PLAN_RE2_INCLUDE re2/re2.h)
if(NOT FSDP_PLAN_RE2_A OR NOT FSDP_PLAN_RE2_INCLUDE)
  message(FATAL_ERROR "FSDP_PLAN_WHEEL: no static RE2 (libre2.a and re2/re2.h; Debian: libre2-dev)")
endif()
add_library(PkgConfig::RE2 STATIC IMPORTED)
set_target_properties(PkgConfig::RE2 PROPERTIES
  IMPORTED_LOCATION ${FSDP_PLAN_RE2_A}
  INTERFACE_INCLUDE_DIRECTORIES ${FSDP_PLAN_RE2_INCLUDE}
  INTERFACE_LINK_LIBRARIES Threads::Threads)

# FindZLIB takes a library the cache already names.
find_library(ZLIB_LIBRARY NAMES libz.a)
if(NOT ZLIB_LIBRARY)
  message(FATAL_ERROR "FSDP_PLAN_WHEEL: no static zlib (libz.a; Debian: zlib1g-dev)")
endif()
find_package(ZLIB REQUIRED)

find_package(Threads REQUIRED)
find_package(fmt REQUIRED)  # fmt::fmt-header-only
find_path(FSDP_PLAN_SPDLOG_INCLUDE spdlog/spdlog.h)
if(NOT FSDP_PLAN_SPDLOG_INCLUDE)
  message(FATAL_ERROR "FSDP_PLAN_WHEEL: no spdlog headers (spdlog/spdlog.h; Debian: libspdlog-dev)")
endif()
add_library(spdlog::spdlog INTERFACE IMPORTED)
# SPDLOG_FMT_EXTERNAL: Debian's spdlog headers use the system fmt, not the copy spdlog bundles.
set_target_properties(spdlog::spdlog PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES ${FSDP_PLAN_SPDLOG_INCLUDE}
  INTERFACE_COMPILE_DEFINITIONS SPDLOG_FMT_EXTERNAL
  INTERFACE_LINK_LIBRARIES "fmt::fmt-header-only;Threads::Threads")

add_link_options(-static-libstdc++ -static-libgcc)
