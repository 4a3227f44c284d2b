"""llm-release core: the stages of a model release as plain typed functions.

Nothing in this package imports Prefect; the Prefect tasks in ``tasks/`` wrap these
functions and the flows in ``flows/`` only sequence them.

Rooms, one per stage: ``hub`` (acquire and verify), ``sizing`` (the planner),
``quantization``, ``serving`` (servers, backends, the factory, the host probe, tuning),
``evaluation``, ``load``, ``decision`` (contenders, gates, the winner), ``canary`` (router,
promotion, Prometheus, the rollout), ``reporting``. Base modules every room may import:
``errors``, ``paths``, ``fileio``, ``safety``, ``config``, ``results``, ``registry``,
``hardware``. On top: ``preflight`` (checks across the stages) and ``cli``. The rules are
import-linter contracts in pyproject.toml (``make lint``).
"""
