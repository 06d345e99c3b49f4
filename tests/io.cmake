# io.cmake - extra ctest registrations of the checkpoint loader (issue 6),
# included by tests/CMakeLists.txt:
#   io_sample_write          test_io_checkpoint writes small checkpoints (fixture)
#   io_cli_inspect_*         `fp4moe inspect` on them: text, --json, a bad one, usage
#   io_cli_run_weights       `fp4moe run --weights DIR --layer 1 --check` on them, no warning
#   io_cli_inspect_stray     inspect names a stray expert index and exits 1 (issue 15)
#   io_cli_inspect_nanscale  inspect rejects NaN scale codes as run does, exit 1 (issue 15)
#   io_cli_hostile_paths     inspect / run / simulate --measured on a FIFO and a
#                            directory: exit 1 with FM_ERR_IO at once, no hang
# and a TIMEOUT on every test_io_* program: a blocked open() fails, not stalls.
#   io_fuzz_safetensors_header  libFuzzer over every fuzz/run.sh target (safetensors, config, layer,
#                            npy, sim_csv), 30 s each (labels cpu;fuzz);
#                            FAILS with a message when clang/libFuzzer is missing
set(FM_IO_SAMPLE ${CMAKE_CURRENT_BINARY_DIR}/io_sample)
set(FM_IO_CLI $<TARGET_FILE:fp4moe_cli>)

add_test(NAME io_sample_write
         COMMAND sh -c "rm -rf \"$1\" && mkdir -p \"$1\" && \"$0\" --write-sample \"$1\""
                 $<TARGET_FILE:test_io_checkpoint> ${FM_IO_SAMPLE})
set_tests_properties(io_sample_write PROPERTIES LABELS cpu FIXTURES_SETUP fm_io_sample)

# One CLI check: sh -c SCRIPT with $0 = fp4moe and $1 = the sample folder; its exit
# status decides. (A function, so the semicolons in SCRIPT stay inside one argument.)
function(fm_io_cli_check name script)
  add_test(NAME ${name} COMMAND sh -c "${script}" ${FM_IO_CLI} ${FM_IO_SAMPLE})
  set_tests_properties(${name} PROPERTIES LABELS cpu FIXTURES_REQUIRED fm_io_sample)
endfunction()

fm_io_cli_check(io_cli_inspect_modelopt
  "out=$(\"$0\" inspect \"$1/modelopt\") && echo \"$out\" | grep -Eq 'layout +modelopt' && echo \"$out\" | grep -q 'NVFP4' && echo \"$out\" | grep -Eq '^  3 +4 +64 +32 +32 +2 +sigmoid'")
fm_io_cli_check(io_cli_inspect_gptoss
  "out=$(\"$0\" inspect --tensors \"$1/gptoss\") && echo \"$out\" | grep -Eq 'layout +gpt-oss' && echo \"$out\" | grep -q 'MXFP4' && echo \"$out\" | grep -q 'swiglu-gptoss(limit 7) expert-bias' && ! echo \"$out\" | grep -q 'ignored' && echo \"$out\" | grep -Eq 'gate_up_proj_blocks +U8 +\\[4, 64, 2, 16\\]'")
fm_io_cli_check(io_cli_inspect_json
  "\"$0\" inspect --json --layer 1 \"$1/modelopt\" > \"$1/inspect.json\" && grep -q '\"format\":[[:space:]]*\"nvfp4\"' \"$1/inspect.json\" && grep -q '\"layer\":[[:space:]]*1,' \"$1/inspect.json\" && ! grep -q '\"layer\":[[:space:]]*3,' \"$1/inspect.json\"")
fm_io_cli_check(io_cli_inspect_bad
  "err=$(\"$0\" inspect \"$1/bad\" 2>&1 >/dev/null); rc=$?; [ $rc -eq 1 ] && echo \"$err\" | grep -q 'FM_ERR_NOT_FOUND.*experts.1.down_proj.weight_scale'")
fm_io_cli_check(io_cli_inspect_missing
  "err=$(\"$0\" inspect \"$1/nonexistent\" 2>&1 >/dev/null); rc=$?; [ $rc -eq 1 ] && echo \"$err\" | grep -q 'FM_ERR_IO.*nonexistent'")
fm_io_cli_check(io_cli_inspect_usage
  "\"$0\" inspect --help | grep -q 'usage: fp4moe inspect' && { \"$0\" inspect >/dev/null 2>&1; [ $? -eq 2 ]; } && { \"$0\" inspect --layout nope \"$1\" >/dev/null 2>&1; [ $? -eq 2 ]; } && err=$(\"$0\" inspect \"\" 2>&1 >/dev/null); [ $? -eq 2 ] && echo \"$err\" | grep -q 'PATH is empty'")
# a real layer runs, ModelOpt and gpt-oss (its clamped SwiGLU and expert biases modelled: no
# warning, which a layer with something left unloaded would get on stderr)
fm_io_cli_check(io_cli_run_weights
  "err=$(\"$0\" run --weights \"$1/modelopt\" --layer 1 --check --backend cpu --iters 1 2>&1 >/dev/null) && ! echo \"$err\" | grep -q 'warning' && err=$(\"$0\" run --weights \"$1/gptoss\" --layer 1 --check --backend cpu --iters 1 2>&1 >/dev/null) && ! echo \"$err\" | grep -q 'warning'")

# the routing-flags hint of `run --weights` only where the checkpoint does not say the routing
# (no config.json): not after a bad file's error (a tensor whose shape disagrees with its
# data_offsets, made by editing the header's text; the hint once followed "data_offsets give N")
fm_io_cli_check(io_cli_run_routing_hint
  "t=$(mktemp -d) && cp -r \"$1/modelopt\" \"$t/m\" && cp -r \"$1/modelopt\" \"$t/s\" && rm \"$t/m/config.json\" && LC_ALL=C sed -i 's/\"shape\":\\[32,4\\],\"data_offsets\":\\[1024,1152\\]/\"shape\":[32,3],\"data_offsets\":[1024,1152]/' \"$t/s/model-00001-of-00002.safetensors\" && err=$(\"$0\" run --weights \"$t/m\" --layer 1 --backend cpu --iters 1 2>&1 >/dev/null); rc=$?; err2=$(\"$0\" run --weights \"$t/s\" --layer 1 --backend cpu --iters 1 2>&1 >/dev/null); rc2=$?; rm -rf \"$t\"; [ $rc -ne 0 ] && echo \"$err\" | grep -q 'give it explicitly' && echo \"$err\" | grep -q 'the routing flags are' && [ $rc2 -eq 1 ] && echo \"$err2\" | grep -q 'data_offsets give 128' && ! echo \"$err2\" | grep -q 'the routing flags are'")
fm_io_cli_check(io_cli_inspect_stray
  "err=$(\"$0\" inspect \"$1/stray\" 2>&1 >/dev/null); rc=$?; [ $rc -eq 1 ] && echo \"$err\" | grep -q 'FM_ERR_FORMAT.*experts.999999999.gate_proj.weight.*expert index 999999999'")
fm_io_cli_check(io_cli_inspect_nanscale
  "err=$(\"$0\" inspect \"$1/nanscale\" 2>&1 >/dev/null); rc=$?; [ $rc -eq 1 ] && echo \"$err\" | grep -q 'FM_ERR_NONFINITE.*layers.3.mlp.experts.2.up_proj.weight_scale' && { \"$0\" run --weights \"$1/nanscale\" --layer 3 --backend cpu --iters 1 >/dev/null 2>&1; [ $? -eq 1 ]; }")
fm_io_cli_check(io_cli_hostile_paths
  "d=\"$1/hostile\"; rm -rf \"$d\" && mkdir -p \"$d/dir.safetensors\" && mkfifo \"$d/fifo.safetensors\" \"$d/m.csv\" && err=$(\"$0\" inspect \"$d/fifo.safetensors\" 2>&1 >/dev/null); [ $? -eq 1 ] && echo \"$err\" | grep -q 'FM_ERR_IO.*not a regular file (a FIFO' && err=$(\"$0\" inspect \"$d\" 2>&1 >/dev/null); [ $? -eq 1 ] && echo \"$err\" | grep -q 'FM_ERR_IO.*not a regular file' && { \"$0\" run --weights \"$d/fifo.safetensors\" --layer 1 --backend cpu >/dev/null 2>&1; [ $? -eq 1 ]; } && err=$(\"$0\" simulate --measured \"$d/m.csv\" 2>&1 >/dev/null); [ $? -eq 1 ] && echo \"$err\" | grep -q 'FM_ERR_IO.*m.csv: not a regular file'")
set_tests_properties(io_cli_hostile_paths PROPERTIES TIMEOUT 60)
foreach(t test_io_safetensors test_io_checkpoint test_io_load_errors test_io_hostile test_io_tensors)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES TIMEOUT 120)
  endif()
endforeach()

add_test(NAME io_fuzz_safetensors_header
         COMMAND bash ${PROJECT_SOURCE_DIR}/fuzz/run.sh ${CMAKE_CURRENT_BINARY_DIR}/fuzz 30)
set_tests_properties(io_fuzz_safetensors_header PROPERTIES LABELS "cpu;fuzz" TIMEOUT 600)

# Issue 19/15: routing from the model, compressed-tensors, --input/--output, up-front size checks.
#   io_cli_run_io          run --weights --input x.npy --output y.npy on cpu-ref: y must be, bit for
#                          bit, fm_moe_forward_ref of the loaded layer on bf16(x) (test_io_npy checks)
#   io_cli_run_override    a routing flag with --weights overrides and says so; --topk-group alone: usage
#   io_cli_run_bad_input   a truncated / wrong-shape --input: the status, exit 1 with --weights and
#                          without (issue 30: the shape errors exited 2 without), nothing run
#   io_cli_run_too_big     run --tokens 524288 --hidden 4096: refused at once, exit 2
#   io_cli_inspect_ct      inspect names "compressed-tensors nvfp4-pack-quantized W4A16" and the routing origins
#   io_cli_inspect_unsupported  expert tensors of another format: "unsupported format", exit 1
fm_io_cli_check(io_cli_run_io
  "\"$(dirname \"$0\")/tests/test_io_npy\" --write-input \"$1/modelopt\" \"$1/x.npy\" && \"$0\" run --weights \"$1/modelopt\" --layer 1 --backend cpu-ref --iters 1 --input \"$1/x.npy\" --output \"$1/y.npy\" | grep -q '16 tokens' && \"$(dirname \"$0\")/tests/test_io_npy\" --check-output \"$1/modelopt\" \"$1/x.npy\" \"$1/y.npy\"")
fm_io_cli_check(io_cli_run_override
  "err=$(\"$0\" run --weights \"$1/modelopt\" --layer 1 --backend cpu --iters 1 --topk 1 --score softmax 2>&1 >/dev/null) && echo \"$err\" | grep -q 'top_k 1 from the command line overrides top_k 2 (config.json num_experts_per_tok)' && echo \"$err\" | grep -q 'score softmax from the command line overrides score sigmoid (config.json scoring_func)' && { \"$0\" run --weights \"$1/modelopt\" --layer 1 --topk-group 1 >/dev/null 2>&1; [ $? -eq 2 ]; }")
fm_io_cli_check(io_cli_run_bad_input
  "\"$(dirname \"$0\")/tests/test_io_npy\" --write-input \"$1/modelopt\" \"$1/xb.npy\" && head -c 1000 \"$1/xb.npy\" > \"$1/xt.npy\" && err=$(\"$0\" run --weights \"$1/modelopt\" --layer 1 --backend cpu --input \"$1/xt.npy\" 2>&1 >/dev/null); rc=$?; [ $rc -eq 1 ] && echo \"$err\" | grep -q 'FM_ERR_FORMAT.*truncated' && err=$(\"$0\" run --weights \"$1/modelopt\" --layer 1 --backend cpu --input \"$1/xb.npy\" --tokens 3 2>&1 >/dev/null); rc=$?; [ $rc -eq 1 ] && echo \"$err\" | grep -q 'FM_ERR_BAD_SHAPE.*16 tokens but --tokens says 3' && err=$(\"$0\" run --hidden 128 --experts 4 --inter 64 --topk 2 --backend cpu --input \"$1/xb.npy\" 2>&1 >/dev/null); rc=$?; [ $rc -eq 1 ] && echo \"$err\" | grep -q 'FM_ERR_BAD_SHAPE.*expected \\[T\\]\\[128\\]' && err=$(\"$0\" run --hidden 128 --experts 4 --inter 64 --topk 2 --backend cpu --input \"$1/xt.npy\" 2>&1 >/dev/null); rc=$?; [ $rc -eq 1 ] && echo \"$err\" | grep -q 'FM_ERR_FORMAT.*truncated' && err=$(\"$0\" run --hidden 64 --experts 4 --inter 64 --topk 2 --backend cpu --input \"$1/xb.npy\" --tokens 3 2>&1 >/dev/null); rc=$?; [ $rc -eq 1 ] && echo \"$err\" | grep -q 'FM_ERR_BAD_SHAPE.*16 tokens but --tokens says 3'")
fm_io_cli_check(io_cli_run_too_big
  "err=$(\"$0\" run --tokens 524288 --hidden 4096 2>&1 >/dev/null); rc=$?; [ $rc -eq 2 ] && echo \"$err\" | grep -q 'exceeds 2^31-1' && err=$(\"$0\" run --tokens 262144 --hidden 4096 --backend cpu 2>&1 >/dev/null); rc=$?; [ $rc -eq 2 ] && echo \"$err\" | grep -q 'GB of host memory'")
add_test(NAME io_sample_write_ct
         COMMAND sh -c "rm -rf \"$1\" && mkdir -p \"$1\" && \"$0\" --write-sample \"$1\""
                 $<TARGET_FILE:test_io_ct> ${FM_IO_SAMPLE}_ct)
set_tests_properties(io_sample_write_ct PROPERTIES LABELS cpu FIXTURES_SETUP fm_io_sample_ct)
foreach(t io_cli_inspect_ct io_cli_inspect_unsupported)
  if(t STREQUAL io_cli_inspect_ct)
    set(script "out=$(\"$0\" inspect \"$1/ct16\") && echo \"$out\" | grep -Eq 'layout +compressed-tensors nvfp4-pack-quantized W4A16' && echo \"$out\" | grep -Eq 'routed_scale +2.5 +deepseek_v3 default' && echo \"$out\" | grep -Eq 'top_k +2 +config.json num_experts_per_tok'")
  else()
    set(script "err=$(\"$0\" inspect \"$1/gptq\" 2>&1 >/dev/null); rc=$?; [ $rc -eq 1 ] && echo \"$err\" | grep -q 'unsupported format: expert tensors such as .model.layers.1.mlp.experts.0.gate_proj.qweight. (I32' && err=$(\"$0\" run --weights \"$1/gptq\" --layer 1 --backend cpu 2>&1 >/dev/null); rc=$?; [ $rc -eq 1 ] && echo \"$err\" | grep -q 'FM_ERR_UNSUPPORTED: unsupported format: expert tensors such as'")
  endif()
  add_test(NAME ${t} COMMAND sh -c "${script}" ${FM_IO_CLI} ${FM_IO_SAMPLE}_ct)
  set_tests_properties(${t} PROPERTIES LABELS cpu FIXTURES_REQUIRED fm_io_sample_ct)
endforeach()
