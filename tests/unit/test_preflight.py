"""One service, one model name: checked before any work."""

import os

import pytest

from llm_release import registry
from llm_release.config import ReleaseConfig, ServingConfig
from llm_release.errors import ConfigError
from llm_release.preflight import check_service


@pytest.fixture()
def serving_smollm(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path))
    stable = registry.Release(
        release_id="baseline-aaaa-1",
        candidate="baseline",
        scheme="unquantized",
        repo_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        commit="a" * 40,
        model_dir=str(tmp_path / "m"),
        public_name="SmolLM2-135M-Instruct",
        port=20009,
        pid=0,
        log_path=str(tmp_path / "log"),
        serving=ServingConfig(),
    )
    registry.save(registry.RegistryState(stable=stable))
    return stable


def test_a_release_of_another_model_into_the_service_is_refused(serving_smollm):
    other = ReleaseConfig.model_validate({"source": {"repo_id": "google/gemma-3-270m"}})
    with pytest.raises(ConfigError) as caught:
        check_service(other)
    assert "'SmolLM2-135M-Instruct'" in caught.value.message
    assert "replaces_service" in caught.value.hint
    # Same repository under another public name: refused too (its clients would 404).
    renamed = ReleaseConfig.model_validate(
        {"source": {"repo_id": serving_smollm.repo_id}, "public_name": "smol"}
    )
    with pytest.raises(ConfigError):
        check_service(renamed)


def test_replacing_keeps_the_services_public_name(serving_smollm):
    replacing = ReleaseConfig.model_validate(
        {"source": {"repo_id": "google/gemma-3-270m"}, "replaces_service": True}
    )
    champion, name = check_service(replacing)
    assert champion.release_id == "baseline-aaaa-1" and name == "SmolLM2-135M-Instruct"
    same = ReleaseConfig.model_validate({"source": {"repo_id": serving_smollm.repo_id}})
    assert check_service(same)[1] == "SmolLM2-135M-Instruct"


def test_the_first_release_of_a_service_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path))
    config = ReleaseConfig.model_validate({"source": {"repo_id": "a/b"}, "public_name": "kb-bot"})
    assert check_service(config) == (None, "kb-bot")


def test_a_release_asking_fp8_kv_where_the_runtime_cannot_hold_it_stops_before_any_work(
    tmp_path, monkeypatch
):
    """The serving runtime is asked as vLLM asks it; here a stand-in that answers as an
    AVX2-only CPU's torch does. The same release with kv_cache_dtype auto passes."""
    from llm_release import hardware
    from llm_release.preflight import check_host_kv_cache

    cpu_host = hardware.detect().model_copy(update={"gpus": []})  # as on a CPU host
    monkeypatch.setattr(hardware, "detect", lambda: cpu_host)
    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path / "home"))
    runtime = tmp_path / "python"
    runtime.write_text('#!/bin/sh\necho \'{"machine": "x86_64", "avx512": false, "amx": false}\'\n')
    runtime.chmod(0o755)
    monkeypatch.setenv("LLM_RELEASE_VLLM_PYTHON", str(runtime))
    source = {"repo_id": "HuggingFaceTB/SmolLM2-135M-Instruct"}
    fp8 = ReleaseConfig(source=source, serving=ServingConfig(kv_cache_dtype="fp8"))
    with pytest.raises(ConfigError, match="lacks AVX-512 and AMX"):
        check_host_kv_cache(fp8)
    as_args = ServingConfig(extra_args=["--kv-cache-dtype", "fp8"])
    with pytest.raises(ConfigError, match="lacks AVX-512 and AMX"):
        check_host_kv_cache(ReleaseConfig(source=source, serving=as_args))
    check_host_kv_cache(ReleaseConfig(source=source))


def test_an_alertmanager_that_cannot_start_stops_the_release_before_any_work(tmp_path, monkeypatch):
    """The real Alertmanager starts in a scratch folder and is stopped again; one that fails
    as Debian's did unpacked without apt on the H200 (its compiled-in template missing) is
    refused with its log's tail, before the measurements."""
    import shutil

    from llm_release.errors import AlertmanagerError
    from llm_release.preflight import check_alertmanager_starts

    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path / "home"))
    real = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    assert real, "Alertmanager is not installed ('make setup' installs it)"
    check_alertmanager_starts()  # the real one: started, ready, stopped
    import psutil

    trials = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any("llm-release-alertmanager-" in a for a in p.info["cmdline"] or [])
    ]
    assert trials == []
    broken = tmp_path / "bin"
    broken.mkdir()
    fake = broken / "prometheus-alertmanager"
    fake.write_text(
        "#!/bin/sh\n"
        "echo 'err=\"failed to parse templates: open "
        "/usr/share/prometheus/alertmanager/default.tmpl: no such file or directory\"'\n"
        "exit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{broken}:{os.environ['PATH']}")
    with pytest.raises(AlertmanagerError, match="cannot start on this host") as caught:
        check_alertmanager_starts()
    assert "default.tmpl: no such file" in caught.value.message
