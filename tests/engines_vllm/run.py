"""ctest engine_vllm: the vLLM plugin's tests (tests/engines_vllm) in the venv that
`scripts/deps.sh --vllm` makes (FM_VLLM_VENV, default .venv-vllm at the repository root):
re-executed there when the interpreter running this lacks vllm; exit 77 (ctest's skipped)
saying what to install when there is no such venv."""
import importlib.util
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("vllm") is None:
    venv = os.environ.get("FM_VLLM_VENV") or os.path.join(here, "..", "..", ".venv-vllm")
    py = os.path.join(venv, "bin", "python")
    if os.environ.get("FM_VLLM_REEXEC") or not os.access(py, os.X_OK):
        print(f"skipped: vllm is not installed in {sys.prefix} and {os.path.abspath(venv)} has no python "
              "(scripts/deps.sh --vllm installs vLLM 0.33.0 and its pins there, ~9 GB)")
        sys.exit(77)
    os.environ["FM_VLLM_REEXEC"] = "1"  # a venv without vllm must skip, not loop
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])
import pytest  # noqa: E402

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rs", "-s", here]))
