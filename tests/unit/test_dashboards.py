"""The dashboards as code: built with grafana-foundation-sdk, exported as JSON
Grafana loads (uid, datasource variable, panels with Prometheus targets). Their
queries are evaluated on a real Prometheus in tests/e2e/test_across_nodes.py."""

from __future__ import annotations

import json
from pathlib import Path

from cluster.launch.cli import main
from cluster.launch.dashboards import DATASOURCE_UID, build_dashboards, panel_queries


def test_the_dashboards_and_their_panels() -> None:
    built = build_dashboards()
    assert set(built) == {
        "toolserve-overview",
        "toolserve-engine",
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


def test_push_posts_each_dashboard_with_the_token() -> None:
    """Against a stand-in for Grafana's HTTP API that records what it is sent."""
    import http.server
    import threading

    received: list[tuple[str, str, dict[str, object]]] = []

    class Grafana(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append((self.path, self.headers["Authorization"], body))
            answer = json.dumps({"url": f"/d/{body['dashboard']['uid']}"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Grafana)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert main(["dashboards", "push", "--grafana-url", url, "--token", "t0k"]) == 0
    finally:
        server.shutdown()
    assert {path for path, _, _ in received} == {"/api/dashboards/db"}
    assert {auth for _, auth, _ in received} == {"Bearer t0k"}
    assert sorted(body["dashboard"]["uid"] for _, _, body in received) == sorted(  # type: ignore[index]
        build_dashboards()
    )
    assert all(body["overwrite"] is True for _, _, body in received)
