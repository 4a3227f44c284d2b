"""The release flow reads as the runbook: one screen, each stage named and timed by stage()."""

import inspect
import re

from flows.release import release

RUNBOOK = ["plan", "acquire", "probe", "quantize", "tune", "measure", "select", "promote", "canary"]


def test_the_release_flow_is_the_runbook_on_one_screen():
    lines, _ = inspect.getsourcelines(release.fn)
    assert len(lines) <= 45, f"flows/release.py:release is {len(lines)} lines"
    source = "".join(lines)
    assert re.findall(r'with stage\("([a-z]+)"\):', source) == RUNBOOK
    # No stage timed by hand, no report assembled from dicts: typed hand-offs only.
    assert "time.monotonic" not in source and "model_dump" not in source
