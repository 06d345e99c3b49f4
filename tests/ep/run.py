"""ctest ep_pcie: the PCIe expert-parallel step (examples/ep_pcie.py) over 1, 2 and 4 spawned
CPU ranks with torch.distributed (gloo), when the venv has torch; else exit 77 (ctest's
skipped) saying what to install. Not collected by python_cpu: torch is opt-in."""
import importlib.util
import os
import sys

if __name__ == "__main__":  # the test's spawned ranks import this module again as __mp_main__
    if importlib.util.find_spec("torch") is None:
        print(f"skipped: torch not installed in {sys.prefix} (scripts/deps.sh --engines installs the pinned version)")
        sys.exit(77)
    import pytest

    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rs", "-s", os.path.dirname(os.path.abspath(__file__))]))
