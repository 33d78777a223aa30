"""checkov, a standard Kubernetes scanner, over everything the chart renders for every values/ combination and every
ci values file (objects and helm test pods): no finding, and every skip is on its object with a reason.

checkov does not look inside RayJobs (a CRD): tests/test_security.py checks the Ray pods against the Pod Security
Standard instead. checkov's dependencies clash with the main venv's pins, so it lives in its own venv, ``.venv-checkov``
(``make setup-checkov``, part of ``make test``); ``DAPO_CHECKOV`` names another checkov binary.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from dapo.k8s.security import CHECKOV_REASONS
from k8s_support import CHART_DIR, helm_objects, render_script, set_files, user_values

CHECKOV = Path(os.environ.get("DAPO_CHECKOV") or ROOT / ".venv-checkov" / "bin" / "checkov")


def _rendered(out: Path) -> int:
    """Every value set's objects and helm test pods, one file each, as Helm renders them; the object count."""
    sets = [(f"values-{n}", user_values(set_files(n)[0]), set_files(n)[1]) for n in sorted(render_script().RENDER_SETS)]
    sets += [(f"ci-{f.stem}", yaml.safe_load(f.read_text()) or {}, "dapo") for f in sorted((CHART_DIR / "ci").glob("*.yaml"))]
    count = 0
    for name, values, release in sets:
        objects = helm_objects(values, release=release, strip=False) + \
            helm_objects(values, release=release, strip=False, hooks=True)
        (out / f"{name}.yaml").write_text(yaml.safe_dump_all(objects, sort_keys=False))
        count += len(objects)
    return count


def test_checkov_finds_nothing_unexplained_in_what_the_chart_renders(tmp_path):
    if not CHECKOV.exists():
        # make test names it in DAPO_CHECKOV: a missing scanner there is a failure, not a skip
        assert not os.environ.get("DAPO_CHECKOV"), f"DAPO_CHECKOV={CHECKOV} does not exist"
        pytest.skip(f"{CHECKOV} not present: make setup-checkov builds it (make test does)")
    count = _rendered(tmp_path)
    r = subprocess.run([str(CHECKOV), "-d", str(tmp_path), "--framework", "kubernetes", "-o", "json",
                        "--skip-download"], capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 1), r.stderr[-3000:]  # 1: failed checks, reported below
    reports = json.loads(r.stdout)
    (report,) = reports if isinstance(reports, list) else [reports]
    summary, results = report["summary"], report["results"]
    assert summary["parsing_errors"] == 0 and summary["resource_count"] > 0 and summary["passed"] > 0, summary
    failed = [(f["check_id"], f["check_name"], f["resource"]) for f in results.get("failed_checks", [])]
    assert not failed, f"{len(failed)} checkov findings without a fix or a reason: {failed[:20]}"
    for s in results.get("skipped_checks", []):
        reason = s["check_result"].get("suppress_comment")
        assert s["check_id"] in CHECKOV_REASONS and reason == CHECKOV_REASONS[s["check_id"]], (s["resource"], reason)
    # the scan saw the chart's Jobs, Pods and RBAC
    kinds = {f["resource"].split(".")[0] for f in results.get("passed_checks", [])}
    assert {"Job", "Pod", "Role"} <= kinds, kinds
    assert results.get("skipped_checks"), "no skip was read: the annotations are not where checkov looks"
    assert count > 0
