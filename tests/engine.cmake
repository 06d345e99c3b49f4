# The engines' tactic lists (fp4moe plan --engine) and fp4moe advise against golden
# outputs: the seed (TensorRT-LLM's SM120 NVFP4 list on an RTX PRO 6000: the 128x256x128
# and 256x128x128 FINALIZE tiles die in initialize()), the unknown-name errors, and the
# advise report.  Regenerate a golden file deliberately: cmake -DUPDATE=1 ... (see run_golden.cmake).
set(FM_GOLDEN ${CMAKE_CURRENT_SOURCE_DIR}/golden)
function(fm_golden name)
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} -DFM=$<TARGET_FILE:fp4moe_cli> -DGOLD=${FM_GOLDEN}/${name}.txt
                   "-DARGS=${ARGN}" -P ${FM_GOLDEN}/run_golden.cmake)
  set_tests_properties(${name} PROPERTIES LABELS "cpu")
endfunction()
fm_golden(golden_plan_engine_trtllm_sm120 plan --engine trtllm --gpu rtx-pro-6000 --format nvfp4)
fm_golden(golden_plan_engine_trtllm_sm120_json plan --engine trtllm --gpu rtx-pro-6000 --format nvfp4 --json)
fm_golden(golden_plan_engine_unknown_engine plan --engine foo --gpu rtx-pro-6000)
fm_golden(golden_plan_engine_unknown_gpu plan --engine trtllm --gpu no-such-gpu)
fm_golden(golden_plan_engine_unknown_version plan --engine trtllm --engine-version 0000000 --gpu rtx-pro-6000)
# FlashInfer: the newest row set by default (fb28d724, CUTLASS 4.5: eight SM120 tiles, FC1 and FINALIZE FC2,
# each plain and swap-AB), an older one by commit prefix (d027074a, CUTLASS 4.2.1), SM100 FINALIZE rows,
# and an unknown version listing both
fm_golden(golden_plan_engine_flashinfer_sm120 plan --engine flashinfer --gpu rtx-pro-6000 --format nvfp4)
fm_golden(golden_plan_engine_flashinfer_sm120_d027074 plan --engine flashinfer --engine-version d027074a --gpu rtx-pro-6000)
fm_golden(golden_plan_engine_flashinfer_b200_json plan --engine flashinfer --gpu b200 --format nvfp4 --json)
# SGLang's and vLLM's SM100 kernel: 128x128x128 1-SM with the epilogue tile they pass (128x64)
fm_golden(golden_plan_engine_sglang_b200 plan --engine sglang --gpu b200)
fm_golden(golden_plan_engine_vllm_b200_cutlass44 plan --engine vllm --gpu b200 --cutlass 4.4.2)
fm_golden(golden_plan_engine_flashinfer_unknown_version plan --engine flashinfer --engine-version 1234567 --gpu b200)
fm_golden(golden_advise_glm5_rtxpro6000 advise --model glm5 --gpu rtx-pro-6000 --gpus 8)
fm_golden(golden_advise_glm5_rtxpro6000_json advise --model glm5 --gpu rtx-pro-6000 --gpus 8 --json)

# Issue 30: advise --tokens-per-step above half the simulator's range (33..64) used to fail on
# the doubled (MTP) value the user never gave; it now reports without the MTP case (null in
# --json), and 65 is refused by the flag check. An empty --engine-version (or any empty value)
# is a usage error naming the flag, not "not given".
add_test(NAME advise_tokens_per_step_mtp COMMAND sh -c
  "out=$(\"$0\" advise --model glm5 --gpu rtx-pro-6000 --gpus 8 --tokens-per-step 40) && echo \"$out\" | grep -q 'at 40 token(s)/step (MTP at 80 tokens/step: beyond the simulator.s 64, not computed)' && out=$(\"$0\" advise --model glm5 --gpu rtx-pro-6000 --gpus 8 --tokens-per-step 32) && echo \"$out\" | grep -q 'with 64 tokens/step (MTP)' && \"$0\" advise --model glm5 --gpu rtx-pro-6000 --gpus 8 --tokens-per-step 64 --json | grep -q '\"8_mtp\":[[:space:]]*null' && err=$(\"$0\" advise --model glm5 --gpu rtx-pro-6000 --gpus 8 --tokens-per-step 65 2>&1); [ $? -eq 2 ] && echo \"$err\" | grep -q 'tokens-per-step expects an integer in \\[1, 64\\]'"
  $<TARGET_FILE:fp4moe_cli>)
set_tests_properties(advise_tokens_per_step_mtp PROPERTIES LABELS cpu)
add_test(NAME plan_engine_empty_values COMMAND sh -c
  "err=$(\"$0\" plan --engine trtllm --engine-version '' --gpu rtx-pro-6000 2>&1 >/dev/null); [ $? -eq 2 ] && echo \"$err\" | grep -q -- \"--engine-version expects a value, got ''\" && err=$(\"$0\" advise --model glm5 --gpu rtx-pro-6000 --gpus 8 --engine '' 2>&1 >/dev/null); [ $? -eq 2 ] && echo \"$err\" | grep -q -- \"--engine expects a value, got ''\""
  $<TARGET_FILE:fp4moe_cli>)
set_tests_properties(plan_engine_empty_values PROPERTIES LABELS cpu)
