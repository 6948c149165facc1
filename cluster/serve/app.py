"""The Ray Serve application: an OpenAI-compatible HTTP front on the kvres actors of a namespace.

Primitives:
- ``make_fastapi(service) -> FastAPI``: the routes (``chat_api``, ``responses_api``,
  ``sessions_api``, ``GET /v1/models``, ``/health``, ``/metrics``) behind ``FrontDoor`` (API key,
  metrics).
- ``KvresOpenAI``: the Serve deployment; each replica builds its ``Service`` (a kvres driver of the
  namespace) and its FastAPI app. Replicas hold no session: any replica serves any request.
- ``ServeOptions``: namespace, config (a ``KvresConfig``; None: what the namespace was started
  with), API key digests, ``min_replicas`` / ``max_replicas`` (Serve autoscales between them),
  ``max_ongoing_requests`` per replica, ``num_cpus`` per replica, ``lifetime`` (the sessions'
  idle and TTL defaults, ``lifetime.SessionLifetime``).
- ``build(options) -> Application``: the bound application.
- ``build_app(args) -> Application``: the builder for ``serve run`` / ``serve deploy``
  (``import_path: kvres.cluster.serve.app:build_app``); ``args``: ``namespace``, ``config`` (JSON
  object or file), ``api_key_file``, ``min_replicas``, ``max_replicas``,
  ``max_ongoing_requests``, ``num_cpus``, ``session_idle_s``, ``session_ttl_s`` (0: never). Keys come from ``api_key_file``, else ``KVRES_API_KEYS`` /
  ``KVRES_API_KEY_FILE`` where the application is built.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve import Application
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from ..in_process import hosted_here
from ..kvres_config import KvresConfig
from . import chat_api, responses_api, sessions_api
from .auth import key_digests, load_key_entries
from .http_glue import FrontDoor, answers_errors, service_of
from .lifetime import DEFAULT_IDLE_S, DEFAULT_TTL_S, SessionLifetime, seconds_option
from .service import Service

log = logging.getLogger("kvres.serve")
DEPLOYMENT_NAME = "KvresOpenAI"


def make_fastapi(service: Service) -> FastAPI:
    app = FastAPI(title="kvres", description="OpenAI-compatible API on kvres sessions", docs_url=None,
                  redoc_url=None, openapi_url=None)
    app.state.service = service
    app.include_router(chat_api.router)
    app.include_router(responses_api.router)
    app.include_router(sessions_api.router)

    @app.get("/v1/models")
    @answers_errors
    async def models(request: Request) -> Response:
        catalog = service_of(request).catalog
        return JSONResponse({"object": "list", "data": [m.card() for m in catalog.models]})

    @app.get("/v1/models/{model_id}")
    @answers_errors
    async def model(request: Request, model_id: str) -> Response:
        served, _ = service_of(request).catalog.resolve(model_id)
        return JSONResponse(served.card())

    @app.get("/health")
    @answers_errors
    async def health(request: Request) -> Response:
        svc = service_of(request)
        reachable = await svc.run(svc.reachable)
        ok = all(any(backends.values()) for backends in reachable.values())
        models = {model: {"backends": {name: "ok" if up else "unreachable" for name, up in backends.items()}}
                  for model, backends in reachable.items()}
        front = {"pid": os.getpid(), "in_process": hosted_here()}  # which front answered, and from where
        return JSONResponse({"status": "ok" if ok else "unavailable", "models": models, "front": front},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    @answers_errors
    async def metrics(request: Request) -> Response:
        svc = service_of(request)
        text = await svc.run(svc.state.metrics_text)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    @answers_errors
    async def unknown(request: Request, path: str) -> Response:
        from .http_errors import not_found

        raise not_found(f"no route {request.method} /{path}; see docs/serving.md for the API", code="unknown_route")

    app.add_middleware(FrontDoor)
    return app


@serve.ingress()
class KvresOpenAI:
    def __init__(self, namespace: str, config_json: str | None, digests: tuple[str, ...],
                 lifetime: SessionLifetime | None = None) -> None:
        from ..gcs_config import published_config

        config = KvresConfig.model_validate_json(config_json) if config_json else (
            published_config(namespace) or KvresConfig.from_env())
        self.service = Service(namespace, config, digests, lifetime=lifetime)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return make_fastapi(self.service)


@dataclass(frozen=True)
class ServeOptions:
    namespace: str = "kvres"
    config: KvresConfig | None = None
    digests: tuple[str, ...] = field(default_factory=tuple)
    min_replicas: int = 1
    max_replicas: int = 2
    max_ongoing_requests: int = 64
    num_cpus: float = 0.0
    lifetime: SessionLifetime = field(default_factory=SessionLifetime)

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"replicas must satisfy 1 <= min_replicas <= max_replicas, got "
                             f"{self.min_replicas} and {self.max_replicas}")
        if self.max_ongoing_requests < 1:
            raise ValueError(f"max_ongoing_requests must be >= 1, got {self.max_ongoing_requests}")
        if self.num_cpus < 0:
            raise ValueError(f"num_cpus must be >= 0, got {self.num_cpus}")


def build(options: ServeOptions) -> Application:
    deployment = serve.deployment(
        name=DEPLOYMENT_NAME, max_ongoing_requests=options.max_ongoing_requests,
        autoscaling_config={"min_replicas": options.min_replicas, "max_replicas": options.max_replicas,
                            "target_ongoing_requests": max(1, options.max_ongoing_requests // 2)},
        ray_actor_options={"num_cpus": options.num_cpus}, health_check_period_s=10.0,
    )(KvresOpenAI)
    config_json = options.config.model_dump_json() if options.config is not None else None
    app: Application = deployment.bind(options.namespace, config_json, options.digests, options.lifetime)
    return app


def build_app(args: dict[str, Any]) -> Application:
    from ..standing import config_from_option

    args = dict(args)
    known = {"namespace", "config", "api_key_file", "min_replicas", "max_replicas", "max_ongoing_requests", "num_cpus",
             "session_idle_s", "session_ttl_s"}
    unknown = sorted(set(args) - known)
    if unknown:
        raise ValueError(f"unknown kvres serve arguments {unknown}; known: {sorted(known)}")
    config = config_from_option(str(args["config"])) if args.get("config") else None
    keys = load_key_entries(args.get("api_key_file"))
    if not keys:
        log.warning("kvres serve: no API key configured; make sure Serve's HTTP proxy listens on 127.0.0.1 only "
                    "(http_options.host)")
    return build(ServeOptions(
        namespace=str(args.get("namespace", "kvres")), config=config, digests=key_digests(keys),
        min_replicas=int(args.get("min_replicas", 1)), max_replicas=int(args.get("max_replicas", 2)),
        max_ongoing_requests=int(args.get("max_ongoing_requests", 64)), num_cpus=float(args.get("num_cpus", 0.0)),
        lifetime=SessionLifetime(
            idle_s=seconds_option(str(args["session_idle_s"])) if "session_idle_s" in args else DEFAULT_IDLE_S,
            ttl_s=seconds_option(str(args["session_ttl_s"])) if "session_ttl_s" in args else DEFAULT_TTL_S),
    ))
