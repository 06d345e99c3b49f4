#!/usr/bin/env python3
"""run_conformance.py - the planner against real CUTLASS, byte for byte.

1. gen_probes.py writes one probe .cu per architecture from grid.txt;
2. each is compiled with nvcc against the nvidia-cutlass headers (in parallel) and
   run on the host (sizeof only, no GPU); outputs are cached in the build folder
   keyed by CUTLASS version + probe source hash, so CI pays the compile once;
3. every row is asked of `fp4moe explain --json` and total / mainloop / epilogue /
   stages must be equal (sm_90, sm_100 and sm_120 rows).  Rows marked `#not-modelled:`
   would be families the model does not cover: listed, not asserted (none today).

usage: run_conformance.py FP4MOE_BINARY CACHE_DIR
Exit 0 all equal, 1 a mismatch, 2 missing nvcc / CUTLASS headers (message says how to get them).
"""
import concurrent.futures as cf
import hashlib
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def cutlass_include():
    try:
        import cutlass_library
    except ImportError:
        return None, None
    inc = os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include')
    ver = os.path.join(inc, 'cutlass', 'version.h')
    if not os.path.exists(ver):
        return None, None
    v = {}
    for line in open(ver):
        p = line.split()
        if len(p) >= 3 and p[0] == '#define' and p[1] in ('CUTLASS_MAJOR', 'CUTLASS_MINOR', 'CUTLASS_PATCH'):
            v[p[1]] = p[2]
    return inc, '%s.%s.%s' % (v.get('CUTLASS_MAJOR'), v.get('CUTLASS_MINOR'), v.get('CUTLASS_PATCH'))


def compile_run(nvcc, inc, src, arch, cache, ver):
    body = open(src, 'rb').read()
    key = hashlib.sha256(body + ver.encode() + arch.encode()).hexdigest()[:16]
    out = os.path.join(cache, '%s.%s.out' % (os.path.basename(src), key))
    if os.path.exists(out):
        return open(out).read(), True
    exe = os.path.join(cache, os.path.basename(src) + '.exe')
    r = subprocess.run([nvcc, '-std=c++17', '-arch=' + arch, '-I' + inc, '-o', exe, src],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError('nvcc failed on %s:\n%s' % (src, r.stderr[-4000:]))
    txt = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    with open(out, 'w') as f:
        f.write(txt)
    return txt, False


def main():
    fm, cache = sys.argv[1], sys.argv[2]
    nvcc = shutil.which('nvcc') or ('/usr/local/cuda/bin/nvcc' if os.path.exists('/usr/local/cuda/bin/nvcc') else None)
    inc, ver = cutlass_include()
    if not nvcc or not inc:
        print('conformance: needs nvcc and the CUTLASS headers of PyPI nvidia-cutlass '
              '(scripts/deps.sh installs nvidia-cutlass; nvcc comes with the CUDA toolkit): '
              'nvcc=%s cutlass=%s' % (nvcc, inc))
        return 2
    print('conformance: CUTLASS %s headers at %s' % (ver, inc))
    grid = os.path.join(HERE, 'grid.txt')
    rows, skipped = [], []
    for line in open(grid):
        if line.startswith('#not-modelled:'):
            skipped.append(line.split(':', 1)[1].split()[0])
            continue
        p = line.split('#', 1)[0].split()
        if p:
            rows.append(p)
    gen = os.path.join(cache, 'probes')
    os.makedirs(gen, exist_ok=True)
    srcs = subprocess.run([sys.executable, os.path.join(HERE, 'gen_probes.py'), grid, gen],
                          capture_output=True, text=True, check=True).stdout.split()
    archs = {'sm90': 'sm_90a', 'sm100': 'sm_100a', 'sm120': 'sm_120a'}
    truth = {}
    with cf.ThreadPoolExecutor(max_workers=int(os.environ.get('FM_CONFORMANCE_JOBS', '2'))) as ex:
        # the slowest translation unit first (sm100 instantiates the UMMA + TMEM machinery), so two
        # workers finish together
        order = sorted(srcs, key=lambda s: ('sm100' not in s, s))
        futs = {ex.submit(compile_run, nvcc, inc, s, archs[os.path.basename(s)[6:-3]], cache, ver): s for s in order}
        for fu in cf.as_completed(futs):
            txt, cached = fu.result()
            print('conformance: %s %s' % (os.path.basename(futs[fu]), 'cached' if cached else 'compiled'))
            for line in txt.splitlines():
                p = line.split()
                truth[p[0]] = {k: int(v) for k, v in (x.split('=') for x in p[1:])}
    bad = 0
    for r in rows:
        (cid, arch, a, b, c, d, tile, cluster, sched, epi, stages, swap) = r
        cmd = [fm, 'explain', '--json', '--cutlass', ver, '--arch', arch, '--a', a, '--b', b, '--c', c, '--d', d, '--tile', tile,
               '--cluster', cluster, '--schedule', sched, '--epilogue', epi, '--stages', stages]
        if swap == '1':
            cmd.append('--swap-ab')
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode not in (0, 5):
            print('MISMATCH %s: fp4moe explain failed: %s' % (cid, p.stderr.strip()))
            bad += 1
            continue
        got = json.loads(p.stdout)
        want = truth.get(cid)
        if want is None:
            print('MISMATCH %s: no probe output' % cid)
            bad += 1
            continue
        pairs = [('total', 'total_bytes'), ('mainloop', 'mainloop_bytes'), ('epilogue', 'epilogue_bytes'),
                 ('stages', 'stages')]
        diff = ['%s cutlass=%d fp4moe=%d' % (k, want[k], got[j]) for k, j in pairs if want[k] != got[j]]
        fits = got['total_bytes'] <= got['limit_bytes']
        if diff or fits != bool(got['fits']):
            print('MISMATCH %s: %s' % (cid, ', '.join(diff) or 'fits flag'))
            bad += 1
        else:
            print('ok %-24s total=%6d stages=%d %s' % (cid, want['total'], want['stages'], 'fits' if fits else 'REJECTED'))
    for s in skipped:
        print('not asserted (family not modelled): %s' % s)
    print('conformance: %d configurations, %d mismatches, %d not modelled' % (len(rows), bad, len(skipped)))
    return 1 if bad or len(rows) < 30 else 0


if __name__ == '__main__':
    sys.exit(main())
