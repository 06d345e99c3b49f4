"""NVFP4 checkpoints read from the formats' definitions, numpy only (used by make_fixtures.py
to dequantize what ModelOpt and compressed-tensors wrote, independently of both tools):
a safetensors reader, E2M1 / E4M3 / BF16 decoding, and one NVFP4 linear's real weight."""
import json
import os

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def read_safetensors(path):
    """{name: (dtype string, shape, raw bytes)}: the container as written, nothing converted."""
    import numpy as np
    with open(path, "rb") as f:
        n = int(np.frombuffer(f.read(8), "<u8")[0])
        head = json.loads(f.read(n))
        data = f.read()
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in head.items() if k != "__metadata__"}


def read_checkpoint(folder):
    out = {}
    for fn in sorted(os.listdir(folder)):
        if fn.endswith(".safetensors"):
            out.update(read_safetensors(os.path.join(folder, fn)))
    return out


def to_f64(t):
    """A float tensor of the container (F32, BF16, F16, F8_E4M3) as float64."""
    import numpy as np
    dt, shape, raw = t
    if dt == "F32":
        a = np.frombuffer(raw, "<f4").astype(np.float64)
    elif dt == "F16":
        a = np.frombuffer(raw, "<f2").astype(np.float64)
    elif dt == "BF16":
        a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    elif dt in ("F8_E4M3", "U8"):
        a = e4m3_decode(np.frombuffer(raw, np.uint8))
    else:
        raise ValueError(f"dtype {dt}")
    return a.reshape(shape)


def e4m3_decode(c):
    """OCP FP8 E4M3 (fn): bias 7, subnormals, 0x7f/0xff NaN, no infinities."""
    import numpy as np
    c = c.astype(np.int64)
    s = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = c & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7))
    v = np.where((c & 0x7F) == 0x7F, np.nan, v)
    return s * v


def e2m1_unpack(raw, shape):
    """U8 [N][K/2], two E2M1 codes per byte, the low nibble the even element -> float64 [N][K]."""
    import numpy as np
    b = np.frombuffer(raw, np.uint8).reshape(shape)
    nib = np.stack([b & 0xF, b >> 4], axis=-1).reshape(shape[0], shape[1] * 2)
    mag = np.array(E2M1)[nib & 7]
    return np.where(nib & 8, -mag, mag)


def dequant_nvfp4(ck, prefix, layout):
    """The real value of one NVFP4 linear's weight [N][K], float64: E2M1 x E4M3 block scale (one per
    16 along K) x global. ModelOpt stores the global as weight_scale_2 (multiply); compressed-tensors
    as weight_global_scale, its reciprocal (divide)."""
    import numpy as np
    if layout == "modelopt":
        q, sf, g = ck[prefix + ".weight"], ck[prefix + ".weight_scale"], float(to_f64(ck[prefix + ".weight_scale_2"]).reshape(-1)[0])
    else:
        q, sf = ck[prefix + ".weight_packed"], ck[prefix + ".weight_scale"]
        g = 1.0 / float(to_f64(ck[prefix + ".weight_global_scale"]).reshape(-1)[0])
    vals = e2m1_unpack(q[2], q[1])
    scales = to_f64(sf)
    assert scales.shape == (vals.shape[0], vals.shape[1] // 16), (prefix, scales.shape, vals.shape)
    assert np.all(np.isfinite(scales)), prefix
    return vals * np.repeat(scales, 16, axis=1) * g


def bf16_bits(a):
    """float32 -> BF16 bits (round to nearest even), as fp4moe and torch round."""
    import numpy as np
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    import numpy as np
    return (bits.astype(np.uint32) << 16).view(np.float32)
