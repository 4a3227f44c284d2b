"""Canary: the winner on live traffic. HAProxy (``router``), promotion and rollback
(``promote``), Prometheus and its alerting rules, the window analysis
(``canary_queries.yaml``) and the rollout policy (``rollout``).

May import: the base modules, ``serving`` (servers and their backends) and ``load`` (the
demo traffic). Never decision or reporting.
"""
