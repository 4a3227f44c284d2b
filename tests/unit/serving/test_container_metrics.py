"""The Docker backend's hang watch (serving/container_metrics.py HangWatch): a running
container's server that answered /health once and none for hang_after_s is hung; a restart
starts the watch over. Against a real container: tests/integration/test_docker_backend.py."""

from llm_release.serving.container_metrics import ContainerReading, HangWatch

RUNNING = ContainerReading(status="running", restarts=0, looping=False)


def test_a_server_that_never_answered_is_starting_not_hung():
    watch = HangWatch(10)
    assert not any(watch.hung(RUNNING, False, t) for t in range(0, 100, 2))


def test_silent_for_hang_after_s_after_an_answer_is_hung():
    watch = HangWatch(10)
    assert not watch.hung(RUNNING, True, 0)
    assert not watch.hung(RUNNING, False, 9.9)
    assert watch.hung(RUNNING, False, 10)
    # an answer in between puts the clock back
    watch = HangWatch(10)
    watch.hung(RUNNING, True, 0)
    watch.hung(RUNNING, True, 8)
    assert not watch.hung(RUNNING, False, 17)
    assert watch.hung(RUNNING, False, 18)


def test_a_restart_or_a_stopped_container_starts_the_watch_over():
    watch = HangWatch(10)
    watch.hung(RUNNING, True, 0)
    restarted = ContainerReading(status="running", restarts=1, looping=False)
    assert not watch.hung(restarted, False, 50)  # the new start has not answered yet
    assert not watch.hung(restarted, False, 100)
    watch.hung(restarted, True, 101)
    exited = ContainerReading(status="exited", restarts=1, looping=False)
    assert not watch.hung(exited, False, 200)
    assert not watch.hung(restarted, False, 300)  # running again: starting, not hung
