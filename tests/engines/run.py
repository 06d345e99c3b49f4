"""ctest engine_transformers: the engine integrations' tests (tests/engines), when the
venv has what they need; else exit 77 (ctest's skipped) saying what is missing and how
to install it. Not collected by python_cpu: torch and transformers are opt-in."""
import importlib.util
import os
import sys

missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
if missing:
    print(f"skipped: {' and '.join(missing)} not installed in {sys.prefix} "
          "(scripts/deps.sh --engines installs the pinned versions)")
    sys.exit(77)
import pytest  # noqa: E402

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rs", "-s", os.path.dirname(os.path.abspath(__file__))]))
