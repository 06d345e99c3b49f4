#!/usr/bin/env python3
"""kernel_bounds.py OUT.csv DIR - every compiled kernel's launch bounds, read from the
machine code the build made, into one CSV (build/kernel_bounds.csv):
    target,kernel,max_threads,max_regs,template_args
For each CUDA object under DIR (OBJ.cu.o with the ptxas report OBJ.cu.o.ptxas next to
it, scripts/nvcc-resources.sh) the embedded fat binary (.nv_fatbin) is walked; each
cubin (an ELF) has a .nv.info.<kernel> section per kernel, whose attributes hold what
ptxas made of __launch_bounds__: the maximum threads per block (EIATTR_MAX_THREADS)
and the register cap the minimum blocks per SM imply (EIATTR_MAXREG_COUNT; 0 when the
kernel has none). The target is ptxas's own name for it ('sm_90a'), from the report.
kernel is demangled with c++filt, ',' written ';', as scripts/kernel_resources.sh does;
template_args are the kernel's first template argument list ('4;1;1;256;4;false').
tests/test_kernel_resources.c checks every GEMM kernel's row against the catalogue
(src/kernels/fm_tiles.def) and fm_kernel_threads: a kernel compiled with other bounds
than the launcher and the occupancy model count fails there, on the CPU.
No cuobjdump needed (the build machine's toolkit may not have it). Compressed cubins
(nvcc -Xfatbin=-compress-all) are not read: the script stops and says so. Rows sorted.
"""
import os
import re
import struct
import subprocess
import sys

EIATTR_MAX_THREADS = 0x05
EIATTR_MAXREG_COUNT = 0x1B
FATBIN_MAGIC = 0xBA55ED50
FATBIN_ELF = 2
FATBIN_COMPRESSED = 0x2000  # entry flag: payload compressed


def elf_sections(data):
    """{name: (offset, size)} of a 64-bit little-endian ELF image."""
    if data[:4] != b'\x7fELF' or data[4] != 2:
        raise ValueError('not a 64-bit ELF')
    shoff, = struct.unpack_from('<Q', data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', data, 0x3A)
    heads = [struct.unpack_from('<IIQQQQ', data, shoff + i * shentsize) for i in range(shnum)]
    stroff = heads[shstrndx][4]
    out = {}
    for name, _typ, _flags, _addr, off, size in heads:
        end = data.index(b'\0', stroff + name)
        out[data[stroff + name:end].decode()] = (off, size)
    return out


def nv_info(data, off, size):
    """Attributes of one .nv.info.<kernel> section: {attr: value} (value: int, bytes)."""
    attrs, p, end = {}, off, off + size
    while p + 2 <= end:
        fmt, attr = data[p], data[p + 1]
        if fmt == 0x00:  # the section's alignment padding
            break
        if fmt == 0x04:  # EIFMT_SVAL: u16 size, then the value
            n, = struct.unpack_from('<H', data, p + 2)
            attrs[attr] = data[p + 4:p + 4 + n]
            p += 4 + n
        elif fmt == 0x03:  # EIFMT_HVAL: u16 value
            attrs[attr], = struct.unpack_from('<H', data, p + 2)
            p += 4
        elif fmt == 0x02:  # EIFMT_BVAL: u8 value, padded
            attrs[attr] = data[p + 2]
            p += 4
        elif fmt == 0x01:  # EIFMT_NVAL: no value, padded to 4 bytes as every entry
            attrs[attr] = None
            p += 4
        else:
            raise ValueError(f'unknown .nv.info format {fmt:#x}')
    return attrs


def cubins(obj_path):
    """(sm number, cubin bytes) of every ELF entry of the object's fat binary."""
    with open(obj_path, 'rb') as f:
        host = f.read()
    secs = elf_sections(host)
    if '.nv_fatbin' not in secs:
        return []
    off, size = secs['.nv_fatbin']
    fb = host[off:off + size]
    out, p = [], 0
    while p + 16 <= len(fb):
        magic, _ver, hsize, fsize = struct.unpack_from('<IHHQ', fb, p)
        if magic != FATBIN_MAGIC:
            break
        q, end = p + hsize, p + hsize + fsize
        while q < end:
            kind, _v, ehsize, psize = struct.unpack_from('<HHIQ', fb, q)
            flags, = struct.unpack_from('<Q', fb, q + 0x28) if ehsize >= 0x30 else (0,)
            sm, = struct.unpack_from('<I', fb, q + 0x1C)
            if kind == FATBIN_ELF:
                if flags & FATBIN_COMPRESSED:
                    sys.exit(f'{obj_path}: compressed cubin, not read (build without -compress-all)')
                out.append((sm, fb[q + ehsize:q + ehsize + psize]))
            q += ehsize + psize
        p = end
    return out


def ptxas_targets(report):
    """{(mangled kernel, sm number): ptxas target name} from an OBJ.ptxas report."""
    out = {}
    with open(report) as f:
        for m in re.finditer(r"Compiling entry function '([^']+)' for '((?:sm|compute)_(\d+)[a-z]?)'", f.read()):
            out[(m.group(1), int(m.group(3)))] = m.group(2)
    return out


def template_args(demangled):
    i = demangled.find('<')
    if i < 0:
        return ''
    depth, j = 0, i
    for j in range(i, len(demangled)):
        depth += {'<': 1, '>': -1}.get(demangled[j], 0)
        if depth == 0:
            break
    return re.sub(r'\s*;\s*', ';', demangled[i + 1:j])


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    out_path, root = sys.argv[1], sys.argv[2]
    rows = []
    for d, _, files in os.walk(root):
        for fn in sorted(files):
            if not fn.endswith('.cu.o') or not os.path.exists(os.path.join(d, fn + '.ptxas')):
                continue
            obj = os.path.join(d, fn)
            targets = ptxas_targets(obj + '.ptxas')
            for sm, cubin in cubins(obj):
                for name, (off, size) in elf_sections(cubin).items():
                    if not name.startswith('.nv.info.'):
                        continue
                    kernel = name[len('.nv.info.'):]
                    attrs = nv_info(cubin, off, size)
                    mt = attrs.get(EIATTR_MAX_THREADS)
                    threads = struct.unpack_from('<III', mt) if isinstance(mt, bytes) and len(mt) >= 12 else (0, 1, 1)
                    regs = attrs.get(EIATTR_MAXREG_COUNT) or 0
                    target = targets.get((kernel, sm), f'sm_{sm}')
                    rows.append((target, kernel, threads[0] * threads[1] * threads[2], regs))
    names = subprocess.run(['c++filt'], input='\n'.join(r[1] for r in rows), capture_output=True, text=True,
                           check=True).stdout.splitlines() if rows else []
    lines = sorted({f'{t},{n.replace(",", ";")},{th},{rg},{template_args(n.replace(",", ";"))}'
                    for (t, _, th, rg), n in zip(rows, names)})
    tmp = out_path + '.tmp'
    with open(tmp, 'w') as f:
        f.write('target,kernel,max_threads,max_regs,template_args\n')
        f.writelines(line + '\n' for line in lines)
    os.replace(tmp, out_path)


if __name__ == '__main__':
    main()
