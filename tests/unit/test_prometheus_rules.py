"""docker/prometheus and docker/grafana, checked with promtool (Debian's prometheus package).

Without promtool a laptop run skips these tests; in CI (``CI`` set) they fail instead:
``.ci/run`` installs it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from conventions.ops import exporter as metrics

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "docker" / "prometheus"
DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "celery-conventions.json"
REFERENCE = ROOT / "docs" / "reference" / "metrics.md"


def promtool(*args: str, cwd: Path = PROMETHEUS) -> str:
    found = shutil.which("promtool")
    if found is None:
        from tests.fixtures import tool_unavailable

        tool_unavailable("promtool")
    result = subprocess.run(
        [str(found), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bcelery_conventions_[a-z0-9_]+", expr))


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def test_promtool_accepts_the_alert_rules_and_the_scrape_config() -> None:
    assert "SUCCESS" in promtool("check", "rules", "alerts.yml")
    assert "SUCCESS" in promtool("check", "config", "prometheus.yml")


def test_the_alert_rules_pass_their_promtool_unit_tests() -> None:
    assert "SUCCESS" in promtool("test", "rules", "alerts.test.yml")


def test_every_alert_has_a_test_case_that_expects_it_to_fire() -> None:
    cases = yaml.safe_load((PROMETHEUS / "alerts.test.yml").read_text())["tests"]
    firing = {
        check["alertname"]
        for case in cases
        for check in case["alert_rule_test"]
        if check.get("exp_alerts")
    }
    assert firing == {rule["alert"] for rule in rules()}


def test_the_rules_and_the_dashboard_use_only_metrics_the_exporter_serves() -> None:
    served = metrics.exported_names()
    used = set().union(*(metric_names(rule["expr"]) for rule in rules()))
    used |= set().union(*(metric_names(expr) for expr in dashboard_exprs()))
    assert used and used <= served, used - served


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    recorded = [
        {"record": f"dashboard:query_{n}", "expr": expr.replace("$queue", ".*")}
        for n, expr in enumerate(dashboard_exprs())
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    assert "SUCCESS" in promtool("check", "rules", str(path))


def test_the_metrics_reference_documents_every_metric() -> None:
    text = REFERENCE.read_text()
    missing = {
        name.removesuffix("_bucket")
        for name in metrics.exported_names()
        if not name.endswith(("_sum", "_count")) and name.removesuffix("_bucket") not in text
    }
    assert not missing
