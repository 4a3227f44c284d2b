"""Thin Prefect tasks around the core stages in llm_release (retries, logging, artifacts)."""
