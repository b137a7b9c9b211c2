# Install rules. `cmake --install` puts the binary in bin/. scikit-build-core
# (pip install ., pip wheel .) puts it inside the Python package,
# fsdp_plan/_bin/fsdp-plan, and the wheel's `fsdp-plan` console script
# (python/fsdp_plan/_cli.py) execs it: libzip is a shared library that
# auditwheel copies into the wheel (fsdp_plan.libs/, cmake/wheel_deps.cmake),
# and only a binary at a fixed place relative to those libraries finds them
# (RPATH $ORIGIN/../../fsdp_plan.libs) however the wheel is installed: a venv,
# --user, --prefix, --target. A binary in the wheel's scripts directory does
# not: auditwheel moves such a binary beside the package and leaves a shim
# that looks for it under the default scheme's site-packages only.
include(GNUInstallDirs)
if(SKBUILD)
  install(TARGETS fsdp-plan RUNTIME DESTINATION fsdp_plan/_bin)
else()
  install(TARGETS fsdp-plan RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
