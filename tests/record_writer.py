"""A writer of the release record in a process of its own (used by
tests/integration/test_record_postgres.py), killed in the middle of its transaction.

    python tests/record_writer.py RELEASE_ID HOLD_S

Writes through the registry's own path (``registry.locked()``: the registry's row locked,
the state read, changed and written by ``record.state.write_state``): RELEASE_ID becomes
the stable release and the history logs it. After the write, before the commit, it prints
``IN`` and holds the transaction HOLD_S seconds, then commits (``COMMITTED``).
"""

from __future__ import annotations

import sys
import time

from llm_release import registry
from llm_release.config import ServingConfig
from llm_release.record import store


def new_release(release_id: str) -> registry.Release:
    return registry.Release(
        release_id=release_id,
        candidate="fp8",
        scheme="FP8_DYNAMIC",
        repo_id="org/tiny",
        commit="c" * 40,
        model_dir=f"/srv/models/{release_id}",
        public_name="tiny",
        port=8100,
        log_path=f"/srv/logs/{release_id}.log",
        serving=ServingConfig(max_model_len=2048),
    )


def main(release_id: str, hold_s: float) -> int:
    store.engine()  # migrated and connected first
    written = registry.write_state

    def write_then_hold(session, state) -> None:
        written(session, state)
        session.flush()  # the rows are in the database's transaction, not yet committed
        print("IN", flush=True)
        time.sleep(hold_s)

    registry.write_state = write_then_hold
    with registry.locked() as state:
        state.stable = new_release(release_id)
        state.log("stable", release=release_id)
    print("COMMITTED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2])))
