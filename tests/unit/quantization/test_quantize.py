"""The sequential path's host copy: write-backs cast on their own device first, and pinning
only what the host's memory leaves room for."""

import torch
from compressed_tensors.offload.cache.cpu import CPUCache

from llm_release.quantization.quantize import cast_before_write_back, pin_host_copy


def test_a_float64_write_back_reaches_the_bf16_host_copy_as_bf16():
    cache = CPUCache.from_mapping({"weight": torch.zeros(4, 8, dtype=torch.bfloat16)}, "cpu")
    received = []
    original = CPUCache.update_offload

    def spy(self, offloaded, data):
        received.append(data.dtype)
        return original(self, offloaded, data)

    smoothed = torch.randn(4, 8, dtype=torch.float64) * 3
    CPUCache.update_offload = spy
    try:
        with cast_before_write_back():
            cache["weight"] = smoothed
        assert received == [torch.bfloat16]
        cache["weight"] = smoothed  # outside the context: as the library does it
        assert received == [torch.bfloat16, torch.float64]
    finally:
        CPUCache.update_offload = original
    # The same bits as the library's own conversion.
    assert torch.equal(cache.offloaded_values["weight"], smoothed.to(torch.bfloat16))


def test_the_patch_is_undone_when_quantization_fails():
    original = CPUCache.update_offload
    try:
        with cast_before_write_back():
            assert CPUCache.update_offload is not original
            raise RuntimeError("llm-compressor failed")
    except RuntimeError:
        pass
    assert CPUCache.update_offload is original


def test_a_host_copy_too_large_for_the_host_is_left_pageable():
    model = torch.nn.Linear(64, 64)
    before = model.weight.data_ptr()
    assert pin_host_copy(model, share_of_available=0.0) is False
    assert model.weight.data_ptr() == before and not model.weight.is_pinned()
