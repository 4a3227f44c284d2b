"""Demo traffic: what it refuses before sending anything, its report's figures, and its
prompts (in the eval sets' domain, none of them an eval item)."""

from __future__ import annotations

import json
import math
import re
import threading
from pathlib import Path

import pytest

from llm_release.errors import ConfigError, ReleaseError, TrafficError
from llm_release.load.traffic import (
    Traffic,
    TrafficReport,
    load_prompts,
    local_base_url,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1:8080",
        "http://192.168.1.20:8080",
        "http://example.com:8080",
        "http://127.0.0.1.example.com:8080",
        "http://127.0.0.1@example.com:8080",
        "http://example.com#@127.0.0.1:8080",
        "http://127.0.0.2:8080",  # loopback, but not the router's address
        "http://0.0.0.0:8080",
        "http://[::ffff:127.0.0.1]:8080",
        "http://user:pw@127.0.0.1:8080",
        "ftp://127.0.0.1:8080",
        "127.0.0.1:8080",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:8080/?redirect=http://example.com",
        "http://127.0.0.1 :8080",
        "http://127.0.0.1:8080/\n",
        "",
    ],
)
def test_a_target_off_this_machine_is_refused_before_anything_is_sent(url):
    threads = threading.active_count()
    with pytest.raises(TrafficError) as caught:
        Traffic(url, "m", rate_rps=1, duration_s=1)
    assert isinstance(caught.value, ConfigError) and isinstance(caught.value, ReleaseError)
    assert caught.value.hint
    assert threading.active_count() == threads


@pytest.mark.parametrize(
    "url, expected",
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/v1"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/v1"),
        ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080/v1"),
        # localhost is sent as 127.0.0.1: /etc/hosts cannot point the stream elsewhere
        ("http://localhost:8080", "http://127.0.0.1:8080/v1"),
        ("http://[::1]:8080", "http://[::1]:8080/v1"),
    ],
)
def test_local_urls_become_the_openai_base_url(url, expected):
    assert local_base_url(url) == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rate_rps": 0},
        {"rate_rps": -1},
        {"rate_rps": math.nan},
        {"rate_rps": math.inf},
        {"rate_rps": 1e9},
        {"rate_rps": True},
        {"rate_rps": "5"},
        {"duration_s": 0},
        {"duration_s": -5},
        {"duration_s": math.nan},
        {"duration_s": 10 * 24 * 3600},
        {"concurrency": 0},
        {"concurrency": 2.5},
        {"concurrency": 10_000},
        {"max_tokens": 0},
        {"timeout_s": 0},
        {"max_requests": 0},
        {"prompts": []},
        {"prompts": ["fine", "  "]},
        {"prompts": ["x" * 9000]},
    ],
)
def test_bad_rates_durations_and_sizes_are_refused(kwargs):
    args = {"rate_rps": 2.0, "duration_s": 5.0, **kwargs}
    with pytest.raises(TrafficError) as caught:
        Traffic("http://127.0.0.1:8080", "m", **args)
    assert caught.value.hint


@pytest.mark.parametrize("model", ["", "   ", "x" * 300])
def test_a_bad_model_name_is_refused(model):
    with pytest.raises(TrafficError):
        Traffic("http://127.0.0.1:8080", model, rate_rps=1, duration_s=1)


def test_latency_percentiles_interpolate_between_the_closest_ranks():
    def latencies(values: list[float]) -> tuple[float | None, float | None]:
        report = TrafficReport.from_samples(
            base_url="u", model="m", rate_rps=1, concurrency=1, latencies_s=values, errors={},
            duration_s=1.0,
        )  # fmt: skip
        return report.latency_p50_s, report.latency_p95_s

    assert latencies([float(v) for v in range(1, 101)]) == pytest.approx((50.5, 95.05))
    assert latencies([3.0, 1.0, 2.0])[0] == 2.0
    assert latencies([7.0]) == (7.0, 7.0)
    assert latencies([]) == (None, None)


def test_report_counts_failures_by_kind_and_the_achieved_rate():
    report = TrafficReport.from_samples(
        base_url="http://127.0.0.1:8080/v1",
        model="m",
        rate_rps=12.0,
        concurrency=4,
        latencies_s=[0.1 * i for i in range(1, 101)],
        errors={"http_503": 2, "connection": 1},
        error_samples={"http_503": "Service Unavailable"},
        output_tokens=1600,
        duration_s=10.0,
    )
    assert (report.sent, report.succeeded, report.failed) == (103, 100, 3)
    assert list(report.errors) == ["connection", "http_503"]
    assert report.latency_p50_s == pytest.approx(5.05)
    assert report.latency_p95_s == pytest.approx(9.505)
    assert report.latency_max_s == pytest.approx(10.0)
    assert report.achieved_rate_rps == pytest.approx(10.3)
    text = report.summary()
    assert "103 sent" in text and "3 failed" in text and "http_503: 2" in text
    assert TrafficReport.model_validate_json(report.model_dump_json()) == report


def test_a_report_of_nothing_has_no_latency_and_no_rate():
    report = TrafficReport.from_samples(
        base_url="u", model="m", rate_rps=1, concurrency=1, latencies_s=[], errors={},
        duration_s=0.0,
    )  # fmt: skip
    assert report.sent == 0 and report.latency_p95_s is None and report.achieved_rate_rps == 0


def test_an_unstarted_stream_stops_with_an_empty_report():
    traffic = Traffic("http://127.0.0.1:8080", "m", rate_rps=1, duration_s=1)
    report = traffic.stop()
    assert report.sent == 0 and not report.stopped_early


def _eval_items() -> list[dict]:
    items = []
    for path in sorted((ROOT / "eval_sets").glob("*/data.jsonl")):
        items += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return items


def test_prompts_are_a_few_dozen_short_distinct_lines():
    prompts = load_prompts()
    assert 40 <= len(prompts) <= 80
    assert len(set(prompts)) == len(prompts)
    assert all(5 < len(p) <= 300 for p in prompts)


def test_no_prompt_is_or_contains_an_eval_item():
    """Written fresh: no traffic prompt is an eval item's question or contains one, nor
    any sentence of an eval passage (the traffic must not rehearse the eval set)."""
    items = _eval_items()
    assert len(items) >= 120  # manufacturing_kb + refusal_kb, so the check has teeth
    prompts = [p.lower() for p in load_prompts()]
    questions = {item["question"].strip().lower() for item in items}
    sentences = {
        s.strip().lower()
        for item in items
        for s in re.split(r"(?<=[.!?])\s+", item.get("passage", ""))
        if len(s.strip()) > 20
    }
    for prompt in prompts:
        assert prompt not in questions, prompt
        assert not [q for q in questions if q in prompt], prompt
        assert not [s for s in sentences if s in prompt], prompt
        assert not [q for q in questions if prompt in q], prompt


def test_the_prompt_file_is_package_data():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'(?m)^llm_release = \[.*"data/\*\.txt".*\]', pyproject)
    assert (ROOT / "src/llm_release/data/traffic_prompts.txt").is_file()


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--url", "http://10.0.0.1:8080", "--model", "m"], "only this machine"),
        (["--url", "http://127.0.0.1:8080", "--model", "m", "--rate", "0"], "rate_rps"),
        ([], "no release is serving"),
    ],
)
def test_the_cli_refuses_in_one_line(home, capsys, extra, expected):
    from llm_release.cli import main as cli

    argv = ["traffic", "--rate", "1", "--duration", "1", *extra]
    # argparse keeps the last --rate given
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
