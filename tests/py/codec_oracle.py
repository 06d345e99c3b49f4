#!/usr/bin/env python3
"""codec_oracle.py - fp4moe's format codecs against independent oracles.

Oracles: ml_dtypes (float4_e2m1fn, float8_e4m3fn, float8_e8m0fnu, bfloat16)
and numpy (float16) for the scalar codecs; a numpy/ml_dtypes re-implementation
of the NVFP4 (ModelOpt) and MXFP4 (OCP MX) quantizers; numpy's
reshape/transpose formulation of the CUTLASS 128x4 scale swizzle (the one
vLLM / SGLang / FlashInfer use on the host) for fm_sf_swizzle.

The C side is tests/format_dump.c, driven through raw binary pipes.
Inputs are generated fresh on every run from a printed seed (FM_SEED replays).

Usage: codec_oracle.py PATH/TO/format_dump
Exit 0 = all match; 1 = a mismatch or a missing dependency (never "skipped":
scripts/deps.sh installs numpy and ml_dtypes).

Where our codecs differ from ml_dtypes on purpose (docs/formats.md):
  E4M3: |x| > 448 and +-Inf saturate to +-448 (ml_dtypes: NaN above 464).
  E2M1: NaN -> +0 (ml_dtypes: an artefact, -0 for +NaN).
  BF16/FP16: NaN -> a NaN of the same sign (payload not compared).
Each of these is checked as its own policy, never silently masked.

Where ml_dtypes versions differ, the test checks the rule itself (ue8m0_rule
below, docs/formats.md) instead of the installed library, so the result does
not depend on the version: UE8M0 of positive float32 subnormals (ml_dtypes
<= 0.6 gives 0x01 for all of (2^-127, 1.5 * 2^-127), 0.7.0 and the rule 0x00).
Everywhere else the rule must also agree with ml_dtypes (a check of the
formulation). scripts/requirements.txt pins the version this was tested with;
another one prints a note, not a failure.
"""
import os
import subprocess
import sys
import time

try:
    import numpy as np
    import ml_dtypes as md
except ImportError as e:  # a missing oracle is a failure, not a skip
    print(f"FAIL: the codec oracle needs numpy and ml_dtypes ({e}); run scripts/deps.sh", file=sys.stderr)
    sys.exit(1)

F32 = np.float32
FAILS = []


def run(dump, args, data):
    p = subprocess.run([dump] + [str(a) for a in args], input=data, stdout=subprocess.PIPE, check=False)
    if p.returncode != 0:
        raise SystemExit(f"FAIL: format_dump {' '.join(map(str, args))} exited {p.returncode}")
    return p.stdout


def check(what, ok, detail=""):
    if not ok:
        FAILS.append(what)
        print(f"MISMATCH {what} {detail}")


def report_diff(what, x, got, want):
    bad = np.nonzero(got != want)[0]
    check(what, bad.size == 0, f"{bad.size} of {got.size} differ")
    for i in bad[:8]:
        print(f"   x={x[i]!r} (bits 0x{x.view(np.uint32)[i]:08x}) got 0x{int(got[i]):x} want 0x{int(want[i]):x}")


# ---- scalar codecs --------------------------------------------------------------

CODECS = {
    # name: (oracle dtype, code dtype, number of codes)
    "e2m1": (md.float4_e2m1fn, np.uint8, 16),
    "e4m3": (md.float8_e4m3fn, np.uint8, 256),
    "ue8m0": (md.float8_e8m0fnu, np.uint8, 256),
    "bf16": (md.bfloat16, np.uint16, 65536),
    "fp16": (np.float16, np.uint16, 65536),
}


def oracle_decode(name, codes):
    dt, cdt, _ = CODECS[name]
    if name == "e2m1":  # ml_dtypes keeps a 4-bit type in a byte; mask the high nibble
        codes = codes & 0xF
    return codes.astype(cdt).view(dt).astype(F32)


def oracle_encode(name, x):
    dt, cdt, _ = CODECS[name]
    with np.errstate(over="ignore", invalid="ignore"):
        c = x.astype(dt).view(cdt).copy()
    if name == "e2m1":
        c &= 0xF
    return c


def boundary_inputs(name, rng):
    """Every representable value, every midpoint between neighbours (the RNE
    ties), their float32 neighbours, the overflow threshold, subnormals."""
    _, cdt, n = CODECS[name]
    vals = oracle_decode(name, np.arange(n, dtype=np.int64).astype(cdt))
    pos = np.unique(vals[np.isfinite(vals) & (vals >= 0)].astype(np.float64))
    mids = (pos[:-1] + pos[1:]) / 2
    top = pos[-1] + (pos[-1] - pos[-2]) / 2  # where RNE would round past the max
    pts = np.concatenate([pos, mids, [top, pos[-1] * 2, pos[0] / 2, pos[1] / 2]])
    with np.errstate(over="ignore"):
        p32 = pts.astype(F32)
    exact = p32.astype(np.float64) == pts
    if name != "bf16":  # bf16's overflow midpoint 2^128 - 2^119 is not a float32: Inf
        check(f"{name}: midpoints exact in float32", bool(exact[: pos.size + mids.size].all()))
    p32 = p32[np.isfinite(p32)]
    up = np.nextafter(p32, F32(np.inf))
    dn = np.nextafter(p32, F32(0))
    specials = np.array([0.0, np.inf, np.nan, 1e-45, 1.17549435e-38, 5.877472e-39, 3.4028235e38], F32)
    sub = rng.integers(0, 0x800000, 4096, dtype=np.uint32).view(F32)  # float32 subnormals
    allp = np.concatenate([p32, up, dn, specials, sub])
    return np.concatenate([allp, -allp])


def random_inputs(name, rng, n):
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(F32)  # any pattern
    lo, hi = {"e2m1": (-6, 4), "e4m3": (-12, 10), "ue8m0": (-130, 128), "bf16": (-135, 128), "fp16": (-26, 17)}[name]
    mag = np.exp2(rng.uniform(lo, hi, n)).astype(F32)  # log-uniform over the format's range
    sign = np.where(rng.random(n) < 0.5, F32(-1), F32(1))
    with np.errstate(over="ignore"):
        return np.concatenate([bits, mag * sign])


def ue8m0_rule(x):
    """UE8M0 codes of float32 x by the rule in docs/formats.md, in float64 where
    every value involved is exact: NaN, Inf, x <= 0 -> 0xFF; else the nearest
    2^(c-127), ties up; below 2^-127 -> 0x00; nearest 2^128 -> 0xFF."""
    with np.errstate(invalid="ignore"):
        d = x.astype(np.float64)
    out = np.full(x.shape, 0xFF, np.int64)
    pos = np.isfinite(d) & (d > 0)
    m, ex = np.frexp(d[pos])  # d = m * 2^ex, m in [0.5, 1): 2^(ex-1) <= d < 2^ex
    lo, hi = np.ldexp(1.0, ex - 1), np.ldexp(1.0, ex)
    c = (ex - 1 + 127) + (hi - d[pos] <= d[pos] - lo)
    c = np.where(ex - 1 < -127, 0, c)  # nothing smaller than 2^-127 to round to
    out[pos] = np.where(c >= 255, 0xFF, c)
    return out.astype(np.uint8)


def version_dependent(name, x):
    """Inputs whose ml_dtypes result is known to differ between versions."""
    if name == "ue8m0":
        u = x.view(np.uint32)
        return (u >> 23 == 0) & (u != 0)  # positive float32 subnormals
    return np.zeros(x.shape, bool)


def expected_codes(name, x):
    want = oracle_encode(name, x)
    if name == "ue8m0":
        rule = ue8m0_rule(x)
        vd = version_dependent(name, x)
        report_diff("ue8m0: the rule agrees with ml_dtypes outside the version-dependent inputs",
                    x[~vd], rule[~vd], want[~vd])
        want[vd] = rule[vd]
    if name == "e4m3":  # stated policy: saturate, never NaN, for any non-NaN |x| > 448
        ovf = ~np.isnan(x) & (np.abs(x) > 448)
        want[ovf] = np.where(np.signbit(x[ovf]), 0xFE, 0x7E)
    if name == "e2m1":
        want[np.isnan(x)] = 0x0
    return want


def test_codec(dump, name, rng, n_random):
    dt, cdt, n = CODECS[name]
    # 1. every code decodes like the oracle (NaN codes: both NaN)
    codes = np.arange(n, dtype=np.int64).astype(cdt)
    got = np.frombuffer(run(dump, ["dec", name], codes.tobytes()), F32)
    want = oracle_decode(name, codes)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    report_diff(f"{name}: decode of all {n} codes", codes, np.where(same, 0, 1), np.zeros(n))

    # 2. encode: boundaries and random floats
    x = np.concatenate([boundary_inputs(name, rng), random_inputs(name, rng, n_random)]).astype(F32)
    got = np.frombuffer(run(dump, ["enc", name], x.tobytes()), cdt)
    want = expected_codes(name, x)
    nan_in = np.isnan(x)
    if name in ("bf16", "fp16"):  # NaN -> NaN of the same sign; payload not compared
        dec = oracle_decode(name, got)
        nan_ok = np.isnan(dec[nan_in]) & (np.signbit(dec[nan_in]) == np.signbit(x[nan_in]))
        check(f"{name}: NaN stays NaN with its sign", bool(nan_ok.all()))
        got, want, x = got[~nan_in], want[~nan_in], x[~nan_in]
    report_diff(f"{name}: encode of {x.size} boundary + random floats", x, got, want)

    # 3. round trip of every finite decoded value
    vals = oracle_decode(name, codes)
    fin = np.isfinite(vals)
    rt = np.frombuffer(run(dump, ["enc", name], vals[fin].tobytes()), cdt)
    report_diff(f"{name}: encode(decode(code)) == code", vals[fin], rt, codes[fin])


def test_policies(dump):
    """The deliberate differences from ml_dtypes, stated one by one."""
    x = np.array([448, 449, 464, 465, 1e30, np.inf, -465, -np.inf], F32)
    got = np.frombuffer(run(dump, ["enc", "e4m3"], x.tobytes()), np.uint8)
    check("e4m3 saturates above 448", list(got) == [0x7E] * 6 + [0xFE] * 2, str(list(map(hex, got))))
    ml = oracle_encode("e4m3", x)
    check("ml_dtypes e4m3 gives NaN above 464 (the difference is real)", list(ml[[3, 4, 5]]) == [0x7F] * 3)
    y = np.array([np.nan, -np.nan], F32)
    got = np.frombuffer(run(dump, ["enc", "e4m3"], y.tobytes()), np.uint8)
    check("e4m3 NaN -> 0x7F / 0xFF by sign", list(got) == [0x7F, 0xFF], str(list(map(hex, got))))
    got = np.frombuffer(run(dump, ["enc", "e2m1"], y.tobytes()), np.uint8)
    check("e2m1 NaN -> +0", list(got) == [0, 0], str(list(map(hex, got))))
    z = np.array([0.0, -0.0, -1.0, np.inf, np.nan, 1.5 * 2.0**127], F32)
    got = np.frombuffer(run(dump, ["enc", "ue8m0"], z.tobytes()), np.uint8)
    check("ue8m0 x<=0 / Inf / NaN / >=1.5*2^127 -> 0xFF", list(got) == [0xFF] * 6, str(list(map(hex, got))))
    # float32 subnormals, where ml_dtypes versions differ: the rule, by hand
    b = np.array([0x00000001, 0x00400000, 0x00400001, 0x005FFFFF, 0x00600000, 0x007FFFFF, 0x80400001], np.uint32)
    got = np.frombuffer(run(dump, ["enc", "ue8m0"], b.view(F32).tobytes()), np.uint8)
    check("ue8m0 subnormals: (0, 1.5*2^-127) -> 0x00, [1.5*2^-127, 2^-126) -> 0x01, negative -> 0xFF",
          list(got) == [0, 0, 0, 0, 1, 1, 0xFF], str(list(map(hex, got))))


def pinned_versions():
    """name -> version from scripts/requirements.txt ('name==version' lines)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "requirements.txt")
    out = {}
    try:
        for line in open(path):
            line = line.split("#")[0].strip()
            if "==" in line:
                k, v = line.split("==", 1)
                out[k.strip().lower().replace("_", "-")] = v.strip()
    except OSError:
        pass
    return out


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from quant_oracle import test_quant, test_swizzle  # noqa: E402

    if len(sys.argv) != 2:
        raise SystemExit("usage: codec_oracle.py PATH/TO/format_dump")
    dump = sys.argv[1]
    seed = int(os.environ.get("FM_SEED", "0"), 0) or (time.time_ns() & 0xFFFFFFFF)
    print(f"# FM_SEED={seed} (set FM_SEED to replay); ml_dtypes {md.__version__}, numpy {np.__version__}")
    pinned = pinned_versions()
    for mod, pkg in ((md, "ml-dtypes"), (np, "numpy")):
        if pkg in pinned and mod.__version__ != pinned[pkg]:
            print(f"# note: {pkg} {mod.__version__} is not the tested {pinned[pkg]} (scripts/requirements.txt);"
                  " version-dependent inputs are checked against the rule, so this is not a failure")
    rng = np.random.default_rng(seed)
    small = os.environ.get("FM_ASAN") == "1"
    for name in CODECS:
        test_codec(dump, name, rng, 20000 if small else 400000)
    test_policies(dump)
    test_quant(dump, rng, run, check, small)
    test_swizzle(dump, rng, run, check)
    if FAILS:
        print(f"FAIL: {len(FAILS)} check(s) failed")
        sys.exit(1)
    print("OK: all codec, quantizer and swizzle checks match the oracles")
