"""The `fsdp-plan` console script: runs the binary this package installed
(fsdp_plan/_bin/fsdp-plan; cmake/install.cmake says why it is not in the
scripts directory itself). exec, not a subprocess: the binary's exit code,
signals and terminal are the caller's."""
import os
import sys

from ._binary import packaged_binary


def main() -> None:
    path = packaged_binary()
    if path is None:
        sys.stderr.write("fsdp-plan: this installation has no binary (fsdp_plan/_bin/fsdp-plan is missing); "
                         "reinstall the wheel\n")
        sys.exit(2)
    try:
        os.execv(path, [path, *sys.argv[1:]])
    except OSError as e:
        raise SystemExit(f"fsdp-plan: cannot run {path}: {e.strerror or e}") from None


if __name__ == "__main__":
    main()
