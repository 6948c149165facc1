"""A driver script: start (or attach to) Ray, open a streaming session, grow it past its budget.

Run: ``.venv/bin/python examples/driver.py [--model PATH]`` (default: the project's own chat model).
It generates 400 tokens past the model's end-of-generation token (``ignore_eos=True``) into a
session that keeps 128 resident: the rest is evicted to the cold store as it goes.
"""

from __future__ import annotations

import argparse
import json

from kvres.cluster import BackendConfig, KvresConfig, SessionPolicy, connect


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--namespace", default="kvres-example")
    args = parser.parse_args()
    config = KvresConfig(backends=[BackendConfig(name="example", model_path=args.model, n_ctx=2048,
                                                 kv_budget_tokens=512, n_threads=1)])
    manager = connect(namespace=args.namespace, config=config, include_dashboard=False)
    try:
        session = manager.open_session(policy=SessionPolicy.streaming(128, recent_tokens=32))
        session.append("Once upon a time")
        tokens = session.generate(400, ignore_eos=True)  # a model's reply ends sooner: go on to 400
        stats = session.stats()
        print(json.dumps({"generated": len(tokens), "resident_tokens": stats["resident_tokens"],
                          "token_count": stats["token_count"], "counters": stats["counters"]}))
        session.close()
    finally:
        manager.shutdown()


if __name__ == "__main__":
    main()
