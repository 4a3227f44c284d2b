"""A contender measured on another host of the fleet (docs/fleet.md): the order the release
sends to the ``measure`` deployment, a flow run's parameter and so input like any.

The order names the contender (its name, role, scheme and serving settings, never a path
on the sending host), the candidate's hand-over through the hub (``hub.handover``: the
measuring host downloads that commit and proves every file against the hashes carried
here; for the baseline of a release whose source is a hub, that source at the commit the
release host acquired, with the name of its credentials block, never a token), and what the release measures every contender with (its evaluation, load profile
and SLO). The measuring host serves, evaluates and load-tests it as the release host would
(``tasks.candidate.measure_contender``), and its result comes back through the record
(``measurements.of_run``: the run and the contender's name).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from llm_release.config import MAX_CANDIDATE_NAME, EvalConfig, LoadProfile, ServingConfig
from llm_release.decision.contenders import Contender
from llm_release.decision.measurements import RUN_ID
from llm_release.fleet import HOST_NAME
from llm_release.hub.handover import Handover
from llm_release.results import Slo
from llm_release.safety import MAX_SERVED_NAME, SERVED_NAME_PATTERN

DEPLOYMENT = "measure/measure"


class OrderedContender(BaseModel):
    """The contender as the order names it: what it is and how it is served."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=MAX_CANDIDATE_NAME)
    role: Literal["champion", "baseline", "quantized"]
    scheme: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_ ().-]*$", max_length=64)
    serving: ServingConfig
    release_id: str | None = Field(None, pattern=SERVED_NAME_PATTERN, max_length=MAX_SERVED_NAME)
    commit: str | None = Field(None, pattern=r"^[0-9a-f]{40}$")

    @classmethod
    def of(cls, contender: Contender) -> OrderedContender:
        return cls(
            name=contender.name,
            role=contender.role,
            scheme=contender.scheme,
            serving=contender.serving,
            release_id=contender.release_id,
            commit=contender.commit,
        )


class MeasureOrder(BaseModel):
    """One contender to measure on the host whose worker runs the ``measure`` flow."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = Field(pattern=f"^{RUN_ID.pattern}$")
    release_host: str = Field(pattern=f"^{HOST_NAME.pattern}$", description="who sent it")
    contender: OrderedContender
    handover: Handover
    evaluation: EvalConfig
    load: LoadProfile
    slo: Slo | None = None
    public_name: str = Field(pattern=SERVED_NAME_PATTERN, max_length=MAX_SERVED_NAME)

    def contender_at(self, model_dir: Path) -> Contender:
        """The contender to measure, its folder the one received on this host."""
        return Contender(**self.contender.model_dump(), model_dir=model_dir)
