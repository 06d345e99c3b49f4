#!/usr/bin/env python3
"""check_runtime_deps.py RUNTIME_LIST AUDIT_LIST - the runtime does not reach the audit.

libfp4moe is two object sets (CMakeLists.txt): the runtime (the layer, the backends,
what fp4moe's kernels are) and the tools an engine does not need (fp4moe_audit: the
planner's CUTLASS check and candidates, the CUTLASS models and tactic tables, the
simulator). The seam holds only if no runtime object references a symbol that only
an audit object defines: then an engine linking the runtime pulls none of the audit
in, and the audit can change without touching what runs. Each LIST is a file naming
one object per line (tests/seams.cmake writes them from the targets); nm(1) on each
(C and CUDA host objects alike); a reference is a 'U' symbol.
Exit 0 when clean, 1 with each offending (object, symbol) listed, 77 without nm.
"""
import os
import shutil
import subprocess
import sys


def objects(listing):
    with open(listing) as f:
        return sorted(line.strip() for line in f if line.strip())


def symbols(obj):
    """(defined, undefined) global symbol sets of one object."""
    r = subprocess.run(['nm', obj], capture_output=True, text=True, check=True)
    defined, undefined = set(), set()
    for line in r.stdout.splitlines():
        p = line.split()
        if len(p) == 3 and p[1] in 'TDBRCVW':
            defined.add(p[2])
        elif len(p) == 2 and p[0] == 'U':
            undefined.add(p[1])
    return defined, undefined


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    if not shutil.which('nm'):
        print('nm not found: skipped')
        sys.exit(77)
    runtime, audit = objects(sys.argv[1]), objects(sys.argv[2])
    missing = [o for o in runtime + audit if not os.path.exists(o)]
    if not runtime or not audit or missing:
        sys.exit(f'objects missing ({missing[:3] or "an empty list"}): build libfp4moe first')
    audit_defs = set()
    for o in audit:
        audit_defs |= symbols(o)[0]
    rt = {o: symbols(o) for o in runtime}
    runtime_defs = set().union(*(d for d, _ in rt.values()))
    only_audit = audit_defs - runtime_defs
    bad = [(o, s) for o, (_, und) in rt.items() for s in sorted(und & only_audit)]
    for o, s in bad:
        print(f'FAIL {os.path.basename(o)} references {s}, defined only in the audit objects')
    print(f'{len(runtime)} runtime objects, {len(audit)} audit objects ({len(only_audit)} audit-only symbols): '
          f'{len(bad)} references from the runtime')
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
