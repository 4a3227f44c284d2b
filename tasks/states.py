"""Run states that tell the truth in the Prefect UI: a candidate that failed is a Failed
task run, while the flow goes on with the others and keeps its typed result."""

from __future__ import annotations

from typing import TypeVar

from prefect.client.schemas.objects import State
from prefect.futures import PrefectFuture
from prefect.states import Completed, Failed

T = TypeVar("T")

# A task that returns a State ends in that state (Prefect 3.9: the engine takes a returned
# State as the run's final state and stores its data as the result); the flow calls such
# tasks with return_state=True and reads the data back with raise_on_failure=False.
FAILED_CANDIDATES = "Completed with failed candidates"


def failed_with(data: T, message: str) -> State:
    """A Failed task state that still carries the task's typed result."""
    return Failed(data=data, message=" ".join(message.split())[:500])


def value_of(state: State, kind: type[T]) -> T:
    """The typed result of a task run, failed or not; a task that raised (a crash, not a
    measured failure) raises here as it would have without return_state."""
    value = state.result(raise_on_failure=False)
    if isinstance(value, kind):
        return value
    if isinstance(value, BaseException):
        raise value
    return state.result()


def settled(future: PrefectFuture) -> State:
    """A submitted task run's final state, once it has one."""
    future.wait()
    return future.state


def first_line(error: str | None, limit: int = 300) -> str:
    """An error in one line for a run's state message: its first line, and for a server that
    died, the last line of its log (vLLM's own words: "unrecognized arguments: --flag");
    the whole log tail stays in the report and the run's log."""
    if not error:
        return "failed"
    lines = error.splitlines()
    text = " ".join(lines[0].split())[:limit]
    if "--- server log tail ---" in error:
        tail = [
            line
            for line in error.split("--- server log tail ---", 1)[1].splitlines()
            if line.strip()
        ]
        if tail:
            text += f" | log: {' '.join(tail[-1].split())[:200]}"
    return text


def completed_with_failures(data: T, failed: dict[str, str | None]) -> T | State:
    """The flow's final state: Completed, named for the failed candidates when there are
    any (the UI's run list shows the name; the message names each one and why)."""
    if not failed:
        return data
    names = ", ".join(failed)
    why = "; ".join(f"{name}: {first_line(error)}" for name, error in failed.items())
    return Completed(
        data=data,
        name=FAILED_CANDIDATES,
        message=f"failed candidates: {names} — {why}"[:2000],
    )
