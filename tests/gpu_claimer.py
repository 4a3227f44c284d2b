"""A GPU claimer in a process of its own (used by tests/integration/test_record_postgres.py):
two of them race for the last free GPU of the record's ledger.

    python tests/gpu_claimer.py HOLDER HOLD_S

Opens the record (LLM_RELEASE_DATABASE_URL), prints ``READY``, waits for a line on stdin,
then claims one GPU of the host [0, 1] for HOLDER, taking HOLD_S seconds over each claim
it finds (the liveness check, made slow so that two claimers would overlap without the
ledger's lock). Prints ``CLAIMED <time> <gpus>``, or ``REFUSED <time> <error>`` and exits 3;
then stays alive (its claim's holder) until stdin closes.
"""

from __future__ import annotations

import sys
import time

from llm_release.config import ServingConfig
from llm_release.errors import ReleaseError
from llm_release.record import store
from llm_release.serving import gpus


def main(holder: str, hold_s: float) -> int:
    store.engine()  # migrated and connected before the race starts
    print("READY", flush=True)
    sys.stdin.readline()

    def slow_alive(claim: gpus.Claim) -> bool:
        time.sleep(hold_s)
        return gpus.claim_alive(claim)

    try:
        chosen = gpus.claim(holder, ServingConfig(), [0, 1], alive=slow_alive)
    except ReleaseError as exc:
        print(f"REFUSED {time.time():.3f} {exc.one_line()}", flush=True)
        code = 3
    else:
        print(f"CLAIMED {time.time():.3f} {chosen}", flush=True)
        code = 0
    sys.stdin.read()  # the holder lives until the test is done looking
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2])))
