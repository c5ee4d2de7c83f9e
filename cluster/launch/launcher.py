"""Starts and stops a whole toolserve cluster: Ray, Redis, the Serve application."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

import httpx

from cluster.config import ToolserveConfig
from cluster.daemon_priority import yield_background_daemons
from cluster.launch.redis_server import RedisServer, ensure_redis
from cluster.models import resolve_model
from cluster.net import free_port, wait_for_free_port
from cluster.session_priority import SessionNiceness
from cluster.signals import stop_on_signals

Log = Callable[[str], None]

_PORT_WAIT_S = 30.0
_RAY_START_ATTEMPTS = 2
_RAY_START_TIMEOUT = "timed out during startup"


def direct_ingress_environment(api_port: int) -> dict[str, str]:
    """Ray Serve's direct ingress on a local instance: the ingress replica itself
    listens on the API port."""
    return {
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(api_port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(api_port + 1),  # exclusive
        # Serve holds a released port back, and lets a stopping ingress linger, so
        # that an external load balancer can deregister it; there is none here, and
        # a restarted ingress replica must take the API port back at once.
        "RAY_SERVE_PORT_QUARANTINE_S": "0",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
    }


def serve_event_loop_environment(one_loop: bool) -> dict[str, str]:
    """Where a local instance's Serve replicas run handlers and handle routing:
    on the replica's event loop, or on a thread and a loop of their own."""
    separate = "0" if one_loop else "1"
    return {
        "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": separate,
        "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": separate,
    }


class ClusterStartError(RuntimeError):
    """The cluster did not come up."""


@dataclass(frozen=True)
class Endpoints:
    api_base: str
    health_url: str
    metrics_url: str
    redis_url: str


class LocalCluster:
    """Context manager owning every process a `toolserve up` starts."""

    def __init__(self, config: ToolserveConfig, log: Log = print):
        self._config = config
        self._log = log
        self._redis: RedisServer | None = None
        self._ray_started = False
        self._session = SessionNiceness()

    def __enter__(self) -> Endpoints:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Endpoints:
        config = self._config
        started = time.monotonic()
        if config.ray.address is None and self._session.set(config.ray.session_nice):
            self._log(f"session: niceness {config.ray.session_nice} against other sessions")
        self._log("models: preparing")
        main_model = resolve_model(config.main.engine.model, config.cache_dir)
        draft_model = (
            resolve_model(config.draft_replicas.engine.model, config.cache_dir)
            if config.draft_replicas
            else None
        )
        self._log(f"models: main={main_model}" + (f" draft={draft_model}" if draft_model else ""))

        self._redis = ensure_redis(config.redis.url, config.cache_dir / "redis", self._log)

        # Serve gives up on a port its ingress could not bind, for good: a cluster
        # started while an earlier one still holds the port would never serve.
        if config.ray.address is None and not wait_for_free_port(
            config.server.host, config.server.port, _PORT_WAIT_S
        ):
            raise ClusterStartError(
                f"port {config.server.port} on {config.server.host} is in use; "
                "stop what listens there or set server.port"
            )

        import ray
        from ray import serve

        from deployments.app import build_application

        # NOTE: Ray starts workers at niceness 15 by default; the engines are the
        # point of this machine and must not yield the CPU to anything else.
        os.environ.setdefault("RAY_worker_niceness", "0")
        self._log(
            "ray: starting" if config.ray.address is None else f"ray: joining {config.ray.address}"
        )
        if config.ray.address is None:
            os.environ["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] = str(
                config.ray.serve_control_loop_interval_s
            )
            os.environ["RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"] = str(
                round(config.ray.serve_metrics_flush_interval_s * 1000)
            )
            os.environ.update(serve_event_loop_environment(config.ray.serve_one_event_loop))
        direct = direct_ingress_environment(config.server.port)
        if config.server.ingress == "direct":
            os.environ.update(direct)
            # Serve still starts its proxy; nothing is sent to it.
            proxy_port = free_port()
        else:
            for name in direct:  # an earlier cluster of this process may have set it
                os.environ.pop(name, None)
            proxy_port = config.server.port
        for attempt in range(1, _RAY_START_ATTEMPTS + 1):
            try:
                ray.init(
                    # "local": never join whichever Ray instance this machine started last.
                    address=config.ray.address or "local",
                    num_cpus=config.ray.num_cpus if config.ray.address is None else None,
                    include_dashboard=config.ray.include_dashboard,
                    namespace="toolserve",
                    log_to_driver=False,
                    _metrics_export_port=config.ray.metrics_export_port,
                )
                break
            except Exception as error:
                # Ray gives a new local node 30 s to register; on a busy two-core
                # machine (processes of a cluster just stopped still exiting) it
                # sometimes needs longer.
                if attempt == _RAY_START_ATTEMPTS or _RAY_START_TIMEOUT not in str(error):
                    raise
                self._log(f"ray: {error} (attempt {attempt}); starting it again")
                ray.shutdown()
        self._ray_started = True
        stop_on_signals()
        serve.start(
            http_options={
                "host": config.server.host,
                "port": proxy_port,
                "request_timeout_s": config.server.request_timeout_s,
            }
        )
        deployments = ["ingress" if config.main_placement == "own_replicas" else "ingress+main"]
        deployments += ["main-model"] if config.main_placement == "own_replicas" else []
        deployments += ["draft-model"] if config.draft_replicas else []
        deployments += ["tool-workers"] if config.tools.hosted else []
        self._log("serve: deploying " + ", ".join(deployments))
        app = build_application(config, main_model, draft_model, self._redis.url)
        serve.run(
            app,
            name=config.name,
            route_prefix="/",
            blocking=False,
            logging_config={"enable_access_log": config.server.access_log},
        )

        host = "127.0.0.1" if config.server.host in ("0.0.0.0", "::") else config.server.host
        api_root = f"http://{host}:{config.server.port}"
        endpoints = Endpoints(
            api_base=f"{api_root}/v1",
            health_url=f"{api_root}/health",
            metrics_url=f"http://127.0.0.1:{config.ray.metrics_export_port}/metrics",
            redis_url=self._redis.url,
        )
        timeout = max(
            config.main.startup_timeout_s,
            config.draft_replicas.startup_timeout_s if config.draft_replicas else 0,
        )
        wanted = {"main": config.main.num_replicas}
        if config.draft_replicas:
            wanted["draft"] = config.draft_replicas.num_replicas
        self._wait_until_healthy(endpoints.health_url, timeout, wanted)
        if config.ray.address is None and config.ray.daemon_nice > 0:
            niced = yield_background_daemons(
                os.getpid(), config.ray.daemon_nice, idle_proxy=config.server.ingress == "direct"
            )
            self._log(f"ray: niceness {config.ray.daemon_nice} for " + (", ".join(niced) or "none"))
        self._log(f"ready in {time.monotonic() - started:.0f}s")
        return endpoints

    def _wait_until_healthy(
        self, health_url: str, timeout_s: float, wanted_replicas: dict[str, int]
    ) -> None:
        deadline = time.monotonic() + timeout_s
        last_report = ""
        while time.monotonic() < deadline:
            report = _health_summary(health_url, wanted_replicas)
            if report != last_report:
                self._log(f"health: {report}")
                last_report = report
            if report.startswith("ok"):
                return
            if "=failed" in report:
                raise ClusterStartError(f"an engine failed to start: {report}")
            time.sleep(1.0)
        raise ClusterStartError(f"cluster not healthy after {timeout_s:.0f}s: {last_report}")

    def stop(self) -> None:
        if self._ray_started:
            import ray
            from ray import serve

            self._log("shutting down: serve")
            try:
                serve.shutdown()
            finally:
                self._log("shutting down: ray")
                ray.shutdown()
                self._ray_started = False
        if self._redis is not None and self._redis.owned:
            self._log("shutting down: redis-server")
            self._redis.stop()
        self._redis = None
        self._session.restore()


def _health_summary(health_url: str, wanted_replicas: dict[str, int]) -> str:
    """One line on the cluster's state; starts with "ok" once every configured
    replica is ready (or, with Redis down, one replica of each role answers)."""
    try:
        response = httpx.get(health_url, timeout=15)
    except httpx.HTTPError as error:
        return f"waiting for the API ({type(error).__name__})"
    if response.status_code == 404:
        return "waiting for the application"
    try:
        report = response.json()
    except ValueError:
        return f"waiting (HTTP {response.status_code})"
    engines = ", ".join(
        f"{engine.get('role')}={engine.get('state')}" for engine in report.get("engines", [])
    )
    failures = "".join(
        f"\n  {engine.get('role')}: {engine.get('detail')} (see the replica log under "
        "/tmp/ray/session_latest/logs/serve/)"
        for engine in report.get("engines", [])
        if engine.get("state") == "failed"
    )
    ready = report.get("ready_replicas", {})
    redis_up = report.get("components", {}).get("redis", {}).get("status") == "ok"
    all_ready = not redis_up or all(
        ready.get(role, 0) >= count for role, count in wanted_replicas.items()
    )
    status = "ok" if response.status_code == 200 and all_ready else "starting"
    return f"{status} ({engines}; redis={'up' if redis_up else 'down'}){failures}"
