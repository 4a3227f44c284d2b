"""Decision: who is measured (champion, baseline, candidates), measuring one candidate,
the measurement store, the gates and the winner rule, and the memory of judged commits.

May import: the base modules and the stage rooms below it (hub, quantization, sizing,
serving, evaluation, load). Never canary or reporting.
"""
