"""llm-release core: the stages of a model release as plain typed functions.

Nothing in this package imports Prefect; the Prefect tasks in ``tasks/`` wrap these
functions and the flows in ``flows/`` only sequence them.
"""

__version__ = "0.1.0"
