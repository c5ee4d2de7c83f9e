from cluster.launch.dashboard_render import legend_text


def test_legend_takes_the_series_labels_grafana_style() -> None:
    labels = {"tool": "read_file", "origin": "speculation"}
    assert legend_text("{{tool}} {{ origin }}", labels) == "read_file speculation"
    assert legend_text("{{route}} p99", {}) == "p99"
    assert legend_text("hit rate", labels) == "hit rate"
