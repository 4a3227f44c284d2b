"""Load: GuideLLM load tests and goodput under the SLO, and the demo's steady traffic.

May import: the base modules and ``hub`` (the child environment without hub credentials).
Never serving, evaluation, decision, canary or reporting.
"""
