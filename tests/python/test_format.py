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
