"""Evaluation: eval sets that data scientists own, their template language and metrics,
lm-evaluation-harness against an endpoint, and the bootstrap statistics of the scores.

May import: the base modules only. Never serving, decision, canary or reporting.
"""
