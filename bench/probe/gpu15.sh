# Seventh session, the tail split (fm_cuda_gemm_tail_split: a PDL launch of a one-group mma
# tile at K >= 1,024 runs its last ~10 % of feature blocks as a second grid of 64-feature
# CTAs, started next to the first grid without a wait of its own). The full results run
# (its launch-modes table has +PDL and +PDL+split interleaved; its tile sweep is the refit's
# data: the kernels' registers changed), then test_cuda_pdl built with the trigger before
# the grid-dependency wait (-DFM_TEST_PDL_EARLY_TRIGGER, carried): its tail-split case must fail.
# Usage (repo root, GPU machine): bash bench/probe/gpu15.sh   carry [".debs", "build-probe-bin"]
. bench/probe/common.sh
FM_WERROR=ON MEMCHECK_S=0 bench/gpu-check.sh results > $OUT/results.txt 2>&1
grep -E "tests passed|Failed|^# " $OUT/results.txt | head -12
sed -n '/^| shape | rows\/expert | queued/,/^$/p' $OUT/results.txt | cut -c1-150
grep -E "ms|NMSE|nmse|rc=" $OUT/results.txt | tail -6
echo "== test_cuda_pdl with the trigger before the wait (must fail)"
build-probe-bin/test_cuda_pdl_early 2>&1 | grep -E "FAILED|PASSED|ERROR" | head -8
(cd $OUT && tar czf logs.tgz *.log *.txt *.json *.md 2>/dev/null && rm -f *.log results.txt table.md)
