#!/usr/bin/env python3
"""sass_mix.py - the instruction mix of every kernel's innermost MMA loop, from the SASS.

mac/ins: the multiply-adds of the loop's tensor instructions per instruction the warp issues
(a warpgroup MMA counted a quarter a warp): the loop's ceiling on tensor work per issue slot.
A static counter for kernel work when no GPU is at hand: for each target (arch) and kernel
of an object file, cubin or executable, the innermost backward-branch loops that hold a
tensor instruction, with their instructions counted by kind (MMA, conversions, FP32 math,
decode bit-ops, loads, barriers). And a check of the fact that decides where a W4A8 GEMM can
pay: whether an FP8 MMA is native on a target (QMMA / QGMMA) or lowered by ptxas to FP16 HMMAs
with conversions (F2FP ... E4M3 -> F16) and FADDs, as on sm_90a and sm_100f for mma.sync.

  sass_mix.py OBJ [--kernel SUBSTR] [--arch SUBSTR] [--csv]
  sass_mix.py OBJ --expect ARCH:KERNEL_SUBSTR:native|lowered [...]   (exit 1 if one fails)

cuobjdump comes from $CUOBJDUMP, else PATH, else the CUDA toolkit next to nvcc, else the pinned
nvidia-cuda-cuobjdump wheel of the project's venv (scripts/requirements-headers.txt). Exit 77
(ctest: skipped) when none is found or OBJ holds no SASS.
"""
import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys

KINDS = [  # (column, test on the opcode without predicate and modifiers' tail)
    ("mma", lambda o: re.match(r"^(H|Q|I|O|U)?G?MMA\b|^[HQIO]GMMA|^UTC", o) is not None),
    ("f2fp", lambda o: o.startswith("F2FP")),
    ("ffma", lambda o: o.startswith("FFMA")),
    ("fmul", lambda o: o.startswith("FMUL")),
    ("fadd", lambda o: o.startswith("FADD")),
    ("half", lambda o: o[:5] in ("HMUL2", "HFMA2", "HADD2")),
    ("bitop", lambda o: o.startswith(("PRMT", "LOP3", "SHF", "BFE", "BFI"))),
    ("int", lambda o: o.startswith(("IMAD", "IADD", "VIADD", "LEA", "ISETP"))),
    ("lds", lambda o: o.startswith(("LDS", "LDSM"))),
    ("ldg", lambda o: o.startswith(("LDG", "LDGSTS", "UTMALDG", "LDGDEPBAR"))),
    ("bar", lambda o: o.startswith(("BAR", "DEPBAR", "SYNCS", "WARPSYNC"))),
]


def find_cuobjdump():
    for c in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")):
        if c and os.access(c, os.X_OK):
            return c
    nvcc = shutil.which("nvcc")
    if nvcc:
        c = os.path.join(os.path.dirname(nvcc), "cuobjdump")
        if os.access(c, os.X_OK):
            return c
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    venv = os.environ.get("FM_VENV", os.path.join(root, ".venv"))
    for c in sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "nvidia", "cu*", "bin", "cuobjdump"))):
        if os.access(c, os.X_OK):
            return c
    return None


def opcode(text):
    t = text.split(None, 1)[1] if text.startswith("@") else text
    return t.split()[0] if t.split() else ""


def kind(op):
    for name, test in KINDS:
        if test(op):
            return name
    return "other"


def parse(sass):
    """{(arch, function): [(address, instruction text)]}"""
    out, arch, fn = {}, None, None
    for line in sass.splitlines():
        m = re.match(r"\s*arch = (\S+)", line)
        if m:
            arch, fn = m.group(1), None
            continue
        m = re.search(r"Function : (\S+)", line)
        if m:
            fn = m.group(1)
            out[(arch, fn)] = []
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m and fn is not None:
            out[(arch, fn)].append((int(m.group(1), 16), m.group(2).strip()))
    return out


def mma_loops(ins):
    """The innermost backward-branch loops that hold a tensor instruction: [(start, end, body)]"""
    loops = []
    for addr, text in ins:
        m = re.search(r"\bBRA\S*\s+(?:`?\(?\S*\)?\s*)?(?:!?U?P[T0-9]+,\s*)?(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) <= addr:
            lo = int(m.group(1), 16)
            body = [t for a, t in ins if lo <= a <= addr]
            if any(kind(opcode(t)) == "mma" for t in body):
                loops.append((lo, addr, body))
    inner = [l for l in loops if not any(o is not l and l[0] <= o[0] and o[1] <= l[1] for o in loops)]
    return inner


def demangle(names):
    """{mangled: readable} through c++filt where there is one (binutils), else a cut of the name"""
    out = {n: n for n in names}
    f = shutil.which("c++filt")
    if f and names:
        r = subprocess.run([f], input="\n".join(names), capture_output=True, text=True)
        if r.returncode == 0 and len(r.stdout.splitlines()) == len(names):
            out = dict(zip(names, r.stdout.splitlines()))
    for n, d in out.items():
        d = re.sub(r"\(anonymous namespace\)::|fm_kc::", "", d)
        d = re.sub(r"\(.*\)$", "", d).replace("void ", "")
        out[n] = d.replace(" ", "")
    return out


def macs_per_warp(text):
    """Multiply-adds one warp's tensor instruction does: mma.sync shapes (HMMA.16816 = 16x8x16 ...)
    per warp; warpgroup MMAs (HGMMA / QGMMA.64xNxK) per warpgroup, so a quarter a warp"""
    op = opcode(text)
    m = re.match(r"^[A-Z]*GMMA\.(\d+)x(\d+)x(\d+)", op)
    if m:
        return int(m.group(1)) * int(m.group(2)) * int(m.group(3)) // 4
    m = re.match(r"^[A-Z]*MMA\.(\d)(\d)(\d+)", op)  # 16816 -> 16 8 16, 1688 -> 16 8 8, 16832
    if m:
        digits = op.split(".")[1]
        m2 = re.match(r"^(16)(8)(\d+)$", digits)
        if m2:
            return 16 * 8 * int(m2.group(3))
    return 0


def fp8_status(body):
    """native: QMMA / QGMMA; lowered: F2FP from E4M3 / E5M2 feeding HMMAs; none: no FP8 there"""
    if any(re.match(r"^(@\S+\s+)?Q(G)?MMA", t) for t in body):
        return "native"
    if any("F2FP" in t and ("E4M3" in t or "E5M2" in t) for t in body) and any("HMMA" in t for t in body):
        return "lowered"
    return "none"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("obj")
    ap.add_argument("--kernel", default="")
    ap.add_argument("--arch", default="")
    ap.add_argument("--csv", action="store_true")
    ap.add_argument("--expect", action="append", default=[], help="ARCH:KERNEL_SUBSTR:native|lowered")
    a = ap.parse_args()
    cu = find_cuobjdump()
    if not cu:
        print("sass_mix: SKIP: no cuobjdump (set CUOBJDUMP, or scripts/deps.sh installs nvidia-cuda-cuobjdump)")
        return 77
    env = dict(os.environ)  # cuobjdump runs nvdisasm: the one beside it first (the wheels' bin/)
    env["PATH"] = os.path.dirname(cu) + os.pathsep + env.get("PATH", "")
    r = subprocess.run([cu, "-sass", a.obj], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print("sass_mix: cuobjdump -sass %s failed: %s" % (a.obj, r.stderr.strip()[:300]))
        return 1
    funcs = parse(r.stdout)
    if not funcs:
        print("sass_mix: SKIP: %s holds no SASS" % a.obj)
        return 77
    rows = []
    names = demangle(sorted(set(fn for _, fn in funcs)))
    for (arch, fn), ins in funcs.items():
        if a.kernel not in fn or a.arch not in (arch or ""):
            continue
        for lo, hi, body in mma_loops(ins):
            c = collections.Counter(kind(opcode(t)) for t in body)
            mmas = collections.Counter(opcode(t).split(".")[0] + "." + ".".join(opcode(t).split(".")[1:3])
                                       for t in body if kind(opcode(t)) == "mma")
            c["macs"] = sum(macs_per_warp(t) for t in body if kind(opcode(t)) == "mma")
            rows.append((arch, names[fn], fn, lo, len(body), c, dict(mmas), fp8_status(body)))
    cols = [k for k, _ in KINDS] + ["other"]
    if a.csv:
        print("arch,kernel,loop,instr,macs_per_instr," + ",".join(cols) + ",mma_ops,fp8")
        for arch, name, _, lo, n, c, mm, st in rows:
            print("%s,\"%s\",%#x,%d,%.1f,%s,%s,%s" % (arch, name, lo, n, c["macs"] / n, ",".join(str(c[k]) for k in cols),
                                             " ".join("%s x%d" % kv for kv in sorted(mm.items())), st))
    elif not a.expect:
        print("%-8s %-40s %7s %5s %7s " % ("arch", "kernel", "loop", "instr", "mac/ins") +
              " ".join("%5s" % k for k in cols) + "  fp8")
        for arch, name, _, lo, n, c, mm, st in rows:
            print("%-8s %-40s %#7x %5d %7.1f " % (arch, name[:40], lo, n, c["macs"] / n) +
                  " ".join("%5d" % c[k] for k in cols) +
                  "  %s  [%s]" % (st, " ".join("%s x%d" % kv for kv in sorted(mm.items()))))
    bad = 0
    for e in a.expect:
        try:
            arch, ksub, want = e.split(":")
        except ValueError:
            print("sass_mix: --expect %r: want ARCH:KERNEL_SUBSTR:native|lowered" % e)
            return 2
        hit = [row for row in rows if arch in (row[0] or "") and (ksub in row[1] or ksub in row[2])]
        got = sorted(set(row[7] for row in hit))
        ok = bool(hit) and got == [want]
        bad += not ok
        print("%s %s:%s: %d MMA loops, FP8 %s (want %s)" % ("ok  " if ok else "FAIL", arch, ksub, len(hit),
                                                          "/".join(got) if got else "-", want))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
