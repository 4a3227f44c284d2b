"""A release of a tiny random-weight Qwen3-MoE, end to end on this CPU: real Prefect, hub,
probe, vLLM, lm-eval, GuideLLM and HAProxy.

The quantized candidates go through the probe with a tiny model of the release's own kind
(a MoE, not a Llama): vLLM CPU 0.32 serves the bf16 MoE but neither its FP8 nor its W4A16
artifact ("Unsupported FP8 MoE backend: NONE", "No WNA16 MoE backend supports the deployment
configuration"), so both are skipped with that reason before anything is quantized, and the
unquantized model becomes stable. On a runtime that serves them they are measured instead;
the test accepts either, and nothing else. The quantized artifacts themselves are checked in
tests/integration/test_quantize_moe.py."""

import json

import pytest

from demo.hub_server import HubServer, publish_repo
from llm_release import registry
from llm_release.serving.tiny_models import build_tiny_moe_model

pytestmark = [pytest.mark.slow]

MOE_REPO = "tests/tiny-qwen3-moe"


@pytest.fixture()
def moe_hub(tmp_path, tokenizer_dir):
    model = build_tiny_moe_model(tmp_path / "tiny-moe", tokenizer_dir, hidden_size=128)
    publish_repo(tmp_path / "hub", MOE_REPO, model)
    with HubServer(tmp_path / "hub") as server:
        yield server


def test_a_moe_release_skips_what_the_host_cannot_serve_and_releases_the_rest(
    prefect_api, home, moe_hub, sets_reported_only
):
    from flows.release import release
    from llm_release.config import ReleaseConfig
    from llm_release.serving.serve import free_port

    final = release(
        ReleaseConfig.model_validate(
            {
                "source": {"repo_id": MOE_REPO, "endpoint": moe_hub.url},
                "candidates": [
                    {"name": "fp8-dynamic", "scheme": "FP8_DYNAMIC"},
                    {
                        "name": "w4a16-awq",
                        "scheme": "W4A16_AWQ",
                        "num_calibration_samples": 8,
                        "max_seq_length": 64,
                    },
                ],
                "serving": {"enforce_eager": True, "max_model_len": 512, "max_num_seqs": 4},
                "evaluation": {"limit": 4},
                "rollout": {"mode": "hold"},
                "load": {
                    "concurrencies": [1],
                    "requests_per_level": 2,
                    "prompt_tokens": 16,
                    "output_tokens": 4,
                },
                "gates": {"ttft_p95_slo_s": 120},
                "router_port": free_port(),
            }
        ),
        return_state=True,
    )
    out = final.result()
    run_dir = home / "runs" / out.run_id
    report = json.loads((run_dir / "report.json").read_text())
    results = {r["name"]: r for r in report["results"]}
    assert set(results) == {"baseline", "fp8-dynamic", "w4a16-awq"}
    assert results["baseline"]["status"] == "measured", results["baseline"]["error"]
    schemes = {s["candidate"]: s for s in report["host"]["schemes"]}
    for name in ("fp8-dynamic", "w4a16-awq"):
        r = results[name]
        if r["status"] == "skipped":
            assert schemes[name]["status"] == "unsupported"
            assert "cannot serve" in r["error"], r["error"]
            assert "mixture-of-experts" in schemes[name]["reason"], schemes[name]["reason"]
            # Skipped before quantizing: no artifact was built for it.
            assert not (home / "candidates").exists() or not any(
                p.name.startswith(name) for p in (home / "candidates").iterdir()
            )
        else:
            assert r["status"] == "measured", r["error"]
    assert final.is_completed(), final
    assert registry.load().stable.candidate == "baseline" or report["decision"]["winner"]
