"""Prefect flows: they only sequence the tasks in ``tasks/``."""
