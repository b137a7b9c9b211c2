#!/usr/bin/env python3
"""The repaired wheel installs and runs on its own (scripts/dev wheel runs this).

    python3 tests/python/check_wheel.py WHEEL VENV_DIR

Makes a fresh venv at VENV_DIR (removing one there), times
`pip install --no-index --no-deps WHEEL` into it, then checks:

- ldd of the installed binary (fsdp_plan/_bin/fsdp-plan): every library is
  found, and each is either the wheel's own (fsdp_plan.libs/, which
  auditwheel repair filled) or one the manylinux policy lets a wheel expect of
  the system (auditwheel's lib_whitelist: libc, libm, libz, ...), so nothing
  of a -dev package or of this build machine is needed;
- the installed `fsdp-plan` runs with LD_LIBRARY_PATH empty and a minimal
  environment, plans sample_models/tiny_gpt.pt and tiny_gpt.pt2;
- `fsdp-plan --version`, the wheel's metadata version and CMakeLists.txt's
  project(VERSION) agree;
- `fsdp-plan-export --help` runs without torch, and an export without torch
  in the environment is a one-line exit 2 naming what to install.

Prints the figures (wheel size, install time, ldd) and `N passed, M failed`;
exit 1 on any failure.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
# manylinux's system libraries (auditwheel's policy lib_whitelist, the same for
# every manylinux_2_x policy), plus the loader and the vDSO ldd lists.
ALLOWED = {"libatomic.so.1", "libgcc_s.so.1", "libstdc++.so.6", "libm.so.6", "libmvec.so.1", "libanl.so.1",
           "libdl.so.2", "librt.so.1", "libc.so.6", "libnsl.so.1", "libutil.so.1", "libpthread.so.0",
           "libX11.so.6", "libXext.so.6", "libXrender.so.1", "libICE.so.6", "libSM.so.6", "libGL.so.1",
           "libgobject-2.0.so.0", "libgthread-2.0.so.0", "libglib-2.0.so.0", "libresolv.so.2", "libexpat.so.1",
           "libz.so.1", "linux-vdso.so.1", "ld-linux-x86-64.so.2"}

passed = failed = 0


def check(ok: bool, what: str, detail: str = "") -> None:
    global passed, failed
    passed += ok
    failed += not ok
    print(f"{'PASS' if ok else 'FAIL'} {what}" + ("" if ok or not detail else f": {detail}"), flush=True)


def run(cmd, env=None, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, **kw)


def main(wheel: str, venv: str) -> int:
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = os.path.join(venv, "bin", "pip")
    t0 = time.perf_counter()
    r = run([pip, "install", "-q", "--disable-pip-version-check", "--no-index", "--no-deps", wheel])
    t_install = time.perf_counter() - t0
    check(r.returncode == 0, "pip install --no-index of the wheel", r.stderr[-500:])
    if r.returncode:
        return 1
    print(f"FIGURES wheel {os.path.basename(wheel)}: {os.path.getsize(wheel)} bytes; "
          f"pip install --no-index into a fresh venv: {t_install:.2f} s")
    with zipfile.ZipFile(wheel) as z:
        members = sorted(i.filename for i in z.infolist() if not i.filename.endswith("/"))
    print("FIGURES wheel contents: " + ", ".join(m for m in members if not m.endswith((".py", "RECORD"))))

    py = os.path.join(venv, "bin", "python")
    real = run([py, "-c", "import fsdp_plan._binary as b; print(b.packaged_binary() or '')"]).stdout.strip()
    check(bool(real), "the wheel installed fsdp_plan/_bin/fsdp-plan", real)
    if not real:
        return 1
    clean = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "", "HOME": os.environ.get("HOME", "/")}
    ldd = run(["ldd", real], env=clean)
    print(f"FIGURES ldd {os.path.relpath(real, venv)}:\n" + ldd.stdout.rstrip())
    libs_dir = os.path.realpath(os.path.join(os.path.dirname(real), "..", "..", "fsdp_plan.libs"))
    bad = []
    for line in ldd.stdout.splitlines():
        m = re.match(r"\s*(\S+)(?:\s+=>\s+(\S+))?", line)
        if not m:
            continue
        name, where = m.group(1), m.group(2)
        if "not found" in line:
            bad.append(f"{name} not found")
        elif where and os.path.realpath(where).startswith(libs_dir + os.sep):
            continue  # bundled by auditwheel
        elif os.path.basename(name) not in ALLOWED:
            bad.append(f"{name} => {where} is neither bundled nor a manylinux system library")
    check(not bad and ldd.returncode == 0, "ldd: only bundled and manylinux system libraries", "; ".join(bad))

    bindir = os.path.join(venv, "bin")
    env = dict(clean, PATH=bindir + ":/usr/bin:/bin")
    for model in ("tiny_gpt.pt", "tiny_gpt.pt2"):
        r = run(["fsdp-plan", os.path.join(ROOT, "sample_models", model), "--policy",
                 os.path.join(ROOT, "policies", "transformer.json"), "--format", "json"], env=env)
        ok = r.returncode == 0 and len(json.loads(r.stdout or "{}").get("units", [])) == 4
        check(ok, f"fsdp-plan {model} from PATH, LD_LIBRARY_PATH empty: 4 units", r.stderr.strip()[-300:])
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        cmake_version = re.search(r"project\(fsdp-plan\s+VERSION\s+([0-9.]+)", f.read()).group(1)
    shown = run(["fsdp-plan", "--version"], env=env).stdout.strip()
    meta = run([py, "-c", "import importlib.metadata as m; print(m.version('fsdp-plan'))"]).stdout.strip()
    pkg = run([py, "-c", "import fsdp_plan; print(fsdp_plan.__version__)"]).stdout.strip()
    check(shown == f"fsdp-plan {cmake_version}" and meta == cmake_version == pkg,
          f"versions agree: CMakeLists.txt {cmake_version}, fsdp-plan --version {shown!r}, wheel {meta}, "
          f"fsdp_plan.__version__ {pkg}")
    r = run(["fsdp-plan-export", "--help"], env=env)
    check(r.returncode == 0 and "usage: fsdp-plan-export" in r.stdout, "fsdp-plan-export --help without torch",
          r.stderr[-300:])
    # A readable config, so the export gets past its input checks to the import of torch.
    config_dir = os.path.join(venv, "tiny_llama")
    os.makedirs(config_dir, exist_ok=True)
    with open(os.path.join(config_dir, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
                   "vocab_size": 256}, f)
    r = run(["fsdp-plan-export", config_dir, "-o", os.path.join(venv, "x.pt2")], env=env)
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 2 and len(lines) == 1 and "needs torch" in lines[0],
          "fsdp-plan-export without torch: exit 2, one line", f"exit {r.returncode}: {lines}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
