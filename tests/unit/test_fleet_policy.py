"""llm_release/fleet.place: where the measure stage measures each contender, and
fleet.seat_queued: where one queued at home goes once a host frees a slot (pure policies:
the fleet's cards and slots come in as arguments)."""

from __future__ import annotations

import itertools

import pytest

from llm_release.errors import ConfigError
from llm_release.fleet import Seat, place, seat_now, seat_queued, wrong_home

HOME = "gpu_a"


def seats(*names: str, role: str = "quantized", **kw) -> list[Seat]:
    return [Seat(name=n, role=role, **kw) for n in names]


def fits_all(contenders: list[Seat], hosts: list[str]) -> dict[str, list[str]]:
    return {s.name: hosts for s in contenders}


def test_one_host_measures_everything_at_home_even_when_its_slots_are_taken():
    contenders = [Seat(name="champion", role="champion"), *seats("baseline", "w4a16", "fp8")]
    placed = place(contenders, HOME, fits_all(contenders, [HOME]), {HOME: 0})
    assert placed.hosts == dict.fromkeys(["champion", "baseline", "w4a16", "fp8"], HOME)
    assert placed.away() == {} and placed.spare == {}
    # they fit home alone, found no free slot: queued there (the champion is home anyway)
    assert placed.queued == ["baseline", "w4a16", "fp8"]


def test_home_first_then_the_fitting_host_with_the_most_free_slots():
    contenders = seats("baseline", "w4a16", "fp8", "int8")
    hosts = [HOME, "gpu_b", "gpu_c", "gpu_d"]
    free = {HOME: 1, "gpu_b": 1, "gpu_c": 3, "gpu_d": 0}
    placed = place(contenders, HOME, fits_all(contenders, hosts), free)
    # home's one slot to the first; then gpu_c (3 free), gpu_c again (2 left beats gpu_b's 1)
    assert placed.hosts == {"baseline": HOME, "w4a16": "gpu_c", "fp8": "gpu_c", "int8": "gpu_b"}
    assert placed.away() == {"w4a16": "gpu_c", "fp8": "gpu_c", "int8": "gpu_b"}
    assert placed.queued == []
    # another host to measure it on should its own be lost: the other fitting ones, home last
    assert placed.spare["w4a16"] == ["gpu_b", "gpu_d", HOME]
    assert placed.spare["int8"] == ["gpu_c", "gpu_d", HOME]  # gpu_c has 1 left, gpu_d none


def test_in_a_fleet_of_two_a_lost_contender_is_measured_again_at_home():
    contenders = seats("baseline", "fp8")
    placed = place(contenders, HOME, fits_all(contenders, [HOME, "gpu_b"]), {HOME: 1, "gpu_b": 1})
    assert placed.hosts == {"baseline": HOME, "fp8": "gpu_b"}
    assert placed.spare == {"fp8": [HOME]}
    # home is no spare where the model does not fit it
    placed = place(contenders, HOME, {"baseline": [HOME], "fp8": ["gpu_b"]}, {HOME: 1, "gpu_b": 1})
    assert placed.spare == {"fp8": []}


def test_ties_go_to_the_first_host_by_name():
    contenders = seats("w4a16")
    free = {HOME: 0, "gpu_c": 2, "gpu_b": 2}
    placed = place(contenders, HOME, fits_all(contenders, ["gpu_c", HOME, "gpu_b"]), free)
    assert placed.hosts == {"w4a16": "gpu_b"}


def test_a_host_the_model_does_not_fit_gets_nothing_however_free():
    contenders = seats("baseline", "w4a16")
    fits = {"baseline": [HOME, "gpu_b"], "w4a16": [HOME, "gpu_b"]}
    placed = place(contenders, HOME, fits, {HOME: 0, "gpu_b": 1, "gpu_big": 8})
    assert placed.hosts == {"baseline": "gpu_b", "w4a16": HOME}
    assert placed.queued == ["w4a16"]  # gpu_b's one slot went to baseline: w4a16 waits home


def test_the_champion_stays_home_and_takes_a_slot_there():
    contenders = [*seats("baseline"), Seat(name="champion", role="champion"), *seats("w4a16")]
    free = {HOME: 1, "gpu_b": 4}
    placed = place(contenders, HOME, fits_all(contenders, [HOME, "gpu_b"]), free)
    # placed whatever its position: home's one slot is the champion's
    assert placed.hosts == {"baseline": "gpu_b", "champion": HOME, "w4a16": "gpu_b"}
    # with home full, it still stays home (it serves users from home; its folder is home's)
    full = place(contenders, HOME, fits_all(contenders, [HOME, "gpu_b"]), {HOME: 0, "gpu_b": 4})
    assert full.hosts["champion"] == HOME and "champion" not in full.queued


def test_a_settled_contender_stays_home_and_takes_no_slot():
    contenders = [*seats("skipped", settled=True), *seats("w4a16")]
    placed = place(contenders, HOME, fits_all(contenders, [HOME, "gpu_b"]), {HOME: 1, "gpu_b": 4})
    assert placed.hosts == {"skipped": HOME, "w4a16": HOME}


def test_a_contender_that_needs_more_slots_than_a_host_has_free_goes_where_they_are():
    contenders = seats("tp2", slots=2)
    free = {HOME: 1, "gpu_b": 1, "gpu_c": 2}
    placed = place(contenders, HOME, fits_all(contenders, [HOME, "gpu_b", "gpu_c"]), free)
    assert placed.hosts == {"tp2": "gpu_c"}


def test_a_contender_on_every_gpu_counts_each_hosts_own_gpus():
    # gpus "all": 8 slots on home's 8 GPUs, 2 on gpu_b's 2; with home busy it goes to gpu_b,
    # where its 2 slots are free (counted with home's 8 it would wait, queued, at home)
    contenders = seats("everywhere", slots=8, slots_on={"gpu_b": 2})
    placed = place(contenders, HOME, fits_all(contenders, [HOME, "gpu_b"]), {HOME: 4, "gpu_b": 2})
    assert placed.hosts == {"everywhere": "gpu_b"} and placed.queued == []
    # and the slots it takes there are gpu_b's count: a second one finds none left
    two = seats("first", "second", slots=8, slots_on={"gpu_b": 2})
    again = place(two, HOME, fits_all(two, [HOME, "gpu_b"]), {HOME: 4, "gpu_b": 2})
    assert again.hosts == {"first": "gpu_b", "second": HOME} and again.queued == ["second"]


def test_a_contender_that_fits_no_host_is_a_clear_error():
    contenders = seats("baseline", "huge")
    fits = {"baseline": [HOME], "huge": []}
    with pytest.raises(ConfigError, match="contender huge fits no host of the fleet") as error:
        place(contenders, HOME, fits, {HOME: 4})
    assert "how to fix:" in error.value.one_line()


def test_a_contender_that_fits_only_busy_hosts_elsewhere_is_queued_on_the_freest():
    contenders = seats("w4a16")
    placed = place(contenders, HOME, {"w4a16": ["gpu_c", "gpu_b"]}, {"gpu_b": 0, "gpu_c": 0})
    assert placed.hosts == {"w4a16": "gpu_b"} and placed.queued == ["w4a16"]
    # sent there at once, where it waits on that host's slots: only one queued home waits
    assert placed.waiting == []
    assert seat_queued(placed, {"gpu_b": 0, "gpu_c": 4}).hosts == {"w4a16": "gpu_b"}


def test_the_same_fleet_gives_the_same_placement_whatever_the_order_of_its_keys():
    contenders = [Seat(name="champion", role="champion"), *seats("baseline", "w4a16", "fp8")]
    hosts = [HOME, "gpu_b", "gpu_c"]
    free = {HOME: 1, "gpu_b": 1, "gpu_c": 1}
    first = place(contenders, HOME, fits_all(contenders, hosts), free)
    for order in itertools.permutations(hosts):
        shuffled = {h: free[h] for h in order}
        again = place(contenders, HOME, fits_all(contenders, list(order)), shuffled)
        assert again == first
    assert first.hosts == {
        "champion": HOME,
        "baseline": "gpu_b",
        "w4a16": "gpu_c",
        "fp8": HOME,  # queued: every host it fits is full
    }
    assert first.queued == ["fp8"]


# ---------------------------------------------------------------- a contender queued at home


def full_fleet(contenders: list[Seat], hosts=(HOME, "gpu_b", "gpu_c")):
    """Every host full: all but the champion queued at home."""
    return place(contenders, HOME, fits_all(contenders, list(hosts)), dict.fromkeys(hosts, 0))


def test_a_queued_contender_goes_to_the_host_that_freed_a_slot_first():
    placed = full_fleet(seats("w4a16"))
    assert placed.hosts == {"w4a16": HOME} and [s.name for s in placed.waiting] == ["w4a16"]
    seated = seat_queued(placed, {HOME: 0, "gpu_b": 0, "gpu_c": 1})
    assert seated.hosts == {"w4a16": "gpu_c"} and seated.away() == {"w4a16": "gpu_c"}
    assert seated.waiting == [] and seated.queued == [] and seated.fits == {}
    assert seated.spare == {"w4a16": ["gpu_b", HOME]}  # as place gives them: home last
    assert seated.left == {HOME: 0, "gpu_b": 0, "gpu_c": 0}  # the slot it took


def test_a_queued_contender_waits_while_no_host_it_fits_has_a_slot():
    placed = full_fleet(seats("w4a16", "fp8"))
    again = seat_queued(placed, {HOME: 0, "gpu_b": 0, "gpu_c": 0})
    assert again.hosts == placed.hosts and again.waiting == placed.waiting
    assert again.queued == ["w4a16", "fp8"]
    # a host it does not fit frees slots: it waits on
    fits = {"w4a16": [HOME, "gpu_b"]}
    narrow = place(seats("w4a16"), HOME, fits, {HOME: 0, "gpu_b": 0, "gpu_c": 0})
    assert seat_queued(narrow, {HOME: 0, "gpu_b": 0, "gpu_c": 4}).waiting == narrow.waiting


def test_home_first_when_home_and_another_host_free_slots_at_once():
    placed = full_fleet(seats("w4a16", "fp8"))
    seated = seat_queued(placed, {HOME: 1, "gpu_b": 1, "gpu_c": 0})
    # in order: the first takes home's slot, the second the other host's
    assert seated.hosts == {"w4a16": HOME, "fp8": "gpu_b"} and seated.waiting == []
    assert seat_now(seats("x")[0], [HOME, "gpu_b"], HOME, {HOME: 1, "gpu_b": 5}) == HOME


def test_a_queued_contender_needs_its_slots_as_each_host_counts_them():
    # gpus "all": 8 slots at home (8 GPUs), 2 on gpu_b (2 GPUs)
    everywhere = seats("everywhere", slots=8, slots_on={"gpu_b": 2})
    placed = full_fleet(everywhere, hosts=(HOME, "gpu_b"))
    assert seat_queued(placed, {HOME: 4, "gpu_b": 1}).waiting == placed.waiting  # short of both
    assert seat_queued(placed, {HOME: 4, "gpu_b": 2}).hosts == {"everywhere": "gpu_b"}
    at_home = seat_queued(placed, {HOME: 8, "gpu_b": 2})
    assert at_home.hosts == {"everywhere": HOME} and at_home.waiting == []
    assert seat_now(everywhere[0], [HOME, "gpu_b"], HOME, {HOME: 7, "gpu_b": 1}) is None


def test_slots_given_to_a_seated_contender_are_no_free_slot_until_a_host_frees_one():
    # home's slot went to baseline, gpu_b's to fp8; neither has taken it yet when read again
    contenders = seats("baseline", "fp8", "w4a16")
    placed = place(contenders, HOME, fits_all(contenders, [HOME, "gpu_b"]), {HOME: 1, "gpu_b": 1})
    assert placed.hosts == {"baseline": HOME, "fp8": "gpu_b", "w4a16": HOME}
    assert placed.left == {HOME: 0, "gpu_b": 0} and placed.read == {HOME: 1, "gpu_b": 1}
    unchanged = seat_queued(placed, {HOME: 1, "gpu_b": 1})
    assert [s.name for s in unchanged.waiting] == ["w4a16"]
    taken = seat_queued(unchanged, {HOME: 0, "gpu_b": 0})  # both measuring now
    assert [s.name for s in taken.waiting] == ["w4a16"]
    # fp8's measurement ends: gpu_b's count rises, and that slot is the queued one's
    freed = seat_queued(taken, {HOME: 0, "gpu_b": 1})
    assert freed.hosts["w4a16"] == "gpu_b" and freed.waiting == []


def test_a_measurement_here_that_ended_gives_its_slots_back_to_the_queued():
    # the champion's measurement reused: it never took home's one slot, so no count rises
    contenders = [Seat(name="champion", role="champion"), *seats("baseline")]
    placed = place(contenders, HOME, fits_all(contenders, [HOME, "gpu_b"]), {HOME: 1, "gpu_b": 0})
    assert [s.name for s in placed.waiting] == ["baseline"]
    assert seat_queued(placed, {HOME: 1, "gpu_b": 0}).waiting == placed.waiting
    back = seat_queued(placed, {HOME: 1, "gpu_b": 0}, ended=1)
    assert back.hosts["baseline"] == HOME and back.waiting == [] and back.queued == []
    # never more than home has free now
    assert seat_queued(placed, {HOME: 0, "gpu_b": 0}, ended=1).waiting == placed.waiting


# ---------------------------------------------------------------- a release pinned to its home


@pytest.mark.parametrize(
    ("queue", "own", "refused"),
    [
        (None, None, False),  # in this process: no queue
        ("default", None, False),  # the pool's default queue: any worker is home
        ("default", "gpu_a", False),
        ("host-gpu_a", "gpu_a", False),  # pinned, and its own worker took it
        ("host-gpu_a", "gpu_b", True),  # another host's worker polls gpu_a's queue
        ("host-gpu_a", None, True),  # a worker with no host name polls it
    ],
)
def test_a_release_pinned_to_a_host_runs_on_that_hosts_worker_only(queue, own, refused):
    why = wrong_home(queue, own)
    assert (why is not None) == refused
    if refused:
        assert "sent to host 'gpu_a' (queue host-gpu_a)" in why
        assert ("'gpu_b'" in why) == (own == "gpu_b")
