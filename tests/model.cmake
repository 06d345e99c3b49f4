# model.cmake - fp4moe's real layers against the model's own code (tests/model/): checkpoints
# written by NVIDIA ModelOpt and llmcompressor / compressed-tensors, run through
# `fp4moe run --weights ... --input ... --output ...` and compared with transformers' MoE block
# (outputs stored in the fixtures; the test needs numpy only). Exit 77 (skip) only when the CLI
# has no --input/--output. Python: $PYTHON at configure time, else the interpreter CMake found,
# else python3 on PATH; a missing numpy makes the test FAIL.
if(DEFINED ENV{PYTHON} AND NOT "$ENV{PYTHON}" STREQUAL "")
  set(FM_MODEL_PY "$ENV{PYTHON}")
elseif(Python3_EXECUTABLE)
  set(FM_MODEL_PY "${Python3_EXECUTABLE}")
else()
  set(FM_MODEL_PY python3)
endif()

add_test(NAME model_real_layers
         COMMAND ${FM_MODEL_PY} ${CMAKE_CURRENT_SOURCE_DIR}/model/test_real_layers.py
                 $<TARGET_FILE:fp4moe_cli> ${CMAKE_CURRENT_SOURCE_DIR}/model/fixtures)
set_tests_properties(model_real_layers PROPERTIES LABELS cpu SKIP_RETURN_CODE 77)
# The same layers on the GPU (the gpt-oss fixture: MXFP4, clamped SwiGLU, biases, softmax-topk,
# against transformers' GptOssExperts' output): labelled gpu, skips (77) without a device.
if(FM_HAVE_CUDA)
  add_test(NAME model_real_layers_gpu
           COMMAND ${FM_MODEL_PY} ${CMAKE_CURRENT_SOURCE_DIR}/model/test_real_layers.py
                   $<TARGET_FILE:fp4moe_cli> ${CMAKE_CURRENT_SOURCE_DIR}/model/fixtures)
  set_tests_properties(model_real_layers_gpu PROPERTIES LABELS gpu SKIP_RETURN_CODE 77
                       ENVIRONMENT "FM_MODEL_BACKENDS=cuda")
endif()
