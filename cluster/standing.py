"""A standing kvres cluster: a Ray head that outlives every driver, with kvres's actors on it.

Primitives:
- ``start_standing(namespace="kvres", config=None, port=6379, address=None, ...) ->
  StandingCluster``: start a Ray head on this machine (``ray start --head``, the venv's ``ray``,
  its task-event store bounded: ``ray_task_events``) unless one already answers on ``port`` (or
  attach to ``address`` and never start one), create kvres's detached actors there once
  (``connect``), publish the configuration, disconnect. Nothing stops when this process exits.
- ``stop_standing(address=None, namespace="kvres", keep_blocks=False, stop_ray=False) ->
  StopReport``: ``SessionManager.shutdown`` of the namespace's actors (blocks removed unless
  ``keep_blocks``), then with ``stop_ray`` the Ray head this machine runs at that address;
  ``check_stop_options(keep_blocks, stop_ray)``: the options that cannot go together, refused first.
- ``stop_head(gcs_address, grace_s=15.0) -> list[int]``: stop the processes of the Ray head whose
  GCS listens on that port of this machine (``head_processes(port)``), and only those (``ray stop``
  kills every Ray cluster of the machine); ``descendants(pids)``: those processes and all under them.
- ``check_reachable(address)``: a Ray GCS may answer at HOST:PORT, else ``ClusterUnreachableError``
  within seconds (``ray.init`` takes about a minute to give up).
- ``ray_binary()``: the ``ray`` command of this environment; ``gcs_env(gcs_redis, gcs_storage_path)``:
  the environment of a head with GCS fault tolerance (``start_standing``'s options of that name);
  ``head_environment(extra)``: a started head's environment, this Python's folder first on PATH
  (a Ray job's ``python`` is then the one kvres is installed in). The head's other ports are
  chosen free (``head_ports.choose_head_ports``) and printed.
- ``config_from_option(value) -> KvresConfig``: ``--config``, a JSON object inline or a file.
- ``StandingCluster``, ``StopReport``; errors ``ClusterUnreachableError``, ``HeadStartError``,
  ``HeadNotLocalError``, ``ConfigOptionError`` (all ``KvresError``).

``kvres start`` / ``stop`` speak Ray's token authentication as ``ray start`` does
(``ray_auth.follow_local_token``) and keep the configuration in Ray's GCS (``gcs_config``). Ray,
``session`` and ``cluster_view`` are imported by the functions that use them: kvres's command line
loads this module to build its parser.

The actors are detached, so they outlive the process that created them; they end with the Ray
cluster, which is why an embedded cluster (``connect()`` without an address) loses every session
when its driver exits, and a head started here does not.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvres.policy import KvresError

from .gcs_config import forget_config, publish_config, published_config
from .head_ports import HeadPorts, PortTakenError, bindable, choose_head_ports
from .kvres_config import BackendConfig, KvresConfig, json_object
from .ray_auth import exposed_token_file, follow_local_token, token_auth
from .ray_task_events import ray_start_arguments
from .ray_upkeep import upkeep_environment
from .reachability import DEFAULT_PORT, ClusterUnreachableError, check_reachable, port_open, split_address

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class HeadStartError(KvresError, RuntimeError):
    """``ray start --head`` failed; its own last lines are quoted."""


class HeadNotLocalError(KvresError, RuntimeError):
    """``--ray`` asked to stop a Ray head that does not run on this machine."""


class ConfigOptionError(KvresError, ValueError):
    """``--config`` is neither a JSON object nor a file holding one."""


@dataclass(frozen=True)
class StandingCluster:
    address: str  # the GCS address drivers give connect() or RAY_ADDRESS
    namespace: str
    started_head: bool  # False: a Ray head was already running there
    created_actors: bool  # False: kvres already ran in the namespace
    backends: list[str]
    dashboard_url: str | None
    token_auth: bool  # drivers need RAY_AUTH_MODE=token and the cluster's token
    ports: str | None = None  # the ports a head started here holds (HeadPorts.summary)

    def instructions(self) -> str:
        head = "Ray head started" if self.started_head else "Ray head already running"
        kvres = "kvres actors created" if self.created_actors else "kvres actors already running"
        lines = [
            f"kvres start: {head} at {self.address}; {kvres} in namespace {self.namespace!r} "
            f"(backends: {', '.join(self.backends)})",
        ]
        if self.dashboard_url:
            lines.append(f"dashboard: http://{self.dashboard_url.removeprefix('http://')}")
        if self.ports:
            lines.append(self.ports)
        auth = "RAY_AUTH_MODE=token " if self.token_auth else ""
        if self.dashboard_url:
            lines += [
                "Ray jobs (from the repository's root; a job's `python` is the one kvres runs in):",
                f"  {auth}{_ray_command()} job submit --address http://{self.dashboard_url.removeprefix('http://')} "
                "--working-dir . -- python examples/ray_job.py",
            ]
        lines += [
            "drivers attach with (sessions outlive every driver; the actors end with this Ray cluster):",
            f"  {auth}RAY_ADDRESS={self.address} python your_driver.py   # connect(namespace={self.namespace!r})",
            f"  connect(address={self.address!r}, namespace={self.namespace!r})",
            "  drivers read this configuration from the cluster (connect() without config=); a driver's own",
            "  config= must agree with it (backends of the same names with the same fields)",
        ]
        if self.token_auth:
            lines.append("  token authentication is on: drivers elsewhere need the token (`ray get-auth-token` here)")
            exposed = exposed_token_file()
            if exposed is not None:
                lines.append(f"warning: Ray's token file {exposed} is readable by other users of this machine, "
                             f"who can then drive the cluster: chmod 600 {exposed}")
        lines.append(f"stop: kvres stop --address {self.address} --namespace {self.namespace}   (--ray: the Ray head too)")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"address": self.address, "namespace": self.namespace, "started_head": self.started_head,
                "created_actors": self.created_actors, "backends": self.backends,
                "dashboard_url": self.dashboard_url, "token_auth": self.token_auth, "ports": self.ports}


@dataclass(frozen=True)
class StopReport:
    address: str
    namespace: str
    stopped_actors: bool  # False: no kvres actors ran in the namespace
    kept_blocks: bool
    stopped_pids: list[int] = field(default_factory=list)  # the Ray head's processes, with --ray
    actors: list[str] = field(default_factory=list)  # the kvres actors stopped

    def summary(self) -> str:
        if self.stopped_actors:
            blocks = "cold blocks kept" if self.kept_blocks else "cold blocks removed"
            text = (f"kvres stop: {len(self.actors)} kvres actors in namespace {self.namespace!r} at {self.address} "
                    f"stopped ({', '.join(self.actors)}), {blocks}")
        else:
            text = f"kvres stop: no kvres actors in namespace {self.namespace!r} at {self.address}"
        if self.stopped_pids:
            text += f"; Ray head stopped ({len(self.stopped_pids)} processes)"
        return text


# ---- configuration ----------------------------------------------------------------------------


def config_from_option(value: str) -> KvresConfig:
    """``--config``: a JSON object inline or the path of a file holding one,
    shaped like ``KvresConfig`` (the same as ``KVRES_CONFIG``)."""
    raw, _ = json_object(value, "--config", f"--config {value!r:.200}", ConfigOptionError)
    return KvresConfig.model_validate(raw)


# ---- reaching a cluster -----------------------------------------------------------------------


@contextlib.contextmanager
def _driver(address: str, namespace: str) -> Iterator[Any]:
    """This process as a driver of the cluster at ``address`` ("auto": the one on this machine)
    for the block, disconnected after it; yields ``ray.init``'s context."""
    import ray

    if address != "auto":
        check_reachable(address)
    if ray.is_initialized():
        raise KvresError(
            "this process is already connected to Ray; kvres start / stop connect and disconnect by "
            "themselves: run them in a process of their own"
        )
    follow_local_token()
    try:
        context = ray.init(address=address, namespace=namespace, log_to_driver=False,
                           logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, TimeoutError) as exc:  # no cluster, refused token, versions
        where = "on this machine (give --address or RAY_ADDRESS)" if address == "auto" else f"at {address}"
        raise ClusterUnreachableError(f"could not attach to a Ray cluster {where}: {exc}") from exc
    try:
        yield context
    finally:
        ray.shutdown()  # this driver leaves; detached actors stay with the cluster


# ---- start ------------------------------------------------------------------------------------


def _ray_command() -> str:
    """``ray`` where it is the one on PATH, else its full path (a venv not activated)."""
    found = ray_binary()
    return "ray" if shutil.which("ray") == found else found


def ray_binary() -> str:
    """The ``ray`` of this Python's environment (the venv kvres runs in), else the one on PATH."""
    beside = Path(sys.executable).parent / "ray"
    if beside.is_file():
        return str(beside)
    found = shutil.which("ray")
    if found is None:
        raise HeadStartError(f"no `ray` command beside {sys.executable} nor on PATH (pip install 'ray[default]')")
    return found


def gcs_env(gcs_redis: str | None = None, gcs_storage_path: str | None = None) -> dict[str, str]:
    """The environment of a Ray head whose GCS keeps its tables outside its process (GCS fault
    tolerance): an external Redis at ``gcs_redis`` (HOST:PORT), or Ray's embedded RocksDB in
    ``gcs_storage_path``; empty without either."""
    if gcs_redis and gcs_storage_path:
        raise ConfigOptionError("give --gcs-redis or --gcs-storage, not both")
    if gcs_redis:
        split_address(gcs_redis)  # HOST:PORT, else a ClusterUnreachableError naming it
        return {"RAY_REDIS_ADDRESS": gcs_redis}
    if gcs_storage_path:
        try:
            Path(gcs_storage_path).mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise ConfigOptionError(f"--gcs-storage {gcs_storage_path}: cannot create that folder "
                                    f"({exc.strerror or exc})") from exc
        return {"RAY_gcs_storage": "rocksdb", "RAY_gcs_storage_path": str(Path(gcs_storage_path).resolve())}
    return {}


def head_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment ``ray start --head`` runs in: this one, with the folder of the Python kvres
    runs in first on PATH, so that a Ray job's ``python`` (run by the head) finds kvres, and
    ``ray_upkeep.UPKEEP_ENVIRONMENT`` where it sets none of it."""
    here = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    return upkeep_environment({**os.environ, "PATH": here if not path else f"{here}{os.pathsep}{path}", **(extra or {})})


def _start_head(
    port: int, node_ip_address: str | None, num_cpus: int | None, ports: HeadPorts,
    temp_dir: str | None, ray_args: Sequence[str], timeout_s: float = 300.0, env: dict[str, str] | None = None,
) -> None:
    command = [ray_binary(), "start", "--head", f"--port={port}", "--include-dashboard=true",
               "--disable-usage-stats"]
    optional = {"--node-ip-address": node_ip_address, "--num-cpus": num_cpus, "--temp-dir": temp_dir}
    command += [f"{flag}={value}" for flag, value in optional.items() if value is not None]
    given = {arg.split("=", 1)[0] for arg in ray_args}
    command += [flag for flag in ports.flags() if flag.split("=", 1)[0] not in given]
    command += ray_start_arguments(ray_args)  # Ray's task-event store bounded, under a --system-config given
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False,
                              env=head_environment(env))
    except subprocess.TimeoutExpired as exc:
        raise HeadStartError(f"`ray start --head --port={port}` did not finish within {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        said = _ANSI.sub("", done.stderr + done.stdout)
        tail = [line for line in said.strip().splitlines() if line.strip()]
        raise HeadStartError(
            f"`ray start --head --port={port}` failed (exit {done.returncode}): " + " | ".join(tail[-3:])
            + _gcs_log_tail(said)
        )


def _gcs_log_tail(said: str, lines: int = 4) -> str:
    """The last lines of the GCS's own logs where ``ray start`` points at them: why it exited (a port
    another process took, a storage path it cannot open) is only written there."""
    named = re.search(r"Please check (\S+gcs_server)\.out", said)
    if named is None:
        return ""
    found: dict[str, None] = {}  # the same line is often written to both files
    for suffix in (".err", ".out"):
        with contextlib.suppress(OSError):
            text = Path(named.group(1) + suffix).read_text(errors="replace")
            found.update((line.strip()[:400], None) for line in text.splitlines() if _GCS_ERROR.search(line))
    return "".join(f" | gcs_server: {line}" for line in list(found)[-lines:])


_GCS_ERROR = re.compile(r"^\[[^\]]* [CE] |^E\d{4} |Address already in use")  # Ray's and gRPC's error lines


def _local_host(node_ip_address: str | None) -> str:
    return node_ip_address or "127.0.0.1"


def start_standing(
    namespace: str = "kvres",
    config: KvresConfig | None = None,
    port: int = DEFAULT_PORT,
    address: str | None = None,
    node_ip_address: str | None = None,
    num_cpus: int | None = None,
    dashboard_port: int | None = None,
    temp_dir: str | None = None,
    ray_args: Sequence[str] = (),
    gcs_redis: str | None = None,
    gcs_storage_path: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> StandingCluster:
    """A Ray head on this machine's ``port`` (started unless one answers there), or the cluster at
    ``address`` (never started here), with kvres's actors created in ``namespace``; this process
    disconnects and everything keeps running. If the actors cannot start, a head started by this
    call is stopped again and the error raised. ``gcs_redis`` / ``gcs_storage_path``: the head
    started here keeps its GCS tables in that Redis / RocksDB folder (``gcs_env``), so a head
    restarted with the same one finds every session (docs/operators.md, Failures). The head's other
    ports are chosen free (``head_ports``: another Ray on the machine holds the defaults);
    ``progress`` is told each phase as it starts."""
    import ray

    from kvres.actors.ray_actors.planner_actor import PLANNER_NAME
    from kvres.actors.settings import read_settings

    from .session import connect

    say = progress or (lambda _: None)
    if config is None and read_settings().config:
        config = KvresConfig.from_env()  # KVRES_CONFIG counts as given; else the published one is used
    started = False
    ports: HeadPorts | None = None
    if address is not None:
        target = address
    else:
        host = _local_host(node_ip_address)
        target = f"{host}:{port}"
        if port_open(host, port) is not None:
            if not bindable(host, port, reuse_address=True):  # held without answering: the GCS could not bind it
                raise PortTakenError(f"--port {port}: another process holds that port on this machine "
                                     "(nothing answers there as a Ray head); choose another")
            ports = choose_head_ports(host, dashboard_port, taken=[port])
            say(f"kvres start: starting a Ray head at {target} ({ports.summary()})")
            _start_head(port, node_ip_address, num_cpus, ports, temp_dir, ray_args,
                        env=gcs_env(gcs_redis, gcs_storage_path))
            started = True
    try:
        with _driver(target, namespace) as context:
            gcs_address = str(ray.get_runtime_context().gcs_address)
            existed = PLANNER_NAME in _kvres_actors(namespace)
            shown = config or published_config(namespace) or KvresConfig.from_env()
            say(f"kvres start: {'attaching to' if existed else 'creating'} kvres actors in namespace {namespace!r} "
                f"(backends {', '.join(b.name for b in shown.backends)}: loading their models)")
            manager = connect(address=gcs_address, namespace=namespace, config=config)
            publish_config(namespace, manager.config)
            return StandingCluster(gcs_address, namespace, started, not existed,
                                   _running_backends(namespace) or manager.backends(),
                                   getattr(context, "dashboard_url", None) or None, token_auth(),
                                   None if ports is None else ports.summary())
    except BaseException:
        if started:  # leave nothing running that this call started
            with contextlib.suppress(KvresError):
                stop_head(target)
        raise


# ---- stop -------------------------------------------------------------------------------------


def _kvres_actors(namespace: str) -> list[str]:
    import ray

    return sorted(info["name"] for info in ray.util.list_named_actors(all_namespaces=True)
                  if info["namespace"] == namespace and info["name"].startswith("kvres-"))


def _running_backends(namespace: str) -> list[str]:
    from .cluster_view import BACKEND_PREFIX

    return [n.removeprefix(BACKEND_PREFIX) for n in _kvres_actors(namespace) if n.startswith(BACKEND_PREFIX)]


def check_stop_options(keep_blocks: bool, stop_ray: bool) -> None:
    """``kvres stop``'s options that cannot go together, refused before anything is touched."""
    if keep_blocks and stop_ray:
        raise KvresError(
            "--keep-blocks with --ray: the blocks' secret lives in the Ray cluster and ends with it, so "
            "kept blocks could never be read again; stop kvres without --ray to keep them"
        )


def stop_standing(
    address: str | None = None, namespace: str = "kvres", keep_blocks: bool = False, stop_ray: bool = False,
) -> StopReport:
    """Stop kvres in ``namespace`` as ``SessionManager.shutdown(keep_blocks)`` does (backends
    first, then every block and folder of the namespace's cold stores unless ``keep_blocks``, then
    the stores and the planner); with ``stop_ray`` then the Ray head, which must run on this
    machine. Without kvres actors in the namespace that is an error, unless ``stop_ray``."""
    import ray

    from .cluster_view import ClusterView, NoClusterError
    from .session import SessionManager

    check_stop_options(keep_blocks, stop_ray)
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    with _driver(target, namespace):
        gcs_address = str(ray.get_runtime_context().gcs_address)
        try:
            ClusterView(namespace)  # creates nothing: is kvres there at all?
            found = True
        except NoClusterError:
            if not stop_ray:
                raise
            found = False
        stopped = _kvres_actors(namespace)
        if found:
            # the actors exist, so connect() only finds them (get_if_exists) and hands over
            # SessionManager.shutdown; backend names are all it needs of a configuration, and every
            # running backend is named (one a driver added that the published configuration lacks)
            published = published_config(namespace)
            known = list(published.backends) if published else []
            known += [BackendConfig(name=n) for n in _running_backends(namespace)
                      if n not in {b.name for b in known}]
            config = (published.model_copy(update={"backends": known}) if published
                      else KvresConfig(backends=known or [BackendConfig()]))
            # not connect(): a backend a driver added beside the published configuration disagrees with it
            SessionManager(namespace, config, started_ray=False).shutdown(keep_blocks=keep_blocks)
            forget_config(namespace)
            _wait_gone(namespace)
            _kill_left(namespace)
    pids = stop_head(gcs_address) if stop_ray else []
    return StopReport(gcs_address, namespace, found, keep_blocks, pids, stopped)


def _kill_left(namespace: str) -> None:
    """Whatever kvres actor the shutdown left (none, normally) is killed by name; one that stays
    is an error naming it, never a reported success."""
    import ray

    left = _kvres_actors(namespace)
    for name in left:
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
    if left:
        _wait_gone(namespace)
    still = _kvres_actors(namespace)
    if still:
        raise KvresError(f"kvres stop: actors of namespace {namespace!r} still run after being killed: {still}")


def _wait_gone(namespace: str, timeout_s: float = 30.0) -> None:
    """Until Ray no longer lists the namespace's kvres actors (``ray.kill`` returns at once)."""
    deadline = time.monotonic() + timeout_s
    while _kvres_actors(namespace) and time.monotonic() < deadline:
        time.sleep(0.2)


# ---- the Ray head's processes -----------------------------------------------------------------


def _processes() -> dict[int, tuple[int, str, list[str]]]:
    """pid -> (parent pid, state, argv) of every process this user can read."""
    found: dict[int, tuple[int, str, list[str]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        found[int(entry.name)] = (int(ppid), state, [a for a in argv if a])
    return found


def descendants(roots: set[int], table: dict[int, tuple[int, str, list[str]]] | None = None) -> set[int]:
    """``roots`` and every process under them (``table``: ``_processes()``, read now when None)."""
    table = _processes() if table is None else table
    found = set(roots)
    while True:
        children = {pid for pid, (ppid, _, _) in table.items() if ppid in found} - found
        if not children:
            return found
        found |= children


def _flag(argv: Sequence[str], name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in argv if a.startswith(name + "=")), None)


def head_processes(port: int) -> list[int]:
    """The processes of the Ray head whose GCS listens on ``port`` here: those naming its session
    folder or its GCS address (Ray's own, not a driver's), and all their descendants (workers
    rename themselves)."""
    if not Path("/proc/self").exists():
        raise HeadNotLocalError("finding the Ray head's processes needs /proc (Linux); run `ray stop` on the head")
    table = _processes()
    gcs = [(pid, argv) for pid, (_, state, argv) in table.items()
           if argv and argv[0].endswith("gcs_server") and f"--gcs_server_port={port}" in argv and state != "Z"]
    if not gcs:
        return []
    _, gcs_argv = gcs[0]
    session_dir = _flag(gcs_argv, "--session-dir") or _flag(gcs_argv, "--session_dir")
    gcs_address = f"{_flag(gcs_argv, '--node-ip-address')}:{port}"

    def belongs(argv: list[str]) -> bool:
        if session_dir and any(a == session_dir or session_dir + "/" in a or a.endswith("=" + session_dir)
                               for a in argv):
            return True
        names_gcs = any(a == gcs_address or a.endswith("=" + gcs_address) for a in argv)
        return names_gcs and any("site-packages/ray/" in a or a.startswith("ray.") for a in argv)

    doomed = descendants({pid for pid, (_, _, argv) in table.items() if belongs(argv)}, table)
    mine, pid = set(), os.getpid()
    while pid in table and pid not in mine:  # never this process nor what started it
        mine.add(pid)
        pid = table[pid][0]
    return sorted(doomed - mine)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _terminate(pids: Sequence[int], grace_s: float) -> None:
    """SIGTERM, then SIGKILL what is still running after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not any(_alive(p) for p in pids):
            return


def stop_head(gcs_address: str, grace_s: float = 15.0) -> list[int]:
    """Stop the head's processes (``head_processes``) as ``ray stop`` orders it: the raylet first
    (its agents share its fate), then the rest, the GCS last (the others wait for it while they
    exit); each group gets a third of ``grace_s`` after SIGTERM, then SIGKILL. Returns their pids;
    ``HeadNotLocalError`` when no GCS listens on that port here."""
    _, port = split_address(gcs_address)
    pids = head_processes(port)
    if not pids:
        raise HeadNotLocalError(
            f"no Ray head with its GCS on port {port} runs on this machine; stop the cluster at "
            f"{gcs_address} with `ray stop` on its head node"
        )
    table = _processes()

    def named(suffix: str) -> list[int]:
        return [p for p in pids if p in table and table[p][2] and table[p][2][0].endswith(suffix)]

    raylet, gcs = named("/raylet"), named("/gcs_server")
    for group in (raylet, [p for p in pids if p not in raylet and p not in gcs], gcs):
        _terminate(group, grace_s / 3)
    return pids
