"""The Grafana dashboard only asks for metrics gpupool exports, and its queries are valid PromQL."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from gpupool.api import metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpupool.json"


def test_every_panel_queries_a_metric_gpupool_exports() -> None:
    dash = json.loads(DASHBOARD.read_text())
    source = Path(metrics.__file__).read_text()
    exported = set(re.findall(r'"((?:gpupool|DCGM)_[A-Za-z_]+)"', source))
    assert len(dash["panels"]) >= 10
    for panel in dash["panels"]:
        for target in panel["targets"]:
            names = {n.removesuffix("_total") for n in re.findall(r"(?:gpupool|DCGM)_[A-Za-z_]+", target["expr"])}
            assert names and names <= exported, (panel["title"], names - exported)


def test_the_queries_parse_as_promql(tmp_path: Path) -> None:
    # promtool parses expressions inside a rules file: one recording rule per panel query.
    dash = json.loads(DASHBOARD.read_text())
    rules = [{"record": f"gpupool:panel_{p['id']}", "expr": t["expr"]} for p in dash["panels"] for t in p["targets"]]
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
