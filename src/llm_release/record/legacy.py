"""The one-time import of a project home's old JSON files into the record: the release
registry (``releases.json``: both slots' releases, the canary's weight, the walk's status,
the history), the judgements (``judgements/*.json``), the measurements
(``measurements/*.json``) and the GPU claim ledger (``gpus.json``). Run by
``store.migrate`` in the migration's transaction: all of it or nothing.

Each store's import is marked done in ``imports`` under a name of its own
(``IMPORTS``), so a second start imports nothing, and a record imported before a store
moved onto it still imports that store's files once: ``json`` (the registry; on records
made before the other marks, the judgements and measurements present then too),
``judgements``, ``measurements``, ``gpus``. The old code kept writing judgements and
measurements to their files after the first import; the catch-up import reads every file
again and writes its row over the record's (nothing but the import wrote those tables
before the stores moved, so a file is never older than its row): what changed since is
kept, what did not is counted as nothing. The files stay where they are (a backup of
what was imported).

A registry that does not parse stops the import, as it stopped every command before: the
operator moves it aside. An unreadable judgement or measurement is skipped with a warning,
as the stores skipped it before (the question is asked again, the candidate measured
again); an unreadable GPU ledger is skipped whole, as the ledger started afresh before.
Every claim is imported, its holder alive or not: the ledger's next claim drops a claim
whose holder is gone (``serving/gpus.py``), which this room, below the serving room,
cannot tell.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import inspect
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from llm_release.errors import StateError
from llm_release.record.schema import (
    SLOTS,
    DecisionRow,
    GpuClaimRow,
    ImportRow,
    MeasurementRow,
    ReleaseRow,
    RolloutRow,
)
from llm_release.record.state import write_state

log = logging.getLogger(__name__)

# The import marks: the registry's (the first, and its name on records made before the
# others), then one per store that moved onto the record after it.
JSON_IMPORT = "json"
IMPORTS = (JSON_IMPORT, "judgements", "measurements", "gpus")


def _columns(row_type: type) -> set[str]:
    return {c.key for c in inspect(row_type).column_attrs}


def _check(row_type: type, record: dict[str, Any]) -> None:
    """A field the table does not know is refused (the files were written by the pydantic
    models these tables mirror, extra='forbid')."""
    if not isinstance(record, dict):
        raise TypeError(f"a {row_type.__tablename__} record is not an object")
    unknown = set(record) - _columns(row_type)
    if unknown:
        raise ValueError(f"fields {sorted(unknown)} are not in table {row_type.__tablename__}")


def _row(row_type: type, record: dict[str, Any]):
    _check(row_type, record)
    return row_type(**record)


def _registry(session: Session, path: Path) -> dict[str, int]:
    try:
        state = json.loads(path.read_bytes())
        unknown = set(state) - {
            "router_port",
            "stable",
            "canary",
            "canary_weight",
            "rollout",
            "history",
        }
        if unknown:
            raise ValueError(f"fields {sorted(unknown)} are not the registry's")
        written = datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat()
        for slot in SLOTS:
            if state.get(slot) is not None:
                _check(ReleaseRow, state[slot])
                # A record from before releases had a start time: started by the time the
                # file was last written (what Release's default gave each load before).
                state[slot].setdefault("started_at", written)
        if state.get("rollout") is not None:
            _check(RolloutRow, state["rollout"])
        write_state(session, state)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, SQLAlchemyError) as exc:
        raise StateError(
            f"the release registry {path} is corrupt: it could not be imported into the "
            f"record ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})",
            hint=f"'llm-release down' still stops the servers; then move {path.name} aside "
            "(the record starts from no stable release) or restore it from a backup",
        ) from None
    releases = sum(state.get(slot) is not None for slot in SLOTS)
    return {"releases": releases, "history events": len(state.get("history") or [])}


def _judgement(path: Path) -> DecisionRow:
    return _row(DecisionRow, json.loads(path.read_text()))


def _measurement(path: Path) -> MeasurementRow:
    stored = json.loads(path.read_text())
    result = stored["result"]
    if result.get("status") != "measured" or not result.get("fingerprint"):
        raise ValueError("not a complete measurement")
    return MeasurementRow(
        fingerprint=result["fingerprint"],
        run_id=str(stored.get("run_id")),
        name=result["name"],
        scheme=result["scheme"],
        role=result.get("role", "quantized"),
        result=result,
    )


def _gpu_claims(path: Path) -> list[GpuClaimRow]:
    """The ledger's claims (``gpus.Ledger``), each with ``gpus.Claim``'s defaults."""
    ledger = json.loads(path.read_bytes())
    if not isinstance(ledger, dict) or set(ledger) - {"claims"}:
        raise ValueError("not a GPU ledger")
    rows = []
    for claim in ledger.get("claims") or []:
        _check(GpuClaimRow, claim)
        gpus = claim["gpus"]
        if not isinstance(claim["holder"], str) or not (
            isinstance(gpus, list) and all(isinstance(g, int) for g in gpus)
        ):
            raise ValueError(f"claim {claim['holder']!r} is not a holder and its GPU indices")
        rows.append(GpuClaimRow(**{"backend": "process", **claim}))
    return rows


def _same(row, record) -> bool:
    return all(getattr(row, c) == getattr(record, c) for c in _columns(type(row)))


def import_home(session: Session, home: Path, where: str) -> dict[str, int] | None:
    """Import ``home``'s JSON files of each store not imported yet; None when the record
    already holds every import."""
    todo = [name for name in IMPORTS if session.get(ImportRow, name) is None]
    if not todo:
        return None
    counts: dict[str, dict[str, int]] = {name: {} for name in todo}
    skipped: dict[str, list[str]] = {name: [] for name in todo}
    found = False
    registry = home / "releases.json"
    if JSON_IMPORT in todo:
        counts[JSON_IMPORT] = {"releases": 0, "history events": 0}
        if registry.exists():
            found = True
            counts[JSON_IMPORT].update(_registry(session, registry))
    for folder, read, row_type in (
        ("judgements", _judgement, DecisionRow),
        ("measurements", _measurement, MeasurementRow),
    ):
        if folder not in todo:
            continue
        counts[folder] = {folder: 0}
        seen: set[str] = set()
        for path in sorted((home / folder).glob("*.json")):
            found = True
            try:
                row = read(path)
            except (OSError, ValueError, TypeError, KeyError) as exc:
                log.warning("record: %s not imported (%s); it is left as it is", path, exc)
                skipped[folder].append(str(path))
                continue
            key = getattr(row, inspect(row_type).primary_key[0].key)
            if key in seen:
                continue  # the same key twice (a copied file): one row
            seen.add(key)
            there = session.get(row_type, key)
            if there is not None and _same(there, row):
                continue  # imported before, unchanged since
            session.merge(row)  # new, or rewritten by the old code since the first import
            session.flush()
            counts[folder][folder] += 1
    if "gpus" in todo:
        counts["gpus"] = {"GPU claims": 0}
        ledger = home / "gpus.json"
        if ledger.exists():
            found = True
            try:
                claims = _gpu_claims(ledger)
            except (OSError, ValueError, TypeError, KeyError) as exc:
                log.warning(
                    "record: %s not imported (%s); the GPU ledger starts empty", ledger, exc
                )
                skipped["gpus"].append(str(ledger))
                claims = []
            for claim in claims:
                if session.get(GpuClaimRow, claim.holder) is None:
                    session.add(claim)
                    session.flush()
                    counts["gpus"]["GPU claims"] += 1
    at = datetime.now(UTC).isoformat(timespec="seconds")
    for name in todo:
        done = {**counts[name], "skipped": len(skipped[name])}
        session.add(ImportRow(name=name, at=at, source=str(home), counts=done))
    total = {what: n for name in todo for what, n in counts[name].items()}
    unreadable = sum(len(paths) for paths in skipped.values())
    if found:
        log.info(
            "record: imported the JSON files of %s into %s once: %s%s; the files stay as they were",
            home,
            where,
            ", ".join(f"{n} {what}" for what, n in total.items()),
            f", {unreadable} unreadable skipped" if unreadable else "",
        )
    return total
