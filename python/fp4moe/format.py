"""NVFP4 / MXFP4 / BF16 quantization on numpy arrays: the library's fm_quantize
and fm_dequantize (docs/formats.md), bit for bit. Nothing is computed here but
buffer sizes; the arrays are handed to C as they are (contiguous copies made
only when the input is not already C-contiguous). C reads a QTensor's arrays
by pointer and size alone, so their dtypes and shapes are checked first
(QTensor._c): a scales array smaller than the data needs would be read past its
end, a float64 or strided data array read as raw bytes."""

import ctypes as C
from dataclasses import dataclass

import numpy as np

from . import _lib
from ._args import as_float, as_int
from ._lib import check, lib

FORMATS = {"bf16": 0, "nvfp4": 1, "mxfp4": 2}
FORMAT_NAMES = {v: k for k, v in FORMATS.items()}
BLOCK = {"bf16": 0, "nvfp4": 16, "mxfp4": 32}
SCALE_DTYPES = ("uint8", "float8_e4m3fn", "float8_e8m0fnu")  # one byte per code; float8 views are the same bytes


def format_code(fmt, arg="fmt"):
    if isinstance(fmt, str) and fmt.lower() in FORMATS:
        return FORMATS[fmt.lower()]
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt in FORMAT_NAMES:
        return fmt
    raise ValueError(f"{arg}: unknown format {fmt!r}: expected one of 'nvfp4', 'mxfp4', 'bf16'")


@dataclass
class QTensor:
    """One quantized matrix [rows][cols], quantized along cols, as checkpoints store it.

    data:   FP4: uint8 [rows][cols/2], the low nibble holds the even column;
            BF16: uint16 [rows][cols] (raw bits).
    scales: uint8 [rows][cols/block] row-major (E4M3 codes for NVFP4, UE8M0 for
            MXFP4), None for BF16.
    global_scale: NVFP4 weight_scale_2 (multiply); 1.0 otherwise."""

    fmt: str
    data: np.ndarray
    scales: object
    global_scale: float

    def __post_init__(self):
        self.fmt = FORMAT_NAMES[format_code(self.fmt, "QTensor.fmt")]

    @property
    def shape(self):
        return (self.data.shape[0], self.data.shape[1] * (2 if self.fmt != "bf16" else 1))

    def _arrays(self, arg="q"):
        """(fmt, data, scales, global_scale) checked against each other, the arrays
        C-contiguous (copies of strided ones). The fields are mutable, so this runs
        whenever the tensor goes to C; arg names it in errors ("w13[3]")."""
        fmt = FORMAT_NAMES[format_code(self.fmt, f"{arg}.fmt")]
        d = np.asarray(self.data)
        if d.ndim != 2:
            raise ValueError(f"{arg}.data: expected a 2-D array [rows][cols{'' if fmt == 'bf16' else '/2'}], "
                             f"got shape {d.shape}")
        g = as_float(self.global_scale, f"{arg}.global_scale")
        if fmt == "bf16":
            if d.dtype.name not in ("uint16", "bfloat16"):
                raise TypeError(f"{arg}.data: BF16 expects uint16 bits or bfloat16, got dtype {d.dtype}")
            if self.scales is not None:
                raise ValueError(f"{arg}.scales: BF16 has no block scales, expected None")
            return fmt, np.ascontiguousarray(_native(d)), None, g
        if d.dtype.name != "uint8":
            raise TypeError(f"{arg}.data: {fmt} expects uint8 (two E2M1 codes a byte), got dtype {d.dtype}")
        rows, cols = d.shape[0], d.shape[1] * 2
        if cols % BLOCK[fmt]:
            raise ValueError(f"{arg}.data: {cols} columns is not a multiple of the {fmt} block ({BLOCK[fmt]})")
        if self.scales is None:
            raise ValueError(f"{arg}.scales: {fmt} needs block scales [{rows}][{cols // BLOCK[fmt]}], got None")
        s = np.asarray(self.scales)
        if s.dtype.name not in SCALE_DTYPES:
            raise TypeError(f"{arg}.scales: expected uint8 (or float8_e4m3fn / float8_e8m0fnu) codes, "
                            f"got dtype {s.dtype}")
        if s.shape != (rows, cols // BLOCK[fmt]):
            raise ValueError(f"{arg}.scales: expected shape {(rows, cols // BLOCK[fmt])} for data {d.shape} "
                             f"({fmt}, one scale per {BLOCK[fmt]} columns), got {s.shape}")
        return fmt, np.ascontiguousarray(d), np.ascontiguousarray(s), g

    def _c(self, arg="q"):
        """(an fm_qtensor viewing the checked arrays, those arrays: keep them alive across the call)."""
        fmt, d, s, g = self._arrays(arg)
        rows, cols = d.shape[0], d.shape[1] * (1 if fmt == "bf16" else 2)
        ct = _lib.QTensor(FORMATS[fmt], rows, cols, d.ctypes.data, None if s is None else s.ctypes.data, g)
        return ct, (d, s)


def _native(a):
    """a in this host's byte order (a native copy of a non-native one): C reads the bytes, and
    dtype.name ("uint16", "float32") does not tell a big-endian array from a native one."""
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def _as_f32_2d(x, arg):
    a = np.asarray(x)
    if a.ndim != 2:
        raise ValueError(f"{arg}: expected a 2-D array [rows][cols], got shape {a.shape}")
    if not (np.issubdtype(a.dtype, np.floating) or a.dtype.name == "bfloat16"):
        raise TypeError(f"{arg}: expected a floating-point array, got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.float32)


def quantize(x, fmt="nvfp4", global_scale=None):
    """Quantize x [rows][cols] (float32; other float dtypes are converted) to fmt.

    NVFP4: global_scale None derives it from the tensor's amax (ModelOpt's
    amax / (6 * 448)); give it to quantize against a fixed one. Raises
    fp4moe.Error (FM_ERR_BAD_SHAPE for cols not a multiple of the block,
    FM_ERR_NONFINITE for NaN/Inf, ...) with the library's message."""
    name = FORMAT_NAMES[format_code(fmt)]
    src = _as_f32_2d(x, "x")
    rows, cols = src.shape
    db, sb = C.c_size_t(), C.c_size_t()
    check(lib.fm_qtensor_bytes(FORMATS[name], rows, cols, C.byref(db), C.byref(sb)), "quantize")
    if name == "bf16":
        data = np.empty((rows, cols), np.uint16)
        scales = None
    else:
        data = np.empty((rows, cols // 2), np.uint8)
        scales = np.empty((rows, cols // BLOCK[name]), np.uint8)
    assert data.nbytes == db.value and (scales is None or scales.nbytes == sb.value)
    q = QTensor(name, data, scales, 1.0)
    ct, (d, s) = q._c()
    assert d is data and s is scales  # contiguous already, not copied: the library writes into q's arrays
    gs = None
    if global_scale is not None:
        if name != "nvfp4":
            raise ValueError(f"global_scale: only NVFP4 has a global scale, not {name}")
        gs = C.byref(C.c_float(as_float(global_scale, "global_scale")))
    check(lib.fm_quantize(src.ctypes.data, gs, C.byref(ct)), "quantize")
    q.global_scale = ct.global_scale
    return q


def _u8_2d(a, arg, shape):
    a = np.asarray(a)
    if a.dtype.name not in SCALE_DTYPES:
        raise TypeError(f"{arg}: expected uint8 (or float8_e4m3fn / float8_e8m0fnu) codes, got dtype {a.dtype}")
    if a.shape != shape:
        raise ValueError(f"{arg}: expected shape {shape}, got {a.shape}")
    return np.ascontiguousarray(a).view(np.uint8)


def qtensor(fmt, data, scales=None, global_scale=1.0, cols=None):
    """Wrap existing arrays as a QTensor, checking dtypes and shapes: data uint8
    [rows][cols/2] (FP4) or uint16/bfloat16 [rows][cols] (BF16); scales uint8 or
    float8 codes [rows][cols/block]. cols, when given, must be what data holds (a
    check of the caller's shape, never a reinterpretation of the bytes)."""
    name = FORMAT_NAMES[format_code(fmt)]
    d = np.asarray(data)
    if d.ndim != 2:
        raise ValueError(f"data: expected a 2-D array, got shape {d.shape}")
    if cols is not None:
        cols = as_int(cols, "cols", 0, 2**63 - 1)
        have = d.shape[1] * (1 if name == "bf16" else 2)
        if cols != have:
            raise ValueError(f"cols: {cols}, but data {d.shape} holds {have} {name} columns")
    if name == "bf16":
        if d.dtype.itemsize != 2 or d.dtype.name not in ("uint16", "bfloat16"):
            raise TypeError(f"data: BF16 expects uint16 bits or bfloat16, got dtype {d.dtype}")
        return QTensor(name, np.ascontiguousarray(_native(d)).view(np.uint16), None, 1.0)
    d = _u8_2d(d, "data", d.shape)
    rows, kc = d.shape[0], d.shape[1] * 2
    if kc % BLOCK[name]:
        raise ValueError(f"data: {kc} columns is not a multiple of the {name} block ({BLOCK[name]})")
    s = _u8_2d(scales, "scales", (rows, kc // BLOCK[name]))
    return QTensor(name, d, s, as_float(global_scale, "global_scale"))


def dequantize(q):
    """Float32 [rows][cols] = e2m1 * block_scale * global (the library's fm_dequantize).
    q's arrays are checked (dtype, shape, scales against data) first; strided ones are
    read through contiguous copies."""
    if not isinstance(q, QTensor):
        raise TypeError(f"q: expected fp4moe.QTensor, got {type(q).__name__}")
    ct, keep = q._c("q")
    out = np.empty((ct.rows, ct.cols), np.float32)
    check(lib.fm_dequantize(C.byref(ct), out.ctypes.data), "dequantize")
    del keep
    return out
