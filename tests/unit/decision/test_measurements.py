"""The champion's measurement is reused only when its fingerprint matches; the fingerprint
must not change when the same settings are read back from the release record."""

import json

from llm_release.config import EvalConfig, LoadProfile, ServingConfig
from llm_release.decision.measurements import _canonical
from llm_release.registry import Release


def test_settings_read_back_from_a_release_record_fingerprint_alike():
    serving = ServingConfig(enforce_eager=True, max_model_len=512, max_num_seqs=4)
    record = Release(
        release_id="r",
        candidate="baseline",
        scheme="unquantized",
        repo_id="a/b",
        commit="c" * 40,
        model_dir="/m",
        public_name="b",
        port=20001,
        pid=1,
        log_path="/l",
        serving=serving,
    )
    loaded = Release.model_validate_json(record.model_dump_json()).serving
    # What broke the reuse: a float field's int default dumps as 4, read back as 4.0.
    raw = [json.dumps(s.model_dump(), sort_keys=True) for s in (serving, loaded)]
    canonical = [json.dumps(_canonical(s), sort_keys=True) for s in (serving, loaded)]
    assert canonical[0] == canonical[1]
    assert raw[0] != raw[1] or "shm_size_gib" not in serving.model_dump()


def test_canonical_keeps_what_differs():
    a = _canonical(ServingConfig(max_num_seqs=4), exclude={"startup_timeout_s"})
    b = _canonical(ServingConfig(max_num_seqs=8), exclude={"startup_timeout_s"})
    assert a != b and "startup_timeout_s" not in a
    assert _canonical(EvalConfig()) == _canonical(EvalConfig.model_validate({}))
    assert _canonical(LoadProfile(concurrencies=[2, 8])) != _canonical(LoadProfile())


def test_a_stored_measurement_under_a_run_id_no_flow_makes_is_not_reused(home):
    """The run id of a reused measurement is the report's text: a row naming markup or an
    escape sequence as its run is measured again, not reused (issue 36, by a review)."""
    from llm_release.decision import measurements
    from llm_release.results import CandidateResult

    result = CandidateResult(
        name="champion", scheme="bf16", role="champion", status="measured", fingerprint="a" * 64
    )
    measurements.save(result, "20261205T183012Z-1a2b3c4d")
    assert measurements.find("a" * 64) == (result, "20261205T183012Z-1a2b3c4d")
    for forged in ("x\x1b[2J", "r | **approved**", "../../etc", ""):
        measurements.save(result, forged)
        assert measurements.find("a" * 64) is None, forged


def test_on_a_gpu_host_how_many_items_the_evaluation_asks_at_once_is_part_of_the_fingerprint(
    tmp_path, monkeypatch
):
    """A champion measured batched on a GPU (answers that depend on the batch) is measured
    again one item at a time, not reused; a CPU host's fingerprint does not change."""
    from llm_release.decision import measurements
    from llm_release.serving.probe import HostSupport
    from tests.unit.serving.test_probe import CPU, runtime

    monkeypatch.setattr(measurements, "_model_fingerprint", lambda _: "m")
    monkeypatch.setattr(measurements, "eval_sets_fingerprint", lambda _: {})

    def parts(evaluation: EvalConfig, gpus: list[str]) -> dict:
        host = HostSupport(
            host=CPU.model_copy(update={"gpus": gpus}),
            runtime=runtime(1, 2),
            served_dtype="bfloat16",
            dtype_reason="",
            calibration_dtype="bfloat16",
        )
        args = (tmp_path, ServingConfig(max_num_seqs=256), evaluation, LoadProfile(), host)
        assert measurements.fingerprint(*args) == measurements.fingerprint(*args)
        return measurements.depends_on(*args)

    gpu = ["NVIDIA H100 80GB HBM3"]
    assert parts(EvalConfig(), gpu)["evaluation_in_flight"] == 1
    assert parts(EvalConfig(num_concurrent=8), gpu)["evaluation_in_flight"] == 8
    assert "evaluation_in_flight" not in parts(EvalConfig(), [])
