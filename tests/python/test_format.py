"""quantize / dequantize: bit-identical to the C library, and dequantize equal to
an independent decoder (moe_ref.dequant: the E2M1 table, ml_dtypes E4M3, 2^(c-127)).

The C side is reached two ways that do not go through the package's wrapper:
tests/format_dump (a C program over the same library, $FP4MOE_FORMAT_DUMP, set
by the CTest registration) and a raw ctypes call of fm_quantize."""

import ctypes as C
import os
import struct
import subprocess

import numpy as np
import pytest

import fp4moe
import moe_ref
from fp4moe import _lib

FMTS = ["nvfp4", "mxfp4", "bf16"]


def inputs(rng, rows, cols):
    """Normal values, a wide dynamic range, exact codes, zeros and ties."""
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x[0] *= np.float32(1e-3)
    x[1] = rng.choice([0, 0.25, 0.75, 2.5, 5, -6, 3], cols)  # E2M1 ties and exact values
    x[2] = 0
    x[3] *= np.exp2(rng.integers(-20, 20, cols)).astype(np.float32)
    return x


def raw_quantize(x, fmt, global_scale=None):
    """fm_quantize called directly: (status, data bytes, scale bytes, global)."""
    rows, cols = x.shape
    code = fp4moe.format.FORMATS[fmt]
    db, sb = C.c_size_t(), C.c_size_t()
    assert _lib.lib.fm_qtensor_bytes(code, rows, cols, C.byref(db), C.byref(sb)) == 0
    data, scales = C.create_string_buffer(db.value), C.create_string_buffer(max(sb.value, 1))
    t = _lib.QTensor(code, rows, cols, C.addressof(data), C.addressof(scales) if sb.value else None, 1.0)
    g = None if global_scale is None else C.byref(C.c_float(global_scale))
    st = _lib.lib.fm_quantize(np.ascontiguousarray(x, np.float32).ctypes.data, g, C.byref(t))
    return st, data.raw, scales.raw[:sb.value], t.global_scale


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("global_scale", [None, 0.0123])
def test_wrapper_equals_raw_c_call(rng, fmt, global_scale):
    if global_scale is not None and fmt != "nvfp4":
        pytest.skip("only NVFP4 has a global scale")
    x = inputs(rng, 8, 128)
    q = fp4moe.quantize(x, fmt, global_scale)
    st, data, scales, g = raw_quantize(x, fmt, global_scale)
    assert st == 0
    assert q.data.tobytes() == data
    assert (b"" if q.scales is None else q.scales.tobytes()) == scales
    assert struct.pack("<f", q.global_scale) == struct.pack("<f", g)


@pytest.mark.parametrize("fmt", FMTS)
def test_against_format_dump(rng, fmt):
    exe = os.environ.get("FP4MOE_FORMAT_DUMP")
    if not exe:
        pytest.skip("FP4MOE_FORMAT_DUMP (tests/format_dump from the build) not set: run through ctest")
    rows, cols = 6, 96
    x = inputs(rng, rows, cols)
    res = subprocess.run([exe, "quant", fmt, str(rows), str(cols)], input=x.tobytes(), capture_output=True,
                         check=True).stdout
    assert struct.unpack_from("<i", res)[0] == 0
    q = fp4moe.quantize(x, fmt)
    d = fp4moe.dequantize(q)
    nd = q.data.nbytes
    ns = 0 if q.scales is None else q.scales.nbytes
    off = 4
    assert res[off:off + nd] == q.data.tobytes()
    assert res[off + nd:off + nd + ns] == (b"" if q.scales is None else q.scales.tobytes())
    assert res[off + nd + ns:off + nd + ns + 4] == struct.pack("<f", q.global_scale)
    assert res[off + nd + ns + 4:] == d.tobytes()


@pytest.mark.parametrize("fmt", FMTS)
def test_dequantize_equals_independent_decoder(rng, fmt):
    x = inputs(rng, 8, 64)
    q = fp4moe.quantize(x, fmt)
    got = fp4moe.dequantize(q)
    want = moe_ref.dequant(q.data, q.scales, q.global_scale, fmt)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_mxfp4_requantize_is_identity(rng):
    """Dequantized MXFP4 values quantize back to the same bytes (a block's amax code is 4 or 6)."""
    q = fp4moe.quantize(inputs(rng, 8, 64), "mxfp4")
    q2 = fp4moe.quantize(fp4moe.dequantize(q), "mxfp4")
    assert np.array_equal(q.data, q2.data) and np.array_equal(q.scales, q2.scales)


def test_nvfp4_layout(rng):
    """Low nibble = even column, one E4M3 scale per 16, ModelOpt's global amax / (6 * 448)."""
    x = np.zeros((1, 16), np.float32)
    x[0, 0], x[0, 1] = 6.0, -0.5
    q = fp4moe.quantize(x, "nvfp4")
    assert q.data.shape == (1, 8) and q.scales.shape == (1, 1)
    assert q.global_scale == np.float32(6.0) / np.float32(6 * 448)
    assert q.data[0, 0] == (0x7 | (0x9 << 4))  # +6 low, -0.5 (sign | 1) high


def test_qtensor_wraps_checkpoint_arrays(rng):
    q = fp4moe.quantize(inputs(rng, 4, 32), "nvfp4")
    import ml_dtypes
    w = fp4moe.qtensor("nvfp4", q.data, q.scales.view(ml_dtypes.float8_e4m3fn), q.global_scale)
    assert np.array_equal(fp4moe.dequantize(w), fp4moe.dequantize(q))


@pytest.fixture
def guarded():
    """bytes(n) -> a uint8 array of n bytes ending where an inaccessible page begins: C
    reading one byte past it faults (instead of reading a neighbour's bytes unseen)."""
    import mmap

    page = mmap.PAGESIZE
    m = mmap.mmap(-1, 2 * page)
    base = np.frombuffer(m, np.uint8)
    libc = C.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [C.c_void_p, C.c_size_t, C.c_int]
    assert libc.mprotect(base.ctypes.data + page, page, 0) == 0  # PROT_NONE
    made = []

    def make(n):
        made.append(base[page - n:page])
        return made[-1]
    yield make
    libc.mprotect(base.ctypes.data + page, page, 3)  # PROT_READ | PROT_WRITE, so that unmapping is ordinary
    made.clear()
    del base
    m.close()


def test_qtensor_scales_smaller_than_data(rng, guarded):
    """A QTensor built directly whose scales do not cover its data is refused before C
    reads it (which ran past the array: here into a PROT_NONE page, a crash)."""
    q = fp4moe.quantize(rng.standard_normal((8, 64)).astype(np.float32), "nvfp4")  # scales [8][4]
    small = guarded(8 * 2)
    small[:] = q.scales[:4].ravel()[:16]
    for scales, msg in ((small.reshape(8, 2), r"q.scales: expected shape \(8, 4\) .* got \(8, 2\)"),
                        (small.reshape(4, 4), r"q.scales: expected shape \(8, 4\) .* got \(4, 4\)"),
                        (small, r"q.scales: expected shape \(8, 4\)")):
        with pytest.raises(ValueError, match=msg):
            fp4moe.dequantize(fp4moe.QTensor("nvfp4", q.data, scales, q.global_scale))
    with pytest.raises(ValueError, match=r"q.scales: nvfp4 needs block scales \[8\]\[4\], got None"):
        fp4moe.dequantize(fp4moe.QTensor("nvfp4", q.data, None, q.global_scale))
    exact = guarded(8 * 4)  # the right size, ending at the guard page: read up to its last byte
    exact[:] = q.scales.ravel()
    assert np.array_equal(fp4moe.dequantize(fp4moe.QTensor("nvfp4", q.data, exact.reshape(8, 4), q.global_scale)),
                          fp4moe.dequantize(q))


@pytest.mark.parametrize("fmt", FMTS)
def test_qtensor_dtypes_and_strides(rng, fmt):
    """Wrong dtypes are refused naming the field; strided arrays are read as the values
    they hold (through contiguous copies), not as their raw buffers."""
    q = fp4moe.quantize(rng.standard_normal((6, 64)).astype(np.float32), fmt)
    want = fp4moe.dequantize(q)
    wide = np.zeros((q.data.shape[0], 2 * q.data.shape[1]), q.data.dtype)
    wide[:, ::2] = q.data
    strided = fp4moe.QTensor(fmt, wide[:, ::2], q.scales, q.global_scale)
    assert not strided.data.flags.c_contiguous
    assert np.array_equal(fp4moe.dequantize(strided), want)
    if q.scales is not None:
        tall = np.zeros((2 * q.scales.shape[0], q.scales.shape[1]), np.uint8)
        tall[::2] = q.scales
        assert np.array_equal(fp4moe.dequantize(fp4moe.QTensor(fmt, q.data, tall[::2], q.global_scale)), want)
        assert np.array_equal(fp4moe.dequantize(fp4moe.QTensor(fmt, q.data.T.copy().T, q.scales.T.copy().T,
                                                               q.global_scale)), want)  # Fortran order
        for bad, msg in ((dict(data=q.data.astype(np.float64)), f"q.data: {fmt} expects uint8 .* got dtype float64"),
                         (dict(data=q.data.view(np.int8)), "q.data: .* got dtype int8"),
                         (dict(data=q.data.ravel()), r"q.data: expected a 2-D array .* got shape \(192,\)"),
                         (dict(data=q.data[:, :3]), r"q.data: 6 columns is not a multiple of the"),
                         (dict(scales=q.scales.astype(np.float32)), "q.scales: expected uint8 .* got dtype float32"),
                         (dict(global_scale="2"), "q.global_scale: expected a number, got str")):
            kw = dict(data=q.data, scales=q.scales, global_scale=q.global_scale, **{})
            kw.update(bad)
            with pytest.raises((TypeError, ValueError), match=msg):
                fp4moe.dequantize(fp4moe.QTensor(fmt, **kw))
    else:
        for bad, msg in ((dict(data=q.data.astype(np.float64)), "q.data: BF16 expects uint16 .* got dtype float64"),
                         (dict(data=q.data.view(np.int16)), "q.data: BF16 expects uint16 .* got dtype int16"),
                         (dict(scales=np.zeros((6, 4), np.uint8)), "q.scales: BF16 has no block scales")):
            kw = dict(data=q.data, scales=None, global_scale=1.0)
            kw.update(bad)
            with pytest.raises((TypeError, ValueError), match=msg):
                fp4moe.dequantize(fp4moe.QTensor(fmt, **kw))


def test_from_qtensors_checks_each(rng):
    """Layer weights from QTensors: each one checked and named before the stack."""
    qs = [fp4moe.quantize(rng.standard_normal((8, 32)).astype(np.float32), "nvfp4") for _ in range(3)]
    router = np.zeros((3, 32), np.float32)
    bad = fp4moe.QTensor("nvfp4", qs[1].data.astype(np.float64), qs[1].scales, 1.0)
    with pytest.raises(TypeError, match="w13\\[1\\].data: nvfp4 expects uint8"):
        fp4moe.MoEWeights.from_qtensors(router, [qs[0], bad, qs[2]], qs)
    bad = fp4moe.QTensor("nvfp4", qs[2].data, qs[2].scales[:, :1], 1.0)
    with pytest.raises(ValueError, match=r"w2\[2\].scales: expected shape \(8, 2\)"):
        fp4moe.MoEWeights.from_qtensors(router, qs, [qs[0], qs[1], bad])
    mx = fp4moe.quantize(rng.standard_normal((8, 32)).astype(np.float32), "mxfp4")
    with pytest.raises(ValueError, match=r"w13\[2\]: mxfp4 \(8, 16\) differs from w13\[0\]'s nvfp4"):
        fp4moe.MoEWeights.from_qtensors(router, [qs[0], qs[1], mx], qs)
    W = fp4moe.MoEWeights.from_qtensors(router, [fp4moe.QTensor("nvfp4", np.asfortranarray(q.data), q.scales,
                                                                q.global_scale) for q in qs], qs)
    assert W.w13_data.flags.c_contiguous and np.array_equal(W.w13_data[1], qs[1].data)
