"""A Ray job: attach to the running cluster, find or create the kvres actors in namespace
``kvres`` (with the configuration the cluster published), run one session, leave the actors running.

Submit from the repository's root with the line ``kvres start`` prints:
``ray job submit --address http://127.0.0.1:8265 --working-dir . -- python examples/ray_job.py``
(on a cluster kvres has not started yet, ``KVRES_MODEL`` chooses the model; default: the project's own).
"""

from __future__ import annotations

import json
import os

from kvres.cluster import SessionPolicy, connect


def main() -> None:
    manager = connect(address=os.environ.get("RAY_ADDRESS", "auto"))
    session = manager.open_session(policy=SessionPolicy.streaming(96, recent_tokens=32))
    prompt = session.append("Once upon a time there was a little cat. " * 8)  # text, or the model's token ids
    session.generate(64, ignore_eos=True)
    stats = session.stats()
    print("KVRES_JOB_RESULT " + json.dumps({"session": session.session_id, "prompt_tokens": len(prompt),
                                            "resident_tokens": stats["resident_tokens"],
                                            "token_count": stats["token_count"],
                                            "backends": manager.backends()}))
    session.close()


if __name__ == "__main__":
    main()
