"""What makes vLLM's profile peak: the live CUDA tensors at the torch peak of profile_run.

On PYTHONPATH with LLM_RELEASE_PEAK_TRACE=DIR, every vLLM process (the engine core too)
wraps GPUModelRunner.profile_run (the V1 and the V2 runner) in torch's allocator history
and writes DIR/peak-profile_run-<pid>.json: the peak above the allocation at the run's start
(the "torch peak memory increase" vLLM logs), and the tensors alive at that moment grouped by
where vLLM allocated them. With LLM_RELEASE_LOAD_TRACE=1 as well, load_model too:
DIR/kept-load_model-<pid>.json, the tensors it keeps (its "Model loading took" figure). A tool for the sizing matrix (scripts/gpu/device_sizing.sh
PEAK_TRACE=1): it explains the activation term the planner models; it is never imported by
the project itself.
"""

import importlib.abc
import importlib.util
import json
import os
import sys

_TARGETS = {"vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner"}


def _where(frames: list[dict]) -> str:
    """The innermost frames of vLLM (or compiled code) that made an allocation."""
    keep = []
    for f in frames:
        name = f.get("filename", "")
        if "/vllm/" in name or "torchinductor" in name:
            short = name.split("/vllm/", 1)[-1] if "/vllm/" in name else "inductor"
            keep.append(f"{short}:{f.get('line')}:{f.get('name')}")
        if len(keep) == 3:
            break
    return " < ".join(keep) or "torch"


def live_at_peak(events: list[dict]) -> tuple[int, int, list[dict]]:
    """(peak, index of its event, live allocations then) replaying alloc/free_completed."""
    current = peak = 0
    at = -1
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            current += e["size"]
            if current > peak:
                peak, at = current, i
        elif e["action"] == "free_completed":
            current -= e["size"]
    live: dict[int, dict] = {}
    for e in events[: at + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    return peak, at, list(live.values())


def live_at_end(events: list[dict]) -> list[dict]:
    """The allocations still alive after the last event (what a step keeps)."""
    live: dict[int, dict] = {}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    return list(live.values())


def summarize(events: list[dict], top: int = 30, *, kept: bool = False) -> dict:
    if kept:  # what the step keeps (load_model: parameters, buffers, caches)
        live = live_at_end(events)
        peak, at = sum(e["size"] for e in live), len(events) - 1
    else:
        peak, at, live = live_at_peak(events)
    groups: dict[str, dict] = {}
    for e in live:
        g = groups.setdefault(_where(e.get("frames", [])), {"bytes": 0, "count": 0, "sizes": []})
        g["bytes"] += e["size"]
        g["count"] += 1
        if len(g["sizes"]) < 8:
            g["sizes"].append(e["size"])
    ranked = sorted(groups.items(), key=lambda kv: -kv[1]["bytes"])[:top]
    return {
        "peak_bytes": peak,
        "peak_event": at,
        "events": len(events),
        "live_at_peak": [{"where": k, **v} for k, v in ranked],
    }


def _traced(module, method: str, kept: bool):
    import torch

    cls = getattr(module, "GPUModelRunner", None)
    original = getattr(cls, method, None) if cls is not None else None
    if original is None or getattr(original, "_peak_traced", False):
        return
    tag = "kept" if kept else "peak"

    def traced(self, *args, **kwargs):
        start = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
        try:
            return original(self, *args, **kwargs)
        finally:
            try:
                torch.cuda.synchronize()
                snap = torch.cuda.memory._snapshot()
                torch.cuda.memory._record_memory_history(enabled=None)
                traces = snap.get("device_traces") or [[]]
                out = summarize(traces[torch.cuda.current_device()], kept=kept)
                out["runner"] = module.__name__
                out["method"] = method
                out["allocated_at_start"] = start
                out["max_allocated_minus_start"] = torch.cuda.max_memory_allocated() - start
                name = f"{tag}-{method}-{os.getpid()}.json"
                path = os.path.join(os.environ["LLM_RELEASE_PEAK_TRACE"], name)
                with open(path, "w") as fh:
                    json.dump(out, fh, indent=1)
                print(
                    f"peak trace: {method} {out['peak_bytes'] / 2**30:.3f} GiB -> {path}",
                    flush=True,
                )
            except Exception as exc:  # a tool: never stop the server it watches
                print(f"peak trace failed: {exc!r}", flush=True)

    traced._peak_traced = True
    setattr(cls, method, traced)


def _patch(module) -> None:
    _traced(module, "profile_run", kept=False)
    if os.environ.get("LLM_RELEASE_LOAD_TRACE"):  # what load_model keeps, grouped by site
        _traced(module, "load_model", kept=True)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _TARGETS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if os.environ.get("LLM_RELEASE_PEAK_TRACE"):
    sys.meta_path.insert(0, _Finder())
