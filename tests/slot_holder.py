"""A flow run that holds the host slot for a while, as a serving step does (used by
tests/integration/test_control_room.py in its own process, so it can be killed)."""

import sys
import time

from prefect import flow

from tasks.slots import ensure_host_limit, host_slot


@flow(name="slot-holder")
def hold(tag: str, seconds: float) -> None:
    ensure_host_limit()
    print(f"WAITING {tag} {time.time():.3f}", flush=True)
    with host_slot(tag):
        print(f"TAKEN {tag} {time.time():.3f}", flush=True)
        time.sleep(seconds)
        print(f"FREED {tag} {time.time():.3f}", flush=True)


if __name__ == "__main__":
    hold(sys.argv[1], float(sys.argv[2]))
