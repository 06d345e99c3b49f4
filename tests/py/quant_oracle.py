"""quant_oracle.py - numpy/ml_dtypes re-implementations of the NVFP4 (ModelOpt)
and MXFP4 (OCP MX v1.0) quantizers and of the CUTLASS 128x4 scale swizzle,
compared bit for bit with fm_quantize / fm_dequantize / fm_sf_swizzle through
tests/format_dump.c.  Driven by codec_oracle.py (which owns the seed).

Every arithmetic step is float32, in the order docs/formats.md states, so the
match must be exact: data bytes, scale bytes, the global scale and every
dequantized float.
"""
import struct

import numpy as np
import ml_dtypes as md

F32 = np.float32
FLT_MIN = F32(1.17549435e-38)


def e2m1_codes(q):
    """float32 -> E2M1 codes (ml_dtypes saturates to +-6 and rounds ties to even)."""
    return q.astype(md.float4_e2m1fn).view(np.uint8) & 0xF


def pack(codes):
    """Two codes per byte, the low nibble holds the even column (ModelOpt)."""
    c = codes.reshape(codes.shape[0], -1, 2)
    return (c[..., 0] | (c[..., 1] << 4)).astype(np.uint8)


def e2m1_values(codes):
    return codes.astype(np.uint8).view(md.float4_e2m1fn).astype(F32)


def ref_nvfp4(x, global_in=None):
    rows, cols = x.shape
    amax = np.max(np.abs(x)) if x.size else F32(0)
    if global_in is not None:
        g = F32(global_in)
    elif amax > 0:
        g = F32(amax / F32(2688.0))
        if not g >= FLT_MIN:
            g = FLT_MIN
    else:
        g = F32(1.0)
    xb = x.reshape(rows, cols // 16, 16)
    amax_b = np.max(np.abs(xb), axis=-1)
    with np.errstate(over="ignore"):
        sc = amax_b / (F32(6.0) * g)
    sc_code = np.clip(sc, F32(-448), F32(448)).astype(md.float8_e4m3fn)  # saturating E4M3
    s = sc_code.astype(F32)
    denom = (s * g)[..., None]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        q = np.where(denom != 0, xb / denom, F32(0)).astype(F32)
    codes = e2m1_codes(q).reshape(rows, cols)
    deq = ((e2m1_values(codes).reshape(rows, cols // 16, 16) * s[..., None]) * g).reshape(rows, cols)
    return pack(codes), sc_code.view(np.uint8), g, deq


def ref_mxfp4(x):
    rows, cols = x.shape
    xb = x.reshape(rows, cols // 32, 32)
    amax_b = np.max(np.abs(xb), axis=-1)
    e = np.frexp(amax_b)[1].astype(np.int64) - 1 - 2  # floor(log2(amax)) - emax(E2M1)
    e = np.where(amax_b == 0, -127, np.clip(e, -127, 127))
    scale = np.ldexp(F32(1.0), e).astype(F32)
    q = (xb / scale[..., None]).astype(F32)
    codes = e2m1_codes(q).reshape(rows, cols)
    deq = ((e2m1_values(codes).reshape(rows, cols // 32, 32) * scale[..., None]) * F32(1.0)).reshape(rows, cols)
    return pack(codes), (e + 127).astype(np.uint8), F32(1.0), deq


def matrices(rng, block, small):
    """Shapes at and around block boundaries; magnitudes that hit every corner:
    Gaussian, huge and tiny overall scale, per-block magnitudes spread over 60
    decades (E4M3 scale underflow and saturation), zero blocks, one outlier."""
    shapes = [(1, block), (3, 2 * block), (7, 5 * block), (33, 12 * block)]
    if not small:
        shapes.append((130, 64 * block))
    for rows, cols in shapes:
        g = rng.standard_normal((rows, cols)).astype(F32)
        yield "gaussian", g
        yield "gaussian*1e-30", (g * F32(1e-30)).astype(F32)
        yield "gaussian*1e30", (g * F32(1e30)).astype(F32)
        spread = np.exp2(rng.uniform(-100, 100, (rows, cols // block, 1))).astype(F32)
        yield "per-block 2^[-100,100]", (g.reshape(rows, -1, block) * spread).reshape(rows, cols).astype(F32)
        z = g.copy()
        z.reshape(rows, -1, block)[:, ::2, :] = 0
        yield "zero blocks", z
        o = g.copy()
        o.flat[rng.integers(0, o.size)] = F32(1e6)
        yield "one outlier", o
        t = rng.choice(np.array([0, 0.25, 0.75, 1.25, 2.5, 5.0, 6.0, -0.25, -5.0], F32), (rows, cols))
        yield "ties on the E2M1 grid", t
    yield "all zero", np.zeros((2, 2 * block), F32)


def parse(out, rows, cols, block):
    st = struct.unpack("<i", out[:4])[0]
    db, sb = rows * cols // 2, rows * (cols // block)
    o = 4
    data = np.frombuffer(out[o:o + db], np.uint8).reshape(rows, cols // 2)
    o += db
    scales = np.frombuffer(out[o:o + sb], np.uint8).reshape(rows, cols // block)
    o += sb
    g = np.frombuffer(out[o:o + 4], F32)[0]
    o += 4
    deq = np.frombuffer(out[o:], F32).reshape(rows, cols)
    return st, data, scales, g, deq


def test_quant(dump, rng, run, check, small):
    n = 0
    for fmt, block in (("nvfp4", 16), ("mxfp4", 32)):
        for what, x in matrices(rng, block, small):
            rows, cols = x.shape
            globals_ = [None]
            if fmt == "nvfp4":
                globals_.append(F32(np.float32(rng.uniform(1e-3, 1e3))))
            for gin in globals_:
                args = ["quant", fmt, rows, cols] + ([repr(float(gin))] if gin is not None else [])
                st, data, scales, g, deq = parse(run(dump, args, x.tobytes()), rows, cols, block)
                tag = f"{fmt} {what} {rows}x{cols}" + (f" global={gin}" if gin is not None else "")
                check(f"{tag}: status", st == 0, f"status {st}")
                if st != 0:
                    continue
                if fmt == "nvfp4":
                    rd, rs, rg, rq = ref_nvfp4(x, None if gin is None else F32(float(repr(float(gin)))))
                else:
                    rd, rs, rg, rq = ref_mxfp4(x)
                check(f"{tag}: data bytes", np.array_equal(data, rd), f"{np.count_nonzero(data != rd)} differ")
                check(f"{tag}: scale bytes", np.array_equal(scales, rs), f"{np.count_nonzero(scales != rs)} differ")
                check(f"{tag}: global scale", F32(g).view(np.uint32) == F32(rg).view(np.uint32), f"{g} vs {rg}")
                check(f"{tag}: dequantized", np.array_equal(deq.view(np.uint32), rq.view(np.uint32)),
                      f"{np.count_nonzero(deq.view(np.uint32) != rq.view(np.uint32))} differ")
                n += 1
    print(f"# quantizer cross-check: {n} matrices bit-exact against numpy/ml_dtypes")


def ref_swizzle(sf, rows, sf_cols):
    """The host-side formulation used by vLLM / SGLang: pad to (128, 4), view as
    (row tiles, 4, 32, col tiles, 4) and permute to (row tile, col tile, 32, 4, 4)."""
    rp, kp = -(-rows // 128) * 128, -(-sf_cols // 4) * 4
    pad = np.zeros((rp, kp), np.uint8)
    pad[:rows, :sf_cols] = sf
    return pad.reshape(rp // 128, 4, 32, kp // 4, 4).transpose(0, 3, 2, 1, 4).reshape(-1)


def test_swizzle(dump, rng, run, check):
    for rows, sf_cols in [(1, 1), (128, 4), (129, 5), (200, 7), (255, 12), (384, 384 // 16), (77, 96)]:
        sf = rng.integers(1, 256, (rows, sf_cols), dtype=np.uint8)  # never 0, so padding is visible
        got = np.frombuffer(run(dump, ["swz", rows, sf_cols], sf.tobytes()), np.uint8)
        want = ref_swizzle(sf, rows, sf_cols)
        check(f"swizzle {rows}x{sf_cols}", np.array_equal(got, want),
              f"{np.count_nonzero(got != want) if got.size == want.size else 'size'} differ")
