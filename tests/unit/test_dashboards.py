"""The dashboards as code: built with grafana-foundation-sdk, exported as JSON
Grafana loads (uid, datasource variable, panels with Prometheus targets). Their
queries are evaluated on a real Prometheus in tests/e2e/test_two_main_replicas.py."""

from __future__ import annotations

import json
from pathlib import Path

from cluster.launch.cli import main
from cluster.launch.dashboards import DATASOURCE_UID, build_dashboards, panel_queries


def test_the_dashboards_and_their_panels() -> None:
    built = build_dashboards()
    assert set(built) == {
        "toolserve-overview",
        "toolserve-kv",
        "toolserve-tools",
        "toolserve-routing",
    }
    for uid, model in built.items():
        assert model["uid"] == uid
        assert [v["name"] for v in model["templating"]["list"]] == ["datasource"]
        for panel in model["panels"]:
            assert panel["datasource"]["uid"] == DATASOURCE_UID
            assert panel["targets"], panel["title"]
            assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
        assert all(expr.count("(") == expr.count(")") for _, expr in panel_queries(model))
    overview = [title for title, _ in panel_queries(built["toolserve-overview"])]
    assert "Program completion time (JCT)" in overview


def test_export_writes_one_json_file_per_dashboard(tmp_path: Path) -> None:
    assert main(["dashboards", "export", str(tmp_path / "out")]) == 0
    files = sorted((tmp_path / "out").glob("*.json"))
    assert [f.stem for f in files] == sorted(build_dashboards())
    assert json.loads(files[0].read_text())["uid"] == files[0].stem
