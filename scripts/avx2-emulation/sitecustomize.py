"""Loaded by every Python process of the emulated serving runtime (see ./python): torch then
reports no AVX-512, which is what vLLM's CPU platform asks before choosing its kernels."""

import os

if os.environ.get("LLM_RELEASE_EMULATE_AVX2"):
    import torch.cpu

    torch.cpu._is_avx512_supported = lambda: False
    torch.cpu._is_avx512_bf16_supported = lambda: False
    # vLLM CPU asks this too (the AMX attention path, and its fp8 KV cache): an AVX2-only
    # EPYC has no AMX, and a Xeon with AMX would otherwise pass where the EPYC refuses.
    torch.cpu._is_amx_tile_supported = lambda: False
