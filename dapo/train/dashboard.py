"""The wandb dashboard of a DAPO run: :data:`PANELS` (what a DAPO run needs on one screen, section by section) and
:func:`workspace`, the saved wandb workspace built from it with W&B's workspace library (``wandb-workspaces``, the
``wandb`` extra); ``dapo wandb dashboard`` (:mod:`dapo.train.dashboard_cli`) saves it.

Every panel plots names of :mod:`dapo.train.metric_names` -- verl's ``fit()`` names, so the same panels read runs of
verl's own trainer (the public "DAPO Reproduction on verl" runs) beside ours. Sections, in the order a run is watched:
validation accuracy (AIME avg@k in the full recipe), reward and accuracy, response length and the overlong / clip
ratios, entropy and mean probability (the paper's Fig. 7), dynamic sampling (kept-group ratio, generation batches),
throughput / MFU / time per step, the rollout-training mismatch, and the policy update.
"""

from __future__ import annotations

from typing import Any, Optional

# section -> [(panel title, metric names; a name ending in ".*" is a regex over the logged names)]. One table.
PANELS: dict[str, list[tuple[str, list[str]]]] = {
    "Validation": [
        ("validation accuracy avg@k (AIME-2024 avg@32 in the full recipe)", ["val-core/.*/acc/mean@.*"]),
        ("validation mean response length", ["val-aux/.*/response_length/mean"]),
    ],
    "Reward and accuracy": [
        ("reward of all generated responses (before filtering)", ["train/gen_score/mean"]),
        ("accuracy of all generated responses", ["train/gen_acc/mean"]),
        ("training-batch score (after dynamic sampling)", ["critic/score/mean"]),
    ],
    "Response length": [
        ("response length (tokens)", ["response_length/mean", "response_length/max"]),
        ("overlong / clipped share", ["train/gen_overlong_ratio", "train/gen_truncated_ratio",
                                      "response_length/clip_ratio"]),
    ],
    "Entropy and probability (paper Fig. 7)": [
        ("policy entropy (Clip-Higher keeps it from collapsing)", ["actor/entropy"]),
        ("mean probability of the sampled tokens", ["actor/mean_prob"]),
    ],
    "Dynamic sampling": [
        ("kept-group ratio (groups with mixed outcomes)", ["train/kept_group_ratio"]),
        ("generation batches per step", ["train/num_gen_batches"]),
    ],
    "Throughput": [
        ("throughput (tokens / s / GPU)", ["perf/throughput"]),
        ("MFU", ["perf/mfu/actor", "perf/mfu/actor_infer"]),
        ("time per step (s)", ["perf/time_per_step", "timing_s/gen", "timing_s/update_actor"]),
    ],
    "Rollout-training mismatch": [
        ("KL(pi_rollout || pi_old) of the sampled tokens", ["rollout_corr/kl", "rollout_corr/k3_kl"]),
        ("chi-squared (token, sequence)", ["rollout_corr/chi2_token", "rollout_corr/chi2_seq"]),
        ("|p_vLLM - p_actor| of the sampled tokens", ["training/rollout_probs_diff_max",
                                                      "training/rollout_probs_diff_mean"]),
    ],
    "Policy update": [
        ("clip fractions (eps_low / eps_high, dual clip)", ["actor/pg_clipfrac", "actor/pg_clipfrac_lower"]),
        ("gradient norm", ["actor/grad_norm"]),
        ("KL between updates", ["actor/ppo_kl"]),
    ],
}


def _line_plot(title: str, names: list[str]) -> Any:
    import wandb_workspaces.reports.v2 as wr

    regex = [n for n in names if n.endswith(".*")]
    if regex:
        return wr.LinePlot(title=title, metric_regex="|".join(f"^{r}$" for r in regex))
    return wr.LinePlot(title=title, y=list(names))


def workspace(entity: str, project: str, name: str = "DAPO run", run_query: Optional[str] = None) -> Any:
    """The saved-view ``wandb_workspaces.workspaces.Workspace`` of :data:`PANELS` for ``entity/project`` (x-axis:
    the rollout step; ``run_query``: only runs whose name matches, e.g. the preset's ``experiment_name``)."""
    try:
        import wandb_workspaces.workspaces as ws
    except ImportError as exc:
        raise SystemExit(f"dapo wandb dashboard needs W&B's workspace library: pip install 'dapo-k8s[wandb]' ({exc})")
    sections = [ws.Section(name=section, is_open=True, panels=[_line_plot(t, names) for t, names in panels])
                for section, panels in PANELS.items()]
    return ws.Workspace(entity=entity, project=project, name=name, sections=sections,
                        settings=ws.WorkspaceSettings(x_axis="Step", max_runs=20),
                        runset_settings=ws.RunsetSettings(query=run_query or ""))


def spec(entity: str, project: str, name: str = "DAPO run", run_query: Optional[str] = None) -> dict[str, Any]:
    """The view :func:`workspace` would save, as the JSON the wandb API receives (built offline)."""
    view = workspace(entity, project, name, run_query)._to_model()
    return view.model_dump(by_alias=True, exclude_none=True, mode="json")
