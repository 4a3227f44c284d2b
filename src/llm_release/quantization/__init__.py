"""Quantization: FP8 and W4A16 (AWQ) candidates with llm-compressor, and the recipes a
model's config implies (what to quantize, what to leave, and why).

May import: the base modules, ``hardware`` and ``hub`` (the disk check). Never serving,
evaluation, decision, canary or reporting.
"""
