"""The Ray dashboard's Actors tab in headless Chromium, logged in with Ray's token, as a PNG.

Run: ``make dashboard-shot`` (or ``.venv/bin/python scripts/dashboard_screenshot.py``). Installs
Debian's ``chromium`` with apt-get when it is missing, starts a local kvres cluster with Ray's
dashboard (token authentication on, Ray's default) and some traffic, reads the token with
``ray get-auth-token`` as an operator would, logs in through the dashboard's own
``/api/authenticate`` (what its login dialog does), opens ``#/actors`` and saves the page to
``docs/ray_dashboard_actors.png``. It checks that the page lists every kvres actor with the repr it
has, and exits 1 otherwise.

The browser is driven over the Chrome DevTools Protocol (``aiohttp``, which Ray's dashboard already
needs): no browser-automation package, no downloaded browser build.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from live_cluster import REPO, drive, ensure_binary, free_port, start_cluster

WIDTH, HEIGHT = 2200, 780
WAIT_S = 90
PAGE_TEXT = "document.body ? document.body.innerText : ''"


class DevTools:
    """One page of a Chromium started with ``--remote-debugging-port``: ``call(method, **params)``."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            message = await self.ws.receive_json(timeout=60)
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:60]}...: {result['exceptionDetails']}")
        return result["result"].get("value")


async def _page_socket(session: Any, port: int) -> str:
    deadline = time.time() + 30
    while True:
        try:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                pages = [t for t in await response.json() if t.get("type") == "page"]
            if pages:
                return str(pages[0]["webSocketDebuggerUrl"])
        except OSError:
            pass
        if time.time() > deadline:
            raise RuntimeError("Chromium's DevTools endpoint did not come up")
        await asyncio.sleep(0.5)


async def _shoot(port: int, dashboard: str, token: str, actors: dict[str, str], png: Path) -> dict[str, Any]:
    import aiohttp

    async with aiohttp.ClientSession() as session, \
            session.ws_connect(await _page_socket(session, port), max_msg_size=0) as ws:
        page = DevTools(ws)
        await page.call("Page.enable")
        await page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                        deviceScaleFactor=1, mobile=False)
        # a same-origin page that is not the dashboard's app, so the app loads once, logged in
        await page.call("Page.navigate", url=dashboard + "/api/authentication_mode")
        await asyncio.sleep(1)
        status = await page.evaluate(
            f"fetch('/api/authenticate', {{method: 'POST', headers: {{Authorization: 'Bearer ' + "
            f"{json.dumps(token)}}}}}).then(r => r.status)")
        if status != 200:
            raise RuntimeError(f"the dashboard refused the token from `ray get-auth-token`: HTTP {status}")
        await page.call("Page.navigate", url=dashboard + "/#/actors")
        deadline = time.time() + WAIT_S
        while True:
            text = str(await page.evaluate(PAGE_TEXT))
            found = {name: name in text for name in actors}
            if all(found.values()) or time.time() > deadline:
                break
            await asyncio.sleep(1)
        await asyncio.sleep(2)  # let the table settle
        text = str(await page.evaluate(PAGE_TEXT))
        shot = await page.call("Page.captureScreenshot", format="png")
        png.write_bytes(base64.b64decode(shot["data"]))
    return {"names": {n: n in text for n in actors}, "reprs": {n: r in text for n, r in actors.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "ray_dashboard_actors.png")
    args = parser.parse_args(argv)

    import ray
    from ray.util.state import list_actors

    from kvres.cluster.cluster_view import ClusterView

    browser = ensure_binary("chromium", "chromium")
    dash_port, devtools_port = free_port(), free_port()
    dashboard = f"http://127.0.0.1:{dash_port}"
    manager = start_cluster("kvres", free_port(), include_dashboard=True, dashboard_host="127.0.0.1",
                            dashboard_port=dash_port)
    traffic: dict[str, Any] = {"sessions": []}
    try:
        traffic = drive(manager)
        token = subprocess.run([str(Path(sys.executable).parent / "ray"), "get-auth-token"], check=True,
                               capture_output=True, text=True).stdout.strip()
        view = ClusterView(manager.namespace)
        created = {a.name: a.repr_name for a in list_actors(address=dashboard, detail=True)
                   if a.name and a.name.startswith("kvres-") and a.state == "ALIVE"}
        with tempfile.TemporaryDirectory(prefix="kvres-chromium-") as profile:
            chrome = subprocess.Popen(
                [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--hide-scrollbars", "--remote-allow-origins=*", f"--remote-debugging-port={devtools_port}",
                 f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            try:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                seen = asyncio.run(_shoot(devtools_port, dashboard, token, created, args.out))
            finally:
                chrome.terminate()
                chrome.wait(timeout=30)
        live = view.reprs()
    finally:
        for session in traffic["sessions"]:
            session.close()
        manager.shutdown()
    report = {"screenshot": str(args.out.relative_to(REPO)) if args.out.is_relative_to(REPO) else str(args.out),
              "chromium": subprocess.run([browser, "--version"], capture_output=True, text=True).stdout.strip(),
              "ray": ray.__version__, "repr_in_dashboard": created, "repr_now": live, "seen_on_page": seen}
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    for name in sorted(created):
        ok = seen["names"][name] and seen["reprs"][name]
        print(f"{'ok  ' if ok else 'FAIL'} {name}: dashboard Repr {created[name]!r}; now {live.get(name)!r}")
    print(f"screenshot in {args.out}")
    return 0 if created and all(seen["names"].values()) and all(seen["reprs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
