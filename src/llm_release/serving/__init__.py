"""Serving: one vLLM server per candidate or release, and everything about how it runs.

``serve`` (the endpoint contract and the process backend), ``backends/`` (the docker backend,
its SDK client and its images, and the release operations of both), ``factory`` (the one
place a server is built: it follows ``serving.backend``), ``dtype`` (the served dtype) and
``probe`` (which schemes the runtime runs here), ``gpus`` (GPU placement), ``capacity``
(the planner applied to a served model), ``tune`` (serving settings tuned for goodput),
``serving_flags``, ``reasoning``, ``processes``, ``runtime_info`` (run by the serving
interpreter, imports nothing) and ``tiny_models``.

May import: the base modules, ``hardware``, ``sizing``, ``hub``, ``quantization`` (the
scheme probe quantizes a tiny model) and ``load`` (tuning measures goodput). Never
evaluation, decision, canary or reporting.
"""
