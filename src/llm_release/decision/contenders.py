"""The contenders of a release: who is measured, with what, and against whom.

A release measures, in one run and under the same conditions, the champion (the release
serving users now, when there is one), the new commit's unquantized model (``baseline``)
and each quantized candidate. A contender that cannot go on — skipped on this host, failed
to quantize, failed to serve — carries its ``CandidateResult`` (status ``skipped`` or
``failed``): one kind of failed result at every stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from llm_release.config import BASELINE, CHAMPION, CandidateConfig, ReleaseConfig, ServingConfig
from llm_release.errors import StateError
from llm_release.registry import Release, recorded_model_dir
from llm_release.results import CandidateResult, TuneResult
from llm_release.serving.probe import HostSupport


class Contender(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    role: Literal["champion", "baseline", "quantized"]
    scheme: str
    serving: ServingConfig
    model_dir: Path | None = None
    recipe: CandidateConfig | None = None
    release_id: str | None = None
    commit: str | None = None
    outcome: CandidateResult | None = None
    tuning: TuneResult | None = None

    def failed(self, status: Literal["failed", "skipped"], why: str) -> Contender:
        return self.model_copy(
            update={
                "outcome": CandidateResult(
                    name=self.name,
                    role=self.role,
                    scheme=self.scheme,
                    release_id=self.release_id,
                    model_dir=str(self.model_dir) if self.model_dir else None,
                    status=status,
                    error=why,
                )
            }
        )


def list_contenders(
    config: ReleaseConfig, model_dir: Path, commit: str, host: HostSupport, champion: Release | None
) -> list[Contender]:
    serving = config.serving.model_copy(update={"dtype": host.served_dtype})
    contenders: list[Contender] = []
    if champion is not None:
        contender = Contender(
            name=CHAMPION,
            role="champion",
            scheme=champion.scheme,
            serving=champion.serving,
            model_dir=Path(champion.model_dir),
            release_id=champion.release_id,
            commit=champion.commit,
        )
        # The record names its folder: it is served only from the project's model folders.
        try:
            recorded_model_dir(champion, f"the champion release {champion.release_id}")
        except StateError as exc:
            contender = contender.failed("skipped", exc.one_line())
        contenders.append(contender)
    contenders.append(
        Contender(
            name=BASELINE,
            role="baseline",
            scheme=f"unquantized ({serving.dtype})",
            serving=serving,
            model_dir=model_dir,
            commit=commit,
        )
    )
    for recipe in config.candidates:
        contender = Contender(
            name=recipe.name,
            role="quantized",
            scheme=recipe.scheme,
            serving=serving.model_copy(
                update={"extra_args": serving.extra_args + recipe.extra_serving_args}
            ),
            recipe=recipe,
            commit=commit,
        )
        reason = host.skip_reason(recipe.name)
        contenders.append(contender.failed("skipped", reason) if reason else contender)
    return contenders
