#!/usr/bin/env python3
"""check_truth.py - the planner against the committed ground truth, no CUTLASS needed.

Each tests/conformance/truth-<version>.csv was measured by make_truth.py from one
CUTLASS tree (its header line names the version, commit and nvcc).  For every row:
  status ok       -> `fp4moe explain --json --cutlass V ...` must give the same total,
                     mainloop, epilogue and stages (and so the same fits verdict);
  status rejected -> explain must refuse the flags (exit 2) and its message must carry
                     the reason CUTLASS gave (the static_assert text).
A row with an explicit epilogue tile (the epi_tile column of truth-epitile-*.csv, from
grid_epitile.txt) is asked with --epilogue-tile; CSVs without the column are automatic-tile rows.
Rows the planner does not yet match are listed in known_misses.txt ("<version> <id>
<why>"): they are reported, and must still miss - a fixed row fails the check until its
line is removed, so the list cannot go stale.

usage: check_truth.py FP4MOE CSV            check one version (exit 0 all as expected, 1 not)
       check_truth.py FP4MOE CSV --mutate   change one byte of one measured number in a copy
                                            and require the check to fail (exit 0 when it does)
"""
import csv
import io
import json
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PAIRS = (('total', 'total_bytes'), ('mainloop', 'mainloop_bytes'), ('epilogue', 'epilogue_bytes'),
         ('stages', 'stages'))


def load(text):
    lines = text.splitlines()
    head = dict(kv.split('=', 1) for kv in lines[0].lstrip('# ').split())
    lines[1] = lines[1].replace(',stages,', ',stage_policy,', 1)  # the grid's column; the measured one follows
    rows = list(csv.DictReader(io.StringIO('\n'.join(lines[1:]))))
    return head, rows


def model_version(label):
    """'4.7.0' or '4.7.0+main-7107b05' -> '4.7.0' (what --cutlass takes)."""
    return label.split('+', 1)[0]


def known_misses(label):
    out = {}
    path = os.path.join(HERE, 'known_misses.txt')
    if os.path.exists(path):
        for line in open(path):
            p = line.split('#', 1)[0].split(None, 2)
            if len(p) >= 2 and p[0] == label:
                out[p[1]] = p[2].strip() if len(p) > 2 else ''
    return out


def explain(fm, ver, r):
    cmd = [fm, 'explain', '--json', '--cutlass', ver, '--arch', r['arch'], '--a', r['a'], '--b', r['b'], '--c',
           r['c'], '--d', r['d'], '--tile', r['tile'], '--cluster', r['cluster'], '--schedule', r['sched'],
           '--epilogue', r['epi'], '--stages', r['stage_policy']]
    if r['swap'] == '1':
        cmd.append('--swap-ab')
    if r['kind'] == 'plain':
        cmd += ['--kernel', 'plain']
    if r.get('epi_tile') not in (None, '', 'auto'):  # a 14th column (truth-epitile-*.csv); older CSVs have none
        cmd += ['--epilogue-tile', r['epi_tile']]
    return subprocess.run(cmd, capture_output=True, text=True)


def check_row(fm, ver, r):
    """None when the planner agrees with the measured row, else what differs."""
    p = explain(fm, ver, r)
    if r['status'] == 'rejected':
        if p.returncode != 2:
            return 'CUTLASS rejects it at compile time (%s); fp4moe exit %d' % (r['reason'], p.returncode)
        want = r['reason'].split(': ', 1)[-1]
        if want not in p.stderr:
            return 'rejected, but fp4moe says "%s", not CUTLASS\'s "%s"' % (p.stderr.strip(), want)
        return None
    if p.returncode not in (0, 5):
        return 'CUTLASS builds it; fp4moe refuses: %s' % p.stderr.strip()
    got = json.loads(p.stdout)
    diff = ['%s cutlass=%s fp4moe=%s' % (k, r[k], got[j]) for k, j in PAIRS if int(r[k]) != got[j]]
    if (got['total_bytes'] <= got['limit_bytes']) != bool(got['fits']):
        diff.append('fits flag')
    return ', '.join(diff) or None


def check(fm, text, quiet=False):
    head, rows = load(text)
    label = head['cutlass']
    ver = model_version(label)
    misses = known_misses(label)
    bad = exact = listed = 0
    for r in rows:
        d = check_row(fm, ver, r)
        if r['id'] in misses:
            if d is None:
                print('FIXED %s %s: remove it from known_misses.txt' % (label, r['id']))
                bad += 1
            else:
                listed += 1
                if not quiet:
                    print('known miss %s: %s' % (r['id'], d))
        elif d is not None:
            print('MISMATCH %s %s: %s' % (label, r['id'], d))
            bad += 1
        else:
            exact += 1
            if not quiet:
                print('ok %-26s %s' % (r['id'], r['status'] if r['status'] == 'rejected' else
                                       'total=%s stages=%s' % (r['total'], r['stages'])))
    print('check_truth: CUTLASS %s (commit %s, nvcc %s): %d rows, %d exact, %d known misses, %d failures' %
          (label, head.get('commit', '?')[:12], head.get('nvcc', '?'), len(rows), exact, listed, bad))
    return 1 if bad or not rows else 0


def mutate(text, seed):
    """One byte of one measured number changed (a digit of total / mainloop / epilogue / stages)."""
    head_line, body = text.split('\n', 1)
    rows = list(csv.reader(io.StringIO(body)))
    cols = list(rows[0])
    cols[cols.index('stages')] = 'stage_policy'  # the grid's column ("auto" or N); the measured one follows
    rng = random.Random(seed)
    ok = [i for i, r in enumerate(rows[1:], 1) if r[cols.index('status')] == 'ok']
    i = rng.choice(ok)
    c = cols.index(rng.choice(('total', 'mainloop', 'epilogue', 'stages')))
    v = rows[i][c]
    j = len(v) - 1
    rows[i][c] = v[:j] + str((int(v[j]) + 1) % 10)
    print('mutated row %s column %s: %s -> %s' % (rows[i][0], cols[c], v, rows[i][c]))
    out = io.StringIO()
    csv.writer(out, lineterminator='\n').writerows(rows)
    return head_line + '\n' + out.getvalue()


def main():
    fm, path = sys.argv[1], sys.argv[2]
    text = open(path).read()
    if '--mutate' in sys.argv[3:]:
        seed = int(os.environ.get('FM_TRUTH_SEED', '0')) or random.SystemRandom().randrange(1 << 30)
        print('check_truth --mutate: seed %d (FM_TRUTH_SEED to repeat)' % seed)
        rc = check(fm, mutate(text, seed), quiet=True)
        print('check_truth --mutate: the check %s' % ('failed, as it must' if rc else 'PASSED a changed byte'))
        return 0 if rc else 1
    return check(fm, text)


if __name__ == '__main__':
    sys.exit(main())
