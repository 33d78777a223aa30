"""``dapo wandb dashboard``: the saved view it builds (offline, with W&B's own workspace library: no server here).

What only a wandb account can show -- that the server accepts the view and draws the panels -- is not tested here.
"""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("wandb_workspaces")

from dapo.train.dashboard import PANELS  # noqa: E402
from dapo.train.dashboard_cli import main  # noqa: E402
from dapo.train.metric_names import describe  # noqa: E402

# what the issue asks a DAPO run's dashboard to show, each as one metric the view must plot
REQUIRED = {
    "AIME avg@32 over steps": "val-core/aime-2024/acc/mean@32",
    "reward": "train/gen_score/mean",
    "accuracy": "train/gen_acc/mean",
    "response length": "response_length/mean",
    "overlong ratio": "train/gen_overlong_ratio",
    "clip ratio": "response_length/clip_ratio",
    "entropy (Fig. 7)": "actor/entropy",
    "mean probability (Fig. 7)": "actor/mean_prob",
    "kept-group ratio": "train/kept_group_ratio",
    "generation batches": "train/num_gen_batches",
    "throughput": "perf/throughput",
    "MFU": "perf/mfu/actor",
    "time per step": "perf/time_per_step",
    "rollout-training mismatch": "rollout_corr/kl",
}


def _plotted(panel: dict) -> tuple[list[str], str]:
    cfg = panel["config"]
    return cfg.get("metrics", []), cfg.get("metricRegex", "")


def test_the_saved_view_plots_every_panel_a_dapo_run_needs(tmp_path):
    out = tmp_path / "view.json"
    assert main(["dashboard", "--entity", "team", "--project", "DAPO", "--run", "DAPO-Qwen2.5-32B",
                 "--spec-out", str(out)]) == 0  # fmt: skip
    view = json.loads(out.read_text())
    assert (view["entity"], view["project"], view["displayName"]) == ("team", "DAPO", "DAPO run")
    sections = view["spec"]["section"]["panelBankConfig"]["sections"]
    assert [s["name"] for s in sections] == list(PANELS)
    panels = [p for s in sections for p in s["panels"]]
    assert all(p["viewType"] == "Run History Line Plot" and p["config"]["xAxis"] == "_step" for p in panels)
    assert len(panels) == sum(len(v) for v in PANELS.values())
    runset = view["spec"]["section"]["runSets"][0]
    assert runset["search"]["query"] == "DAPO-Qwen2.5-32B"

    def shown(name: str) -> bool:
        for p in panels:
            metrics, regex = _plotted(p)
            if name in metrics or (regex and re.search(regex, name)):
                return True
        return False

    missing = {what: name for what, name in REQUIRED.items() if not shown(name)}
    assert not missing, missing


def test_every_plotted_metric_is_one_the_trainers_log():
    for name in [m for panels in PANELS.values() for _, names in panels for m in names]:
        example = name.replace(".*", "aime-2024", 1).replace("mean@.*", "mean@32")
        assert describe(example), f"{name}: not a metric of dapo.train.metric_names"
