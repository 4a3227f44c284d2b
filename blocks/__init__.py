"""Prefect Block classes: configuration and secrets that operators manage in the Prefect UI."""
