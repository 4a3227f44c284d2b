"""Reporting: the release report (markdown, JSON, items table) and its plots.

May import: every other room (it reads their typed results). Nothing but the CLI imports it.
"""
