"""Grafana dashboards as code (Grafana's own `grafana-foundation-sdk`): overview,
prompts and decoding, KV, tools and routing, over the metrics Ray's agent exports
(toolserve's, vLLM's and Serve's, each with Ray's `ray_` prefix). `toolserve
dashboards export DIR` writes them as JSON; `toolserve dashboards push` loads them
into a Grafana (its HTTP API)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATASOURCE_UID = "${datasource}"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str = ""


def _quantiles(metric: str, by: str = "", window: str = "15m") -> tuple[Query, ...]:
    group = f"le, {by}" if by else "le"
    label = f"{{{{{by}}}}} " if by else ""
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket[{window}])))",
            f"{label}p{int(q * 100)}",
        )
        for q in (0.5, 0.9, 0.99)
    )


def _rate(metric: str, by: str, window: str = "5m", label: str = "") -> Query:
    """The per-second rate of `metric` summed by one label; `label` prefixes the
    legend where a panel shows several such rates."""
    legend = f"{{{{{by}}}}}"
    return Query(
        f"sum by ({by}) (rate({metric}[{window}]))", f"{label} {legend}" if label else legend
    )


def _ratio(numerator: str, denominator: str, legend: str, window: str = "5m") -> Query:
    return Query(f"sum(rate({numerator}[{window}])) / sum(rate({denominator}[{window}]))", legend)


DASHBOARDS: dict[str, tuple[str, tuple[PanelSpec, ...]]] = {
    "toolserve-overview": (
        "toolserve: overview",
        (
            PanelSpec(
                "Requests by route", "reqps", (_rate("ray_toolserve_api_requests_total", "route"),)
            ),
            PanelSpec(
                "Error responses by status",
                "reqps",
                (
                    Query(
                        "sum by (status) "
                        '(rate(ray_toolserve_api_requests_total{status!="200"}[5m]))',
                        "{{status}}",
                    ),
                ),
            ),
            PanelSpec(
                "Program completion time (JCT)",
                "s",
                _quantiles("ray_toolserve_program_completion_s"),
                "First turn's arrival to last turn's end of programs that ended "
                "(last step, DELETE, idleness).",
            ),
            PanelSpec(
                "Turn latency by turn index (p50)",
                "s",
                (
                    Query(
                        "histogram_quantile(0.5, sum by (le, turn) "
                        "(rate(ray_toolserve_turn_latency_s_bucket[15m])))",
                        "turn {{turn}}",
                    ),
                ),
            ),
            PanelSpec(
                "Turns per program (mean)",
                "short",
                (
                    _ratio(
                        "ray_toolserve_program_turns_sum",
                        "ray_toolserve_program_turns_count",
                        "turns",
                        "15m",
                    ),
                ),
            ),
            PanelSpec(
                "Time to first token and queue time (p90)",
                "s",
                (
                    Query(
                        "histogram_quantile(0.9, sum by (le) "
                        "(rate(ray_vllm_time_to_first_token_seconds_bucket[15m])))",
                        "time to first token",
                    ),
                    Query(
                        "histogram_quantile(0.9, sum by (le) "
                        "(rate(ray_vllm_request_queue_time_seconds_bucket[15m])))",
                        "queue time",
                    ),
                ),
            ),
            PanelSpec(
                "Healthy replicas by deployment",
                "short",
                (
                    Query(
                        "sum by (deployment) (ray_serve_deployment_replica_healthy)",
                        "{{deployment}}",
                    ),
                ),
            ),
        ),
    ),
    "toolserve-engine": (
        "toolserve: prompts and decoding",
        (
            PanelSpec(
                "Response cache lookups by result",
                "reqps",
                (_rate("ray_toolserve_response_cache_lookups_total", "result"),),
                "Deterministic chat requests looked up in the response cache; a hit is "
                "answered without the engine.",
            ),
            PanelSpec(
                "Chat front end CPU per prompt by stage",
                "s",
                (
                    Query(
                        "sum by (stage) (rate(ray_toolserve_prompt_cpu_seconds_total[5m])) "
                        "/ sum by (stage) (rate(ray_toolserve_prompts_prepared_total[5m]))",
                        "{{stage}}",
                    ),
                ),
                "CPU time of a replica's chat front end per prompt: rendering the chat "
                "template, tokenizing (through the tokenize cache when it is on).",
            ),
            PanelSpec(
                "Prompt tokens whose ids the tokenize cache held",
                "percentunit",
                (
                    Query(
                        "sum(rate(ray_toolserve_tokenize_cache_tokens_total"
                        '{source="cached"}[5m])) '
                        "/ sum(rate(ray_toolserve_tokenize_cache_tokens_total[5m]))",
                        "cached / all",
                    ),
                ),
                "A turn that extends an earlier prompt tokenizes only what it adds.",
            ),
            PanelSpec(
                "Returning turns by what their prompt did with the held prefix",
                "reqps",
                (_rate("ray_toolserve_prefix_checks_total", "result"),),
                "held: the prompt started with the program's last prompt and reply; "
                "repaired: it parted from them where the client sent the reply back "
                "re-rendered, and the model's own tokens were put back; broken.",
            ),
            PanelSpec(
                "Prefix breaks by cause",
                "reqps",
                (_rate("ray_toolserve_prefix_breaks_total", "cause"),),
                "Why prompts parted from what the engine held for their program: the "
                "reply re-rendered or its arguments re-serialized (repaired), text "
                "trimmed or dropped, system prompt or tools changed, history truncated, "
                "reordered or edited. Every token after the break is computed again.",
            ),
            PanelSpec(
                "Prompt lookup: drafted tokens by region",
                "ops",
                (_rate("ray_toolserve_prompt_lookup_drafted_tokens_total", "region"),),
                "Tokens copied from the prompt as drafts and verified by the main model, "
                "in tool-call text and in prose.",
            ),
            PanelSpec(
                "Prompt lookup: share of drafted tokens accepted by region",
                "percentunit",
                (
                    Query(
                        "sum by (region) "
                        "(rate(ray_toolserve_prompt_lookup_accepted_tokens_total[5m])) "
                        "/ sum by (region) "
                        "(rate(ray_toolserve_prompt_lookup_drafted_tokens_total[5m]))",
                        "{{region}}",
                    ),
                ),
            ),
        ),
    ),
    "toolserve-kv": (
        "toolserve: KV pinning and prefix cache",
        (
            PanelSpec(
                "Pins and pin hits",
                "ops",
                (
                    Query("sum(rate(ray_toolserve_kv_pins_total[5m]))", "pins"),
                    Query("sum(rate(ray_toolserve_kv_pin_hits_total[5m]))", "pin hits"),
                ),
            ),
            PanelSpec(
                "Pin releases by reason",
                "ops",
                (_rate("ray_toolserve_kv_pin_releases_total", "reason"),),
            ),
            PanelSpec(
                "Pinned and free KV blocks",
                "short",
                (
                    Query("sum(ray_toolserve_kv_pinned_blocks)", "pinned"),
                    Query("sum(ray_toolserve_kv_free_blocks)", "free"),
                ),
            ),
            PanelSpec("Pin TTL", "s", _quantiles("ray_toolserve_kv_pin_ttl_s")),
            PanelSpec(
                "Prefix cache hit rate",
                "percentunit",
                (
                    _ratio(
                        "ray_vllm_prefix_cache_hits_total",
                        "ray_vllm_prefix_cache_queries_total",
                        "hits / queries",
                    ),
                ),
            ),
            PanelSpec(
                "Preemptions",
                "ops",
                (Query("sum(rate(ray_vllm_request_num_preemptions_sum[5m]))", "preemptions"),),
            ),
        ),
    ),
    "toolserve-tools": (
        "toolserve: tools",
        (
            PanelSpec(
                "Tool cache hit rate",
                "percentunit",
                (
                    _ratio(
                        "ray_toolserve_tool_cache_hits_total",
                        "ray_toolserve_tool_cache_lookups_total",
                        "hits / lookups",
                    ),
                ),
            ),
            PanelSpec(
                "Tool latency by tool (p50)",
                "s",
                (
                    Query(
                        "histogram_quantile(0.5, sum by (le, tool) "
                        "(rate(ray_toolserve_tool_latency_s_bucket[15m])))",
                        "{{tool}}",
                    ),
                ),
            ),
            PanelSpec(
                "Tool time in a turn by tool (p50)",
                "s",
                (
                    Query(
                        "histogram_quantile(0.5, sum by (le, tool) "
                        "(rate(ray_toolserve_tool_duration_s_bucket[15m])))",
                        "{{tool}}",
                    ),
                ),
            ),
            PanelSpec(
                "Speculations issued and used by source",
                "ops",
                (
                    _rate("ray_toolserve_speculations_issued_total", "source", label="issued"),
                    _rate("ray_toolserve_speculations_used_total", "source", label="used"),
                ),
                "Used: the turn then made the predicted call. Issued less used were wasted.",
            ),
            PanelSpec(
                "Speculation waste per 100 turns",
                "short",
                (
                    Query(
                        "100 * sum(rate(ray_toolserve_speculations_wasted_total[15m])) / "
                        "sum(rate(ray_toolserve_speculation_turns_total[15m]))",
                        "discarded runs",
                    ),
                    Query(
                        "100 * sum(rate(ray_toolserve_speculation_tool_cpu_seconds_total"
                        '{outcome="discarded"}[15m])) / '
                        "sum(rate(ray_toolserve_speculation_turns_total[15m]))",
                        "tool CPU s discarded",
                    ),
                ),
                "Per 100 turns speculated on: speculative runs whose call the turn did "
                "not make, and the tool CPU seconds they took (the draft's tokens are in "
                "`toolserve_speculation_draft_tokens` and each tenant's ledger).",
            ),
            PanelSpec(
                "Predicted calls as drafts: tokens accepted by tool",
                "ops",
                (
                    _rate(
                        "ray_toolserve_predicted_call_drafted_tokens_total", "tool", label="drafted"
                    ),
                    _rate(
                        "ray_toolserve_predicted_call_accepted_tokens_total",
                        "tool",
                        label="accepted",
                    ),
                ),
                "Tokens of a call the engine drafted from the turn's predicted call "
                "while the model wrote it; each accepted one is a decode step saved.",
            ),
            PanelSpec(
                "Tool time saved by origin",
                "s",
                (
                    Query(
                        "sum by (origin) (rate(ray_toolserve_tool_time_saved_s_sum[5m]))",
                        "{{origin}}",
                    ),
                ),
                "Seconds per second of tool time the model's calls did not wait for, "
                "because a speculation (or the client) had produced the result.",
            ),
            PanelSpec(
                "Partial execution: tool time overlapped with decoding (p50)",
                "s",
                (
                    Query(
                        "histogram_quantile(0.5, sum by (le, tool) "
                        "(rate(ray_toolserve_tool_partial_overlap_s_bucket[15m])))",
                        "{{tool}}",
                    ),
                ),
                "Per call run on partial input: tool time spent while the model was "
                "still writing the call.",
            ),
            PanelSpec(
                "Partial runs: started, ended and pieces fed",
                "ops",
                (
                    _rate("ray_toolserve_partial_runs_started_total", "tool", label="started"),
                    _rate("ray_toolserve_partial_runs_ended_total", "ending", label="ended"),
                    _rate("ray_toolserve_partial_pieces_fed_total", "tool", label="pieces"),
                ),
                "finished: the run's outcome answered the call; broken: its pieces could "
                "not be sent and the call ran whole; abandoned: the call changed or "
                "nobody took the outcome.",
            ),
            PanelSpec(
                "Streamed calls stopped by reason",
                "ops",
                (_rate("ray_toolserve_tool_calls_stopped_total", "reason"),),
                "Calls of tools the server answers whose decoding stopped as soon as "
                "they could no longer be valid; the model writes them again.",
            ),
        ),
    ),
    "toolserve-routing": (
        "toolserve: routing",
        (
            PanelSpec(
                "Routed turns by reason",
                "reqps",
                (_rate("ray_toolserve_router_requests_total", "reason"),),
            ),
            PanelSpec(
                "Turns of pinned programs by outcome",
                "reqps",
                (_rate("ray_toolserve_router_pinned_turns_total", "outcome"),),
                "hit: the turn went to the replica holding its program's pin.",
            ),
            PanelSpec(
                "Load imbalance (busiest replica over mean)",
                "short",
                (Query("max(ray_toolserve_router_load_imbalance)", "imbalance"),),
            ),
            PanelSpec(
                "Requests per main-model replica",
                "reqps",
                (
                    Query(
                        "sum by (replica) (rate(ray_serve_deployment_request_counter_total"
                        '{deployment="main-model"}[5m]))',
                        "{{replica}}",
                    ),
                ),
            ),
        ),
    ),
}


def _panel(spec: PanelSpec, index: int) -> Any:
    from grafana_foundation_sdk.builders import prometheus, timeseries
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    panel = (
        timeseries.Panel()
        .title(spec.title)
        .description(spec.description)
        .unit(spec.unit)
        .datasource(DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID))
        .grid_pos(_grid(index))
    )
    for ref, query in zip("ABCDEFGH", spec.queries, strict=False):
        panel = panel.with_target(
            prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(ref)
        )
    return panel


def _grid(index: int) -> Any:
    from grafana_foundation_sdk.models.dashboard import GridPos

    return GridPos(h=8, w=12, x=12 * (index % 2), y=8 * (index // 2))


def build_dashboards() -> dict[str, dict[str, Any]]:
    """Each dashboard's JSON model, by uid."""
    from grafana_foundation_sdk.builders import dashboard
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    built = {}
    for uid, (title, panels) in DASHBOARDS.items():
        board = (
            dashboard.Dashboard(title)
            .uid(uid)
            .tags(["toolserve"])
            .refresh("30s")
            .time("now-1h", "now")
            .with_variable(
                dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
            )
        )
        for index, spec in enumerate(panels):
            board = board.with_panel(_panel(spec, index))
        built[uid] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return built


def panel_queries(model: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (panel title, PromQL expression) of a dashboard's JSON model."""
    return [
        (panel["title"], target["expr"])
        for panel in model.get("panels", [])
        for target in panel.get("targets", [])
    ]


def export_dashboards(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for uid, model in build_dashboards().items():
        path = directory / f"{uid}.json"
        path.write_text(json.dumps(model, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written


def push_dashboards(grafana_url: str, token: str, folder_uid: str | None = None) -> list[str]:
    """Loads (or replaces) each dashboard in a Grafana through its HTTP API
    (`POST /api/dashboards/db`, a service-account token); returns their URLs."""
    import httpx

    base = grafana_url.rstrip("/")
    urls = []
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        for model in build_dashboards().values():
            body: dict[str, Any] = {"dashboard": model, "overwrite": True}
            if folder_uid:
                body["folderUid"] = folder_uid
            answer = client.post(f"{base}/api/dashboards/db", json=body)
            answer.raise_for_status()
            urls.append(f"{base}{answer.json().get('url', '')}")
    return urls
