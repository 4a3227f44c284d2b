"""Every benchmark under bench/ still imports against the package it measures (a renamed
function broke canary_reliability.py unseen), and says how to run it."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def test_the_scan_sees_the_benchmarks():
    assert {"side_by_side.py", "canary_reliability.py", "tune_goodput.py"} <= {
        p.name for p in SCRIPTS
    }


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_a_benchmark_imports_and_has_a_main(script, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None)), f"{script.name} has no main()"
    assert module.__doc__ and ".py" in module.__doc__, f"{script.name} says not how to run it"
