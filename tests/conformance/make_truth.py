#!/usr/bin/env python3
"""make_truth.py - measure the ground truth: what one CUTLASS source tree really puts in
shared memory for every grid row, or the compile-time rejection that stops it.

The planner's bytes are checked against these CSVs in CI (check_truth.py, no CUTLASS
needed), so the CSVs are measured facts: nothing in them is computed by the planner.
For each row of the grid files (gen_probes.py columns) the probe prints
sizeof(GemmKernel::SharedStorage), the mainloop / epilogue collectives' SharedStorage,
the stage count the builder chose, and where the kernel has them the kernel's
TensorStorage / PipelineStorage / tensor maps.  A row CUTLASS refuses at compile time
(static_assert, no builder specialization) is compiled alone to confirm it and recorded
as `rejected` with the first error message.

Speed (the machine is small and shared): host-only probes (no kernel is instantiated),
many rows per translation unit, at most --jobs parallel nvcc under `nice -n 19`, every
row's result cached under --cache keyed by its probe source, the CUTLASS headers it
includes (content hash of `nvcc -M`'s list) and the nvcc version, so a rerun - or
another tag with the same relevant headers - compiles nothing.  A failing chunk names
its failing rows through the instantiation context's probe line numbers; the others are
recompiled together, the failing ones alone.

usage: make_truth.py --include DIR --commit SHA [--label V] --out CSV [--cache DIR]
                     [--jobs 2] [--chunk 16] [--arch sm90,...] GRID...
"""
import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_probes  # noqa: E402

NVARCH = {'sm90': 'sm_90a', 'sm100': 'sm_100a', 'sm120': 'sm_120a'}
FIELDS = ('total', 'mainloop', 'epilogue', 'stages', 'ml_tensors', 'epi_tensors', 'k_tensors', 'k_pipelines',
          'k_tensormaps')


def nvcc_path():
    for p in (os.environ.get('NVCC'), '/usr/local/cuda/bin/nvcc'):
        if p and os.path.exists(p):
            return p
    raise SystemExit('make_truth: no nvcc (set NVCC or install the CUDA toolkit)')


def cutlass_version(inc):
    v = {}
    for line in open(os.path.join(inc, 'cutlass', 'version.h')):
        p = line.split()
        if len(p) >= 3 and p[0] == '#define' and p[1] in ('CUTLASS_MAJOR', 'CUTLASS_MINOR', 'CUTLASS_PATCH'):
            v[p[1]] = p[2]
    return '%s.%s.%s' % (v['CUTLASS_MAJOR'], v['CUTLASS_MINOR'], v['CUTLASS_PATCH'])


def nvcc_version(nvcc):
    out = subprocess.run([nvcc, '--version'], capture_output=True, text=True).stdout
    m = re.search(r'V(\d+\.\d+\.\d+)', out)
    return m.group(1) if m else 'unknown'


def nvcc_cmd(nvcc, inc, arch, src, exe):
    return ['nice', '-n', '19', nvcc, '-std=c++17', '-arch=' + NVARCH[arch], '-O0', '-I' + inc, '-o', exe, src]


def headers_hash(nvcc, inc, arch, workdir):
    """Content hash of the CUTLASS/CuTe headers a probe of `arch` includes."""
    src, _ = gen_probes.translation_unit([])
    path = os.path.join(workdir, 'deps_%s.cu' % arch)
    open(path, 'w').write(src)
    r = subprocess.run(['nice', '-n', '19', nvcc, '-std=c++17', '-arch=' + NVARCH[arch], '-I' + inc, '-M', path],
                       capture_output=True, text=True, check=True)
    files = sorted({f for f in r.stdout.replace('\\\n', ' ').split()[1:] if f.startswith(os.path.abspath(inc))})
    h = hashlib.sha256()
    for f in files:
        h.update(os.path.relpath(f, inc).encode())
        h.update(open(f, 'rb').read())
    return h.hexdigest()[:16], len(files)


def first_error(stderr):
    """The first compile error, without paths: the static_assert message where there is one."""
    for line in stderr.splitlines():
        if 'error' not in line:
            continue
        m = re.search(r'static assertion failed with "(.*)"', line)
        if m:
            return 'static_assert: ' + m.group(1)
        m = re.search(r'error: (.*)', line)
        if m:
            msg = re.sub(r'\s+', ' ', m.group(1)).strip()
            return msg[:300]
    return 'nvcc failed: ' + ' '.join(stderr.split())[-200:]


def failing_rows(stderr, spans, srcname):
    """Rows whose probe lines appear in an error's message or instantiation context."""
    lines = set()
    for m in re.finditer(r'at line (\d+) of \S*' + re.escape(srcname), stderr):
        lines.add(int(m.group(1)))
    for m in re.finditer(re.escape(srcname) + r'(?:\((\d+)\)|:(\d+):)', stderr):
        lines.add(int(m.group(1) or m.group(2)))
    bad = set()
    for rid, sp in spans.items():
        if any(sp[0] <= ln < sp[1] or ln == sp[2] for ln in lines):
            bad.add(rid)
    return bad


class Runner:
    def __init__(self, args):
        self.args = args
        self.nvcc = nvcc_path()
        self.inc = os.path.abspath(args.include)
        self.work = tempfile.mkdtemp(prefix='fm-truth-')
        self.compiles = 0
        self.keys = {}

    def compile(self, arch, rows, tag):
        src, spans = gen_probes.translation_unit(rows)
        name = 'probe_%s_%s.cu' % (arch, tag)
        path = os.path.join(self.work, name)
        open(path, 'w').write(src)
        exe = path[:-3] + '.exe'
        r = subprocess.run(nvcc_cmd(self.nvcc, self.inc, arch, path, exe), capture_output=True, text=True)
        self.compiles += 1
        if r.returncode:
            with open(path[:-3] + '.err', 'w') as f:  # kept for the record (the work folder)
                f.write(r.stderr)
            return None, r.stderr, spans, name
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
        res = {}
        for line in out.splitlines():
            p = line.split()
            res[p[0]] = {k: int(v) for k, v in (x.split('=') for x in p[1:])}
        return res, '', spans, name

    def store(self, res):
        for rid, v in res.items():
            if rid in self.keys:
                json.dump(v, open(os.path.join(self.args.cache, self.keys[rid] + '.json'), 'w'))

    def solve(self, arch, rows, depth=0):
        """{row id: result} for rows of one arch; a result is a dict of FIELDS or {'rejected': msg}."""
        tag = hashlib.sha1(''.join(r[0] for r in rows).encode()).hexdigest()[:10]
        res, err, spans, name = self.compile(arch, rows, tag)
        if res is not None:
            print('  %s: %d rows compiled' % (arch, len(rows)), flush=True)
            self.store(res)
            return res
        if len(rows) == 1:
            msg = first_error(err)
            with open(os.path.join(self.args.cache, 'rejected-%s-%s.err' % (arch, rows[0][0])), 'w') as f:
                f.write(err)
            print('  %s: %s rejected: %s' % (arch, rows[0][0], msg), flush=True)
            self.store({rows[0][0]: {'rejected': msg}})
            return {rows[0][0]: {'rejected': msg}}
        bad = failing_rows(err, spans, name)
        print('  %s: %d rows failed to compile together; failing: %s' % (arch, len(rows), ' '.join(sorted(bad)) or '?'),
              flush=True)
        if not bad or len(bad) == len(rows):  # cannot tell: bisect
            h = len(rows) // 2
            out = self.solve(arch, rows[:h], depth + 1)
            out.update(self.solve(arch, rows[h:], depth + 1))
            return out
        out = {}
        good = [r for r in rows if r[0] not in bad]
        out.update(self.solve(arch, good, depth + 1))
        for r in rows:
            if r[0] in bad:
                out.update(self.solve(arch, [r], depth + 1))
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--include', required=True, help='CUTLASS include dir (holds cutlass/ and cute/)')
    ap.add_argument('--commit', required=True, help='the tree\'s git commit (recorded in the header)')
    ap.add_argument('--label', help='version label for the header (default: cutlass/version.h)')
    ap.add_argument('--out', required=True)
    ap.add_argument('--cache', default=os.path.expanduser('~/.cache/fp4moe-truth'))
    ap.add_argument('--jobs', type=int, default=2)
    ap.add_argument('--chunk', type=int, default=64)
    ap.add_argument('--arch', default='sm90,sm100,sm120')
    ap.add_argument('--cached-only', action='store_true', help='write the rows already measured, compile nothing')
    ap.add_argument('--only', help='comma-separated row ids (default: all)')
    ap.add_argument('grids', nargs='+')
    args = ap.parse_args()
    run = Runner(args)
    ver = cutlass_version(run.inc)
    nvv = nvcc_version(run.nvcc)
    rows = []
    for g in args.grids:
        rows += gen_probes.parse_grid(g)
    ids = [r[0] for r in rows]
    if len(set(ids)) != len(ids):
        raise SystemExit('make_truth: duplicate row ids')
    archs = [a for a in args.arch.split(',') if a]
    rows = [r for r in rows if r[1] in archs and (not args.only or r[0] in args.only.split(','))]
    os.makedirs(args.cache, exist_ok=True)
    results, todo = {}, {}
    hh = {}
    for arch in archs:
        hf = os.path.join(args.cache, 'headers-%s-%s.txt' % (hashlib.sha1(run.inc.encode()).hexdigest()[:12], arch))
        if os.path.exists(hf):  # this tree's header hash, computed before (nvcc -M takes a while)
            hh[arch], n = open(hf).read().split()
            n = int(n)
        else:
            hh[arch], n = headers_hash(run.nvcc, run.inc, arch, run.work)
            open(hf, 'w').write('%s %d' % (hh[arch], n))
        print('make_truth: CUTLASS %s %s: %d headers, hash %s' % (ver, arch, n, hh[arch]), flush=True)
    keys = run.keys = {}
    for r in rows:
        key = hashlib.sha256((gen_probes.HEAD + gen_probes.probe(r) + hh[r[1]] + nvv).encode()).hexdigest()[:20]
        keys[r[0]] = key
        f = os.path.join(args.cache, key + '.json')
        if os.path.exists(f):
            results[r[0]] = json.load(open(f))
        else:
            todo.setdefault(r[1], []).append(r)
    print('make_truth: %d rows, %d cached, %d to compile' % (len(rows), len(results), sum(map(len, todo.values()))),
          flush=True)
    if args.cached_only:
        rows = [r for r in rows if r[0] in results]
        todo = {}
    chunks = []
    for arch, rs in todo.items():
        for i in range(0, len(rs), args.chunk):
            chunks.append((arch, rs[i:i + args.chunk]))
    chunks.sort(key=lambda c: c[0] != 'sm100')  # the slowest first
    with cf.ThreadPoolExecutor(max_workers=args.jobs) as ex:
        for fu in cf.as_completed([ex.submit(run.solve, a, rs) for a, rs in chunks]):
            for rid, v in fu.result().items():
                results[rid] = v
                json.dump(v, open(os.path.join(args.cache, keys[rid] + '.json'), 'w'))
    with open(args.out, 'w') as f:
        f.write('# cutlass=%s commit=%s nvcc=%s generator=tests/conformance/make_truth.py\n' %
                (args.label or ver, args.commit, nvv))
        f.write(','.join(gen_probes.COLS + ('status',) + FIELDS + ('reason',)) + '\n')
        for r in rows:
            v = results.get(r[0])
            if v is None:
                raise SystemExit('make_truth: no result for %s' % r[0])
            if 'rejected' in v:
                f.write(','.join(r) + ',rejected' + ',' * len(FIELDS) + ',"%s"\n' % v['rejected'].replace('"', "'"))
            else:
                f.write(','.join(r) + ',ok,' + ','.join(str(v[k]) for k in FIELDS) + ',\n')
    print('make_truth: wrote %s (%d rows, %d compiles)' % (args.out, len(rows), run.compiles))


if __name__ == '__main__':
    main()
