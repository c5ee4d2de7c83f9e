"""`toolserve`: the one command-line entry point."""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cluster.config import DEFAULT_CONFIG_PATH, ConfigError, ToolserveConfig, load_config

if TYPE_CHECKING:
    from cluster.launch.node_namespaces import NamespaceCluster


def _log(message: str) -> None:
    print(f"[toolserve] {message}", flush=True)


def _up(args: argparse.Namespace) -> int:
    from cluster.launch.launcher import ClusterStartError, LocalCluster

    config = load_config(args.config)
    if args.port is not None:
        config = config.model_copy(
            update={"server": config.server.model_copy(update={"port": args.port})}
        )
    try:
        with LocalCluster(config, _log) as endpoints:
            _log(
                f"OpenAI API:  {endpoints.api_base}  (model {config.main.engine.served_model_name})"
            )
            _log(f"health:      {endpoints.health_url}")
            _log(f"metrics:     {endpoints.metrics_url}")
            _log(f"redis:       {endpoints.redis_url}")
            if args.demo:
                from cluster.launch.demo import run_demo

                run_demo(endpoints.api_base, config.main.engine.served_model_name, _log)
            if args.exit:
                return 0
            _log("serving; press Ctrl-C to stop")
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        _log("interrupted")
    except ClusterStartError as error:
        _log(f"error: {error}")
        return 1
    return 0


def _nodes(args: argparse.Namespace) -> int:
    from cluster.launch.node_namespaces import (
        REDIS_NAMESPACE,
        NamespaceCluster,
        NamespaceClusterError,
    )
    from cluster.signals import stop_on_signals

    stop_on_signals()
    try:
        cluster = NamespaceCluster(log=_log)
        if args.action == "up":
            return _nodes_up(cluster, args)
        if args.action == "hosts":
            cluster.create_hosts()
        elif args.action == "down":
            cluster.down()
        elif args.action == "kill":
            cluster.kill(args.node)
        elif args.action == "start" and args.node == REDIS_NAMESPACE:
            cluster.start_redis()
        elif args.action == "start":
            cluster.start_node(args.node)
        elif args.action == "partition":
            with cluster.partitioned(args.node):
                time.sleep(args.seconds)
    except NamespaceClusterError as error:
        _log(f"error: {error}")
        return 1
    except KeyboardInterrupt:
        _log("interrupted")
        return 130
    return 0


def _nodes_up(cluster: NamespaceCluster, args: argparse.Namespace) -> int:
    config = load_config(args.config)
    cluster.check_profile(config)
    cluster.up()
    server = cluster.serve(args.config)
    try:
        _log(f"toolserve up on the head node; its log: {cluster.log_path('up')}")
        cluster.wait_until_serving(config, server, config.main.startup_timeout_s)
        if config.ray.daemon_nice > 0:
            niced = cluster.yield_daemons(config.ray.daemon_nice)
            _log(f"nodes: niceness {config.ray.daemon_nice} for " + (", ".join(niced) or "none"))
        _log(f"OpenAI API:  {cluster.api_root(config)}/v1")
        _log(f"Redis:       {config.redis.url}")
        if args.exit:
            return 0
        _log("serving; press Ctrl-C to stop every node")
        while server.poll() is None:
            time.sleep(1)
        _log(f"toolserve up exited ({server.returncode})")
        return 1
    except KeyboardInterrupt:
        _log("interrupted")
        return 0
    finally:
        server.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=60)
        cluster.down()


def _prepare_models(args: argparse.Namespace) -> int:
    from cluster.models import EMBEDDED_SCHEME, SMOLLM2, TINY_RANDOM_LLAMA, resolve_model

    config = load_config(args.config)
    for name in (SMOLLM2, TINY_RANDOM_LLAMA):
        _log(f"{EMBEDDED_SCHEME}{name}: {resolve_model(EMBEDDED_SCHEME + name, config.cache_dir)}")
    return 0


def _check_config(args: argparse.Namespace) -> int:
    for path in args.paths:
        config = load_config(path)
        _log(f"{path}: valid ({config.main.engine.model})")
    return 0


def _tenant_id(_args: argparse.Namespace) -> int:
    from deployments.api.tenants import tenant_of

    for line in sys.stdin:
        key = line.strip()
        if key:
            print(tenant_of(f"Bearer {key}"))
    return 0


def _bench(args: argparse.Namespace) -> int:
    from bench.options import BenchOptions, default_run_name
    from bench.provenance import DirtyTreeError
    from bench.runner import run_benchmark
    from bench.systems import A_A_DEFAULT_SYSTEM, default_systems, expand_system_names
    from bench.workloads import Size
    from cluster.signals import stop_on_signals

    size: Size = "quick" if args.quick else args.size
    if args.systems:
        systems = expand_system_names(args.systems.split(","))
    else:
        systems = [A_A_DEFAULT_SYSTEM] if args.aa else list(default_systems(size))
    options = BenchOptions(
        workload=args.workload,
        size=size,
        systems=systems,
        seed=args.seed,
        repeats=args.repeats,
        config_path=args.config,
        output_dir=args.output,
        run_name=args.name or default_run_name(args.workload, size, args.programs),
        argv=args.argv,
        model=args.model,
        kv_cache_mib=args.kv_cache_mib,
        show_progress=not args.no_progress,
        config_overrides=dict(args.overrides),
        aa=args.aa,
        order_seed=args.order_seed,
        allow_dirty=args.allow_dirty,
        dashboards=args.dashboards,
        programs=args.programs,
        nodes=args.nodes,
    )
    stop_on_signals()
    try:
        run_benchmark(options, _log)
    except KeyboardInterrupt:
        _log("interrupted; the systems that were running have been stopped")
        return 130
    except (ValueError, DirtyTreeError) as error:
        _log(f"error: {error}")
        return 2
    return 0


def _soak(args: argparse.Namespace) -> int:
    from bench.provenance import DirtyTreeError
    from bench.soak import SoakOptions, run_soak
    from cluster.signals import stop_on_signals

    options = SoakOptions(
        minutes=args.minutes,
        programs=args.programs,
        hosted_share=args.hosted_share,
        warm_up_minutes=args.warm_up_minutes,
        sample_interval_s=args.sample_interval_s,
        seed=args.seed,
        config_path=args.config,
        output_dir=args.output,
        run_name=args.name or time.strftime("soak-%Y%m%d-%H%M%S"),
        argv=args.argv,
        allow_dirty=args.allow_dirty,
    )
    stop_on_signals()
    try:
        run_dir = run_soak(options, _log)
    except KeyboardInterrupt:
        _log("interrupted; the cluster has been stopped")
        return 130
    except (ValueError, DirtyTreeError) as error:
        _log(f"error: {error}")
        return 2
    _log(f"soak: report at {run_dir / 'report.md'}")
    return 0


def _node_loss(args: argparse.Namespace) -> int:
    from bench.node_loss import NodeLossOptions, run_node_loss
    from bench.provenance import DirtyTreeError
    from cluster.signals import stop_on_signals

    options = NodeLossOptions(
        programs=args.programs,
        load_minutes=args.minutes,
        lost_node=args.lost_node,
        kill_at_s=args.kill_at_s,
        down_s=args.down_s,
        partition_at_s=args.partition_at_s,
        partition_s=args.partition_s,
        drain_timeout_s=args.drain_timeout_s,
        seed=args.seed,
        config_path=args.config.resolve(),
        output_dir=args.output,
        run_name=args.name or time.strftime("node-loss-%Y%m%d-%H%M%S"),
        argv=args.argv,
        allow_dirty=args.allow_dirty,
    )
    stop_on_signals()
    try:
        run_dir = run_node_loss(options, _log)
    except KeyboardInterrupt:
        _log("interrupted; the nodes have been stopped")
        return 130
    except (ValueError, DirtyTreeError) as error:
        _log(f"error: {error}")
        return 2
    except RuntimeError as error:
        _log(f"error: {error}")
        return 1
    _log(f"node-loss: report at {run_dir / 'report.md'}")
    return 0


def _bench_table(args: argparse.Namespace) -> int:
    from bench.tables import bench_table, by_kind_table, pooled_table, updated_blocks

    if not args.runs and args.update is None:
        _log("error: name the runs, or a page to --update")
        return 2
    try:
        if args.update is not None:
            page = args.update.read_text()
            args.update.write_text(updated_blocks(page, Path(), args.update))
            _log(f"{args.update}: bench-table blocks regenerated")
        elif args.by_kind:
            named = len(args.runs) > 1
            print(
                "\n\n".join(
                    (f"{run}\n\n" if named else "") + by_kind_table(run) for run in args.runs
                )
            )
        elif args.pooled:
            print(pooled_table(args.runs, Path(), args.page), end="")
        else:
            print(bench_table(args.runs, Path(), args.page), end="")
    except (OSError, ValueError) as error:
        _log(f"error: {error}")
        return 2
    return 0


def _sim_profile(args: argparse.Namespace) -> int:
    from bench.runner import raw_profile_config
    from bench.sim.profile import profile_engine
    from bench.systems import engine_settings

    config = ToolserveConfig.model_validate(raw_profile_config(args.config, args.model))
    settings = engine_settings(config, args.kv_cache_mib * 2**20, args.max_model_len)
    profile = profile_engine(settings, args.seed, _log)
    profile.save(args.output)
    _log(
        f"sim profile: {profile.steps} steps fitted, median relative error "
        f"{profile.median_relative_error:.1%} -> {args.output}"
    )
    return 0


def _sim(args: argparse.Namespace) -> int:
    from bench.sim.drafts import DraftRates
    from bench.sim.profile import StepProfile
    from bench.sim.run import simulate_replay, simulated_table
    from bench.sim.systems import CATALOG
    from bench.workloads import plan_workload

    names = [name for name in args.systems.split(",") if name]
    unknown = [name for name in names if name not in CATALOG]
    if unknown:
        _log(f"error: unknown systems {unknown}; simulated: {', '.join(CATALOG)}")
        return 2
    try:
        rates = None
        if args.draft_rates:
            parts = args.draft_rates.split(",")
            if len(parts) != 2:
                raise ValueError("--draft-rates takes MATCH,ACCEPTED, two shares")
            rates = DraftRates.measured(float(parts[0]), float(parts[1]))
        plan = plan_workload(args.workload, args.size, args.programs)
        figures = simulate_replay(
            plan.build(args.seed),
            [CATALOG[name] for name in names],
            args.replicas,
            StepProfile.load(args.profile),
            args.kv_cache_mib or plan.kv_cache_mib,
            rates,
            args.seed,
        )
    except ValueError as error:
        _log(f"error: {error}")
        return 2
    print(simulated_table(figures), end="")
    return 0


def _sim_project(args: argparse.Namespace) -> int:
    from bench.provenance import DirtyTreeError, provenance_line, start_provenance, utc_now
    from bench.sim.profile import StepProfile
    from bench.sim.projection import ProjectionSettings, project, write_projection
    from cluster.config import REPO_ROOT

    try:
        provenance = start_provenance(
            ["toolserve", *sys.argv[1:]], REPO_ROOT, args.output, args.allow_dirty
        )
        settings = ProjectionSettings(
            agents=args.agents,
            arrival_rate_per_s=args.arrival_rate,
            gpus=tuple(int(gpus) for gpus in args.gpus.split(",")),
            gpus_per_replica=args.gpus_per_replica,
            kv_cache_gib=args.kv_cache_gib,
            sweep_gpus=args.sweep_gpus,
            seed=args.seed,
        )
        profile = StepProfile.load(args.profile)
        config = load_config(args.config)
        _log(f"sim-project: {settings.agents} agents on {args.gpus} GPUs, {profile.model}")
        points = project(
            settings, profile, config, args.workers, lambda line: _log(f"sim-project: {line}")
        )
    except (ValueError, DirtyTreeError, ConfigError) as error:
        _log(f"error: {error}")
        return 2
    provenance.finished_utc = utc_now()
    run_dir = args.output / args.name
    intro = (
        f"# Simulated: {settings.agents} agents, {profile.model}\n\n"
        f"Simulated, not measured: `toolserve sim-project` with the step-time profile "
        f"`{args.profile}` ({profile.source}) and the deployment profile `{args.config}`. "
        f"{provenance_line(provenance.as_json())}"
    )
    write_projection(
        run_dir,
        points,
        {
            "provenance": provenance.as_json(),
            "settings": settings.model_dump(),
            "profile": profile.model_dump(),
            "config": str(args.config),
        },
        intro,
    )
    _log(f"sim-project: report at {run_dir / 'report.md'}")
    return 0


def _sim_validate(args: argparse.Namespace) -> int:
    from bench.provenance import DirtyTreeError, provenance_line, start_provenance, utc_now
    from bench.sim.profile import StepProfile
    from bench.sim.validate import simulate_run, validation_report, write_validation
    from cluster.config import REPO_ROOT

    profile = StepProfile.load(args.profile)
    provenance = None
    if args.name is not None:
        try:
            provenance = start_provenance(
                ["toolserve", *sys.argv[1:]], REPO_ROOT, args.output, args.allow_dirty
            )
        except DirtyTreeError as error:
            _log(f"error: {error}")
            return 2
    arms, ratios = [], []
    for run_dir in args.runs:
        try:
            run_arms, run_ratios = simulate_run(run_dir, profile)
        except ValueError as error:
            _log(f"error: {run_dir}: {error}")
            return 2
        arms += run_arms
        ratios += run_ratios
    print(validation_report(arms, ratios), end="")
    if provenance is not None:
        provenance.finished_utc = utc_now()
        run_dir = args.output / args.name
        intro = (
            f"# Simulator validation on recorded runs\n\nSimulated with the step-time "
            f"profile `{args.profile}` ({profile.machine}, {profile.steps} timed steps); "
            f"{provenance_line(provenance.as_json())}"
        )
        header = {"provenance": provenance.as_json(), "profile": profile.model_dump()}
        write_validation(run_dir, arms, ratios, header, intro)
        _log(f"sim-validate: report at {run_dir / 'report.md'}")
    return 0


def _bench_sweep(args: argparse.Namespace) -> int:
    from bench.sweep import (
        SweepError,
        read_sweep_runs,
        sweep_caption,
        sweep_points,
        sweep_table,
        sweep_title,
        write_sweep_plot,
    )

    try:
        runs = read_sweep_runs(args.runs)
        points = sweep_points(runs)
    except SweepError as error:
        _log(f"error: {error}")
        return 2
    caption = sweep_caption(runs)
    print("\n".join([caption, "", *sweep_table(points)]))
    if args.plot is not None:
        write_sweep_plot(points, sweep_title(runs), args.plot)
        _log(f"{args.plot}: written")
    return 0


def _config_reference(args: argparse.Namespace) -> int:
    from cluster.launch.config_reference import REFERENCE_PAGE, config_reference

    if args.stdout:
        print(config_reference(), end="")
        return 0
    REFERENCE_PAGE.write_text(config_reference())
    _log(f"{REFERENCE_PAGE}: written")
    return 0


def _helm_values(args: argparse.Namespace) -> int:
    from cluster.launch.kubernetes import (
        KubernetesProfileError,
        values_file_text,
        values_schema_text,
    )

    if args.schema:
        print(values_schema_text(), end="")
        return 0
    if args.config is None:
        _log("error: --config is required (or --schema)")
        return 2
    try:
        text = values_file_text(load_config(args.config), args.config)
    except KubernetesProfileError as error:
        _log(f"error: {error}")
        return 2
    if args.output is None:
        print(text, end="")
    else:
        args.output.write_text(text)
    return 0


def _render_helm(args: argparse.Namespace) -> int:
    from cluster.launch.kubernetes import (
        KubernetesProfileError,
        chart_values,
        manifests_text,
        render_chart,
    )

    try:
        values = chart_values(load_config(args.config))
    except KubernetesProfileError as error:
        _log(f"error: {error}")
        return 2
    print(manifests_text(render_chart(values, args.release, args.namespace)), end="")
    return 0


def _utc(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _render_dashboards(args: argparse.Namespace) -> int:
    import httpx

    from cluster.launch.dashboard_render import render_dashboards

    end = _utc(args.end) if args.end else datetime.now(UTC)
    start = _utc(args.start) if args.start else end - timedelta(hours=1)
    if start >= end:
        _log("error: --start must come before --end")
        return 2
    try:
        images = render_dashboards(args.prometheus_url, start, end, args.directory, args.step)
    except (httpx.HTTPError, ValueError) as error:
        _log(f"error: querying {args.prometheus_url} failed: {error}")
        return 2
    for image in images:
        print(image)
    return 0


def _run_prometheus(args: argparse.Namespace) -> int:
    from cluster.launch.prometheus import PrometheusServer
    from cluster.signals import stop_on_signals

    server = PrometheusServer(args.directory, args.target, args.scrape_interval, args.port)
    stop_on_signals()
    try:
        server.start()
        print(server.url, flush=True)
        return server.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def _dashboards(args: argparse.Namespace) -> int:
    import httpx

    from cluster.launch.dashboards import export_dashboards, push_dashboards

    if args.action == "export":
        for path in export_dashboards(args.directory):
            print(path)
        return 0
    if args.action == "render":
        return _render_dashboards(args)
    if args.action == "prometheus":
        return _run_prometheus(args)
    try:
        urls = push_dashboards(args.grafana_url, args.token, args.folder_uid)
    except httpx.HTTPError as error:
        _log(f"error: pushing to {args.grafana_url} failed: {type(error).__name__}: {error}")
        return 2
    for url in urls:
        print(url)
    return 0


def _config_override(text: str) -> tuple[str, Any]:
    path, separator, value = text.partition("=")
    if not separator or not path:
        raise argparse.ArgumentTypeError(f"expected PATH=VALUE, got {text!r}")
    try:
        return path, yaml.safe_load(value)
    except yaml.YAMLError as error:
        raise argparse.ArgumentTypeError(f"{path}: value is not YAML: {error}") from error


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolserve", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser("up", help="start the cluster and serve the OpenAI API")
    up.add_argument("--config", type=Path, default=DEFAULT_CONFIG_PATH, help="deployment profile")
    up.add_argument("--port", type=int, help="HTTP port (overrides the profile)")
    up.add_argument("--demo", action="store_true", help="run a 5-turn tool-calling agent")
    up.add_argument("--exit", action="store_true", help="stop once started (and the demo ran)")
    up.set_defaults(run=_up)

    nodes = commands.add_parser(
        "nodes",
        help="several Ray nodes on this machine, each a host of its own (network "
        "namespaces on a private bridge; root only)",
    )
    node_actions = nodes.add_subparsers(dest="action", required=True)
    nodes_up = node_actions.add_parser(
        "up", help="start Redis and the nodes, run a profile on the head; Ctrl-C stops all"
    )
    nodes_up.add_argument("--config", type=Path, default=Path("configs/multinode-cpu.yaml"))
    nodes_up.add_argument("--exit", action="store_true", help="stop every node once serving")
    node_actions.add_parser(
        "hosts",
        help="only the bridge and the nodes' namespaces, nothing started in them (to run "
        "another system on the same hosts: ip netns exec tsn-NODE ...)",
    )
    node_actions.add_parser("down", help="stop every node and remove the namespaces")
    for action, text in (
        ("kill", "kill every process of a node at once (a lost node)"),
        ("start", "start a node's Ray again (a node back)"),
    ):
        node_action = node_actions.add_parser(action, help=text)
        node_action.add_argument("node", help="head, model-a, model-b, tools or redis")
    partition = node_actions.add_parser("partition", help="cut a node off the bridge a while")
    partition.add_argument("node")
    partition.add_argument("--seconds", type=float, default=10)
    nodes.set_defaults(run=_nodes)

    models = commands.add_parser("prepare-models", help="convert the embedded models once")
    models.add_argument("--config", type=Path, default=DEFAULT_CONFIG_PATH)
    models.set_defaults(run=_prepare_models)

    from bench.workloads import SIZES, WORKLOADS

    bench = commands.add_parser(
        "bench", help="measure toolserve against stock vLLM and Ray Serve LLM on agent workloads"
    )
    bench.add_argument("--workload", choices=list(WORKLOADS), default="many-agent")
    bench.add_argument(
        "--systems",
        help="comma-separated systems (default: stock-vllm, stock-ray-serve-llm, "
        "toolserve, and at the default size its ablations); NAME@PATH=VALUE gives one "
        "system settings of its own, e.g. stock-vllm@main.cpu_threads_bind=0; `ladder` "
        "stands for stock-vllm, each rung of toolserve's mechanisms and toolserve",
    )
    bench.add_argument("--size", choices=SIZES, default="default")
    bench.add_argument("--quick", action="store_true", help="same as --size quick")
    bench.add_argument(
        "--programs",
        type=int,
        metavar="N",
        help="trace-replay and many-agent: N programs a round instead of the size's own "
        "count, over the same arrival window, KV budget and max_model_len (a concurrency "
        "sweep's point)",
    )
    bench.add_argument("--seed", type=int, default=0, help="workload seed")
    bench.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="rounds: every system runs once per round, in a seeded random order",
    )
    bench.add_argument(
        "--order-seed", type=int, help="seed of the rounds' run orders (default: --seed)"
    )
    bench.add_argument(
        "--aa",
        action="store_true",
        help="A/A run: the one system of --systems (default stock-vllm) runs twice per "
        "round, so the report shows the interval a null comparison gets on this machine",
    )
    bench.add_argument(
        "--allow-dirty",
        action="store_true",
        help="record from a working tree with uncommitted changes (the report says so)",
    )
    bench.add_argument("--config", type=Path, default=DEFAULT_CONFIG_PATH, help="toolserve profile")
    bench.add_argument(
        "--nodes",
        action="store_true",
        help="every system on the hosts of `toolserve nodes` (root only): toolserve with "
        "`nodes up --config`, the stock router arms with a server per model node and the "
        "router on the head; use a profile for the nodes (configs/multinode-cpu.yaml)",
    )
    bench.add_argument("--model", help="model for every system (default: the profile's)")
    bench.add_argument("--kv-cache-mib", type=int, help="KV budget (default: the workload's)")
    bench.add_argument(
        "--set",
        dest="overrides",
        type=_config_override,
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a profile setting for every system, e.g. main.num_replicas=2 "
        "(VALUE is YAML; repeatable)",
    )
    bench.add_argument("--output", type=Path, default=Path("bench/results"))
    bench.add_argument("--name", help="run name (default: time, workload and size)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bars")
    bench.add_argument(
        "--dashboards",
        action="store_true",
        help="a local Prometheus scrapes each toolserve arm while it runs, and the "
        "dashboards are drawn over each arm's run into <run>/dashboards/ (the "
        "scraping is work the other systems do not get: not for comparisons)",
    )
    bench.set_defaults(run=_bench)

    soak = commands.add_parser(
        "soak",
        help="run toolserve under steady agent load and sample its resources each minute",
    )
    soak.add_argument("--minutes", type=float, default=30, help="how long the load runs")
    soak.add_argument("--programs", type=int, default=32, help="programs running at a time")
    soak.add_argument(
        "--hosted-share",
        type=float,
        default=0.25,
        help="share of the programs whose tools the cluster runs (records tasks and BFCL); "
        "the rest are short many-agent programs whose tools the client runs",
    )
    soak.add_argument(
        "--warm-up-minutes",
        type=float,
        default=8,
        help="minutes before the series are judged for growth",
    )
    soak.add_argument("--sample-interval-s", type=float, default=60)
    soak.add_argument("--seed", type=int, default=0)
    soak.add_argument("--config", type=Path, default=DEFAULT_CONFIG_PATH, help="toolserve profile")
    soak.add_argument("--output", type=Path, default=Path("bench/results"))
    soak.add_argument("--name", help="run name (default: soak and the time)")
    soak.add_argument("--allow-dirty", action="store_true", help="record from a dirty tree")
    soak.set_defaults(run=_soak)

    node_loss = commands.add_parser(
        "node-loss",
        help="agents on `toolserve nodes`: a model node lost mid-run and started again, "
        "Redis cut off a while; count what was started, completed, sent again and failed",
    )
    node_loss.add_argument("--programs", type=int, default=8, help="programs running at a time")
    node_loss.add_argument("--minutes", type=float, default=8, help="how long programs start")
    node_loss.add_argument("--lost-node", default="model-b", help="the worker node to kill")
    node_loss.add_argument("--kill-at-s", type=float, default=90)
    node_loss.add_argument("--down-s", type=float, default=60, help="how long the node stays down")
    node_loss.add_argument("--partition-at-s", type=float, default=360)
    node_loss.add_argument("--partition-s", type=float, default=10)
    node_loss.add_argument(
        "--drain-timeout-s", type=float, default=600, help="how long running programs may finish"
    )
    node_loss.add_argument("--seed", type=int, default=0)
    node_loss.add_argument(
        "--config", type=Path, default=Path("configs/multinode-cpu.yaml"), help="profile"
    )
    node_loss.add_argument("--output", type=Path, default=Path("bench/results"))
    node_loss.add_argument("--name", help="run name (default: node-loss and the time)")
    node_loss.add_argument("--allow-dirty", action="store_true", help="record from a dirty tree")
    node_loss.set_defaults(run=_node_loss)

    table = commands.add_parser(
        "bench-table", help="print the documentation's benchmark tables from recorded runs"
    )
    table.add_argument("runs", nargs="*", type=Path, help="run folders under bench/results")
    table.add_argument(
        "--page",
        type=Path,
        default=Path("README.md"),
        help="the page the table goes on (from the repository's root): links to the runs' "
        "reports are made relative to it (default: README.md)",
    )
    table.add_argument(
        "--update",
        type=Path,
        metavar="PAGE",
        help="regenerate every bench-table block of PAGE in place, its links relative to PAGE",
    )
    table.add_argument(
        "--by-kind",
        action="store_true",
        help="print each run's mean JCT ratio per agent kind, paired by round, "
        "from its records (the report gives it for runs recorded since it does)",
    )
    table.add_argument(
        "--pooled",
        action="store_true",
        help="pool the runs (one workload, size and programs a round, recorded on several "
        "days or machines): each comparison's ratio over all their rounds, beside each "
        "run's own (a page holds it as a bench-pool block)",
    )
    table.set_defaults(run=_bench_table)

    sweep = commands.add_parser(
        "bench-sweep",
        help="set a concurrency sweep's runs (one workload and size at several --programs) "
        "side by side: prefix-cache hit rate, TTFT p50/p99 and mean JCT per system and "
        "concurrency",
    )
    sweep.add_argument("runs", nargs="+", type=Path, help="the sweep's run folders")
    sweep.add_argument(
        "--plot",
        type=Path,
        metavar="PNG",
        help="also draw hit rate, TTFT p99 (log axis) and mean JCT against the programs "
        "a round, a line per system",
    )
    sweep.set_defaults(run=_bench_sweep)

    sim_profile = commands.add_parser(
        "sim-profile",
        help="time the benchmark's vLLM engine step by step on this machine and fit the "
        "simulator's step-time model to it",
    )
    sim_profile.add_argument("--config", type=Path, default=None, help="deployment profile")
    sim_profile.add_argument("--model", default=None, help="another model for the engine")
    sim_profile.add_argument("--kv-cache-mib", type=int, default=1536)
    sim_profile.add_argument("--max-model-len", type=int, default=8192)
    sim_profile.add_argument("--seed", type=int, default=0, help="seed of the prompts' tokens")
    sim_profile.add_argument("--output", type=Path, required=True, metavar="JSON")
    sim_profile.set_defaults(run=_sim_profile)

    sim = commands.add_parser(
        "sim",
        help="simulate a replay workload's programs on each system's replicas (its "
        "policies, the profile's step times) and print mean and p90 JCT, prefix hits, "
        "preemptions and how evenly the replicas worked",
    )
    sim.add_argument("--workload", default="trace-replay", help="a replay workload")
    sim.add_argument("--size", choices=["quick", "default"], default="default")
    sim.add_argument("--programs", type=int, default=None, help="programs instead of the size's")
    sim.add_argument("--replicas", type=int, default=1)
    sim.add_argument("--systems", default="stock-vllm-plain,toolserve")
    sim.add_argument("--kv-cache-mib", type=int, default=None, help="per replica")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument(
        "--profile", type=Path, required=True, metavar="JSON", help="a `sim-profile` output"
    )
    sim.add_argument(
        "--draft-rates",
        default=None,
        metavar="MATCH,ACCEPTED",
        help="n-gram drafts: the share of steps with a proposal and the share of proposed "
        "tokens accepted (as a run's counters give them); none without",
    )
    sim.set_defaults(run=_sim)

    sim_project = commands.add_parser(
        "sim-project",
        help="simulate many agents on GPU clusters of several sizes for stock-like "
        "serving, Continuum's policies and toolserve's; record a report with plots",
    )
    sim_project.add_argument("--config", type=Path, required=True, help="deployment profile")
    sim_project.add_argument(
        "--profile", type=Path, required=True, metavar="JSON", help="a GPU step-time profile"
    )
    sim_project.add_argument("--agents", type=int, default=1000)
    sim_project.add_argument("--arrival-rate", type=float, default=20.0, help="programs a second")
    sim_project.add_argument("--gpus", default="8,16,32,64", help="cluster sizes")
    sim_project.add_argument("--gpus-per-replica", type=int, default=1)
    sim_project.add_argument("--kv-cache-gib", type=float, required=True, help="per replica")
    sim_project.add_argument(
        "--sweep-gpus", type=int, default=None, help="sweep KV, tool latency and arrivals here"
    )
    sim_project.add_argument("--seed", type=int, default=0)
    sim_project.add_argument("--workers", type=int, default=2, help="simulations at a time")
    sim_project.add_argument("--output", type=Path, default=Path("bench/results"))
    sim_project.add_argument("--name", required=True, help="the run's folder name")
    sim_project.add_argument("--allow-dirty", action="store_true")
    sim_project.set_defaults(run=_sim_project)

    sim_validate = commands.add_parser(
        "sim-validate",
        help="simulate recorded runs turn by turn with their arms' policies and set the "
        "simulated mean JCT, prefix hits, preemptions and JCT ratios beside the measured",
    )
    sim_validate.add_argument("runs", nargs="+", type=Path, help="recorded run folders")
    sim_validate.add_argument(
        "--profile", type=Path, required=True, metavar="JSON", help="a `sim-profile` output"
    )
    sim_validate.add_argument("--output", type=Path, default=Path("bench/results"))
    sim_validate.add_argument(
        "--name", default=None, help="record the tables in this folder of --output"
    )
    sim_validate.add_argument("--allow-dirty", action="store_true")
    sim_validate.set_defaults(run=_sim_validate)

    helm_values = commands.add_parser(
        "helm-values", help="write the Helm chart's values for a profile (helm/toolserve)"
    )
    helm_values.add_argument("--config", type=Path, help="deployment profile")
    helm_values.add_argument("--output", type=Path, help="file to write; default: stdout")
    helm_values.add_argument(
        "--schema", action="store_true", help="print the chart's values.schema.json instead"
    )
    helm_values.set_defaults(run=_helm_values)

    render = commands.add_parser(
        "render-helm", help="print the Kubernetes manifests the chart makes for a profile"
    )
    render.add_argument("--config", type=Path, required=True, help="deployment profile")
    render.add_argument("--release", default="toolserve", help="Helm release name")
    render.add_argument("--namespace", default="default", help="Kubernetes namespace")
    render.set_defaults(run=_render_helm)

    dashboards = commands.add_parser("dashboards", help="the Grafana dashboards, as code")
    actions = dashboards.add_subparsers(dest="action", required=True)
    export = actions.add_parser("export", help="write each dashboard's JSON into DIR")
    export.add_argument("directory", type=Path)
    push = actions.add_parser("push", help="load the dashboards into a Grafana")
    push.add_argument("--grafana-url", required=True, help="e.g. http://grafana:3000")
    push.add_argument("--token", required=True, help="a service account token")
    push.add_argument("--folder-uid", help="the folder to put them in; default: General")
    draw = actions.add_parser(
        "render", help="draw each dashboard's panels from a Prometheus into DIR (PNG and JSON)"
    )
    draw.add_argument("directory", type=Path)
    draw.add_argument("--prometheus-url", required=True, help="e.g. http://prometheus:9090")
    draw.add_argument(
        "--start", help="ISO time, UTC unless it says (default: an hour before --end)"
    )
    draw.add_argument("--end", help="ISO time, UTC unless it says (default: now)")
    draw.add_argument("--step", type=float, default=15, help="seconds between points")
    scrape = actions.add_parser(
        "prometheus",
        help="run a local Prometheus (Debian's, installed when missing) in the foreground; "
        "it scrapes the host:port targets listed in DIR/targets.json",
    )
    scrape.add_argument("directory", type=Path, help="its configuration, targets and data")
    scrape.add_argument(
        "--target", action="append", default=[], help="host:port to scrape (repeatable)"
    )
    scrape.add_argument("--port", type=int, help="HTTP port (default: a free one)")
    scrape.add_argument("--scrape-interval", type=float, default=5, help="seconds")
    dashboards.set_defaults(run=_dashboards)

    reference = commands.add_parser(
        "config-reference",
        help="write docs/configuration-reference.md: every field of the profile model "
        "(type, default, description), generated from cluster/config.py",
    )
    reference.add_argument("--stdout", action="store_true", help="print it instead")
    reference.set_defaults(run=_config_reference)

    tenant = commands.add_parser(
        "tenant-id",
        help="print the tenant id of each API key read from stdin (one a line), as "
        "server.quotas.tenants names tenants",
    )
    tenant.set_defaults(run=_tenant_id)

    check = commands.add_parser("check-config", help="validate deployment profiles")
    check.add_argument("paths", nargs="+", type=Path)
    check.set_defaults(run=_check_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    try:
        return int(args.run(args))
    except ConfigError as error:
        _log(f"error: {error}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
