"""A writer of the release record in a process of its own (used by
tests/integration/test_record_postgres.py): two of them race for one router slot, or one
is killed in the middle of its transaction.

    python tests/record_writer.py SLOT RELEASE_ID START_AT HOLD_S

Opens the record (LLM_RELEASE_DATABASE_URL), waits until the Unix time START_AT, then in
one transaction puts a new release in SLOT and logs it in the history, prints ``IN``, holds
the transaction HOLD_S seconds and commits (``COMMITTED <time>``); a refusal prints
``REFUSED <time> <error>`` and exits 3.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime

from llm_release.errors import ReleaseError
from llm_release.record import store
from llm_release.record.schema import HistoryRow, ReleaseRow


def new_release(release_id: str) -> ReleaseRow:
    return ReleaseRow(
        release_id=release_id,
        candidate="fp8",
        scheme="FP8_DYNAMIC",
        repo_id="org/tiny",
        commit="c" * 40,
        model_dir=f"/srv/models/{release_id}",
        public_name="tiny",
        port=8100,
        log_path=f"/srv/logs/{release_id}.log",
        serving={"max_model_len": 2048},
        started_at=datetime.now(UTC).isoformat(),
    )


def main(slot: str, release_id: str, start_at: float, hold_s: float) -> int:
    store.engine()  # migrated and connected before the race starts
    time.sleep(max(0.0, start_at - time.time()))
    try:
        with store.transaction() as session:
            store.take_slot(session, slot, new_release(release_id))
            session.add(
                HistoryRow(
                    at=datetime.now(UTC).isoformat(), event=slot, details={"release": release_id}
                )
            )
            session.flush()
            print("IN", flush=True)
            time.sleep(hold_s)
    except ReleaseError as exc:
        print(f"REFUSED {time.time():.3f} {exc.one_line()}", flush=True)
        return 3
    print(f"COMMITTED {time.time():.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
