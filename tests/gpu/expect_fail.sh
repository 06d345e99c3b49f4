#!/usr/bin/env bash
# expect_fail.sh TEST [ARGS...] - run a cmocka test built against a mutant library
# (tests/mutants.cmake) and invert its verdict: exit 0 when it failed an assertion
# (the test sees the mutation), 1 when it passed (the test cannot see it) or crashed
# without a cmocka verdict, 77 when it skipped (no device).
out=$("$@" 2>&1); rc=$?
printf '%s\n' "$out" | tail -40
[ $rc -eq 77 ] && exit 77
if [ $rc -eq 0 ]; then echo "expect_fail: $1 PASSED against the mutant: the test cannot fail" >&2; exit 1; fi
if printf '%s\n' "$out" | grep -q '\[  FAILED  \]'; then echo "expect_fail: $1 failed as it must (rc=$rc)"; exit 0; fi
echo "expect_fail: $1 exited $rc without a cmocka FAILED line (a crash?)" >&2
exit 1
