"""Finding and running the fsdp-plan binary. Imports nothing heavy: the
console script and fsdp_plan.plan() start with it."""
import os
from typing import List, Optional, Sequence

# The binary's exit codes (README "Exit codes").
EXIT_PLAN = 0
EXIT_REFUSED = 1  # a plan all the same: FSDP would refuse, a budget is violated, or --expect differs
EXIT_INPUT = 2
EXIT_INTERNAL = 3


class FsdpPlanError(RuntimeError):
    """The binary could not plan (exit 2 or 3), or could not be run. `message` is its
    one-line reason (stderr), `returncode` its exit code (None if it did not run)."""

    def __init__(self, message: str, returncode: Optional[int] = None, command: Sequence[str] = ()):
        super().__init__(message)
        self.message = message
        self.returncode = returncode
        self.command = list(command)


def packaged_binary() -> Optional[str]:
    """The binary the wheel installed beside this file (fsdp_plan/_bin/fsdp-plan), if any."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "fsdp-plan")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def find_binary(explicit: Optional[str] = None) -> str:
    """The fsdp-plan to run: `explicit`, else $FSDP_PLAN, else the one this
    package installed (fsdp_plan/_bin/fsdp-plan), else the first on PATH.
    Raises FsdpPlanError when there is none."""
    given = explicit or os.environ.get("FSDP_PLAN")
    if given:
        if os.path.isfile(given) and os.access(given, os.X_OK):
            return given
        raise FsdpPlanError(f"{given}: no such executable (the fsdp-plan binary)")
    import shutil
    path = packaged_binary() or shutil.which("fsdp-plan")
    if path:
        return path
    raise FsdpPlanError("fsdp-plan: not installed in this environment and not on PATH "
                        "(pip install fsdp-plan, or set FSDP_PLAN to the binary)")


def run(args: Sequence[str], binary: Optional[str] = None, timeout: Optional[float] = None):
    """Runs the binary with `args`; raises FsdpPlanError on exit 2 or 3."""
    import subprocess
    cmd = [find_binary(binary), *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except OSError as e:
        raise FsdpPlanError(f"{cmd[0]}: cannot run: {e.strerror or e}", None, cmd) from None
    except subprocess.TimeoutExpired:
        raise FsdpPlanError(f"{cmd[0]}: no answer in {timeout} s", None, cmd) from None
    if r.returncode not in (EXIT_PLAN, EXIT_REFUSED):
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        raise FsdpPlanError(lines[-1] if lines else f"{cmd[0]} exited {r.returncode}", r.returncode, cmd)
    return r
