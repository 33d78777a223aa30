"""The reference runner (train.runner: reference): the training RayJob runs the upstream DAPO recipe of verl 4f80e46
with the reference scripts' arguments -- compared key by key with the values transcribed from those scripts in
scripts/gen_fidelity.py (the reference data, not our own output) -- as Helm renders it."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import PurePosixPath

import pytest
import yaml

from conftest import ROOT
from dapo.reference import command as reference_command
from dapo.reference import translate as reference
from dapo.config import list_presets, load_preset
from k8s_support import (
    CHART_DIR,
    VALUES_DIR,
    by_key,
    chart,
    helm,
    helm_objects,
    render_script,
    user_values,
)

OverridesParser = pytest.importorskip("hydra.core.override_parser.overrides_parser").OverridesParser


def _gen(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


FIDELITY = _gen("gen_fidelity")  # SCRIPTS, REFERENCE_DEFAULTS, DEVIATIONS: transcribed from the reference scripts
REFERENCE_VALUES = [VALUES_DIR / "reference.yaml"]
# Job env beyond recipe/dapo/runtime_env.yaml's env_vars, and why: the job-level env merges with the driver's own
# ray.init env (main_dapo sets TOKENIZERS_PARALLELISM etc.); the source tree replaces the runtime env's working_dir.
EXTRA_ENV = {"RAY_OVERRIDE_JOB_RUNTIME_ENV": "1", "PYTHONPATH": "/opt/verl"}


def _train_job(preset: str, extra: dict | None = None, release: str = "dapo-ref") -> dict:
    files = [VALUES_DIR / f"{preset}.yaml"] + REFERENCE_VALUES
    objects = helm_objects(user_values(files, extra), release=release, namespace="ml")
    return by_key(objects)[("RayJob", f"{release}-train")]


def _split(entrypoint: str) -> tuple[list[str], dict]:
    """(the command before the recipe's arguments, {key: value} of the arguments parsed by Hydra's own parser)."""
    argv = entrypoint.split(" ")
    assert shlex.split(entrypoint) == argv, "the entrypoint must mean the same with and without a shell"
    i = argv.index(reference.MODULE) + 1
    parsed = OverridesParser.create().parse_overrides(argv[i:])
    keys = [o.key_or_group for o in parsed]
    assert len(keys) == len(set(keys)), f"a key is passed twice: {sorted(k for k in keys if keys.count(k) > 1)}"
    return argv[:i], {o.key_or_group: o.value() for o in parsed}


def _norm(v):
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, list):
        return [_norm(x) for x in v]
    return v


@pytest.mark.parametrize("preset", ["full", "early"])
def test_reference_entrypoint_passes_the_reference_scripts_arguments_key_by_key(preset):
    job = _train_job(preset)
    command, args = _split(job["spec"]["entrypoint"])
    script, ref = FIDELITY.SCRIPTS[preset]
    ref_args = {k: v for k, v in ref.items() if not k.startswith("runtime_env.")}
    # a key the scripts leave at its default is passed only as a documented deviation: retention (the reference
    # keeps every ~400 GB checkpoint and fills any volume) and full's run length (the paper's ~320 rollout steps)
    retention = {"trainer.max_actor_ckpt_to_keep"} & set(FIDELITY.DEVIATIONS)
    assert retention and args["trainer.max_actor_ckpt_to_keep"] == load_preset(preset).recipe.trainer.max_ckpt_to_keep
    if preset == "full":
        assert "trainer.total_training_steps" in FIDELITY.DEVIATIONS and args["trainer.total_training_steps"] == 320
        retention |= {"trainer.total_training_steps"}
    assert set(args) - retention == set(ref_args), (
        f"{script}: missing {sorted(set(ref_args) - set(args))}, not in the script {sorted(set(args) - set(ref_args))}")
    for key, want in ref_args.items():
        got = args[key]
        if key in FIDELITY.DEVIATIONS:  # deployment paths: same file / model / run, on the cluster's volume
            assert isinstance(got, str) and PurePosixPath(got).name == PurePosixPath(want).name, (key, got, want)
            assert got != want
        else:
            assert _norm(got) == _norm(want), f"{key}: {got!r} here, {want!r} in {script}"
    # keys the scripts leave at the commit's defaults: not passed, so the reference's default applies
    assert not (set(args) - retention) & set(FIDELITY.REFERENCE_DEFAULTS)
    # the command: the recipe module under the driver-log wrapper, logs beside the checkpoints on the shared volume
    assert command == ["python3", "-m", "dapo.reference.attempt_log", "--log-dir", args["trainer.default_local_dir"] + "/logs",
                       "--", "python3", "-m", "recipe.dapo.src.main_dapo"]
    assert args["trainer.default_local_dir"].startswith("/shared/")
    # recipe/dapo/runtime_env.yaml (the scripts' --runtime-env)
    env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]
    ref_env = {k.split(".")[-1]: v for k, v in ref.items() if k.startswith("runtime_env.env_vars.")}
    assert env == {**ref_env, **EXTRA_ENV}
    # the reproduction image and its Ray on every pod of the job
    cluster = job["spec"]["rayClusterSpec"]
    pin = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["train"]["reference"]
    image = f"{pin['image']['repository']}:{pin['image']['tag']}"
    assert cluster["rayVersion"] == pin["rayVersion"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    if "submitterPodTemplate" in job["spec"]:  # K8sJobMode only; HTTPMode (the default) has no submitter pod
        pods.append(job["spec"]["submitterPodTemplate"]["spec"])
    assert {c["image"] for p in pods for c in p["containers"] + p.get("initContainers", [])} == {image}
    # the cluster operations of the preset's values apply unchanged: retries, deadline, the shared volume
    train_values = yaml.safe_load((VALUES_DIR / f"{preset}.yaml").read_text())["train"]
    assert job["spec"]["backoffLimit"] == train_values["backoffLimit"]
    assert job["spec"]["activeDeadlineSeconds"] == train_values["activeDeadlineSeconds"]
    for p in pods[:2]:
        assert {"name": "shared", "persistentVolumeClaim": {"claimName": "dapo-ref-shared"}} in p["volumes"]


def test_reference_defaults_agree_with_the_fidelity_transcription():
    """dapo.reference.translate's defaults of 4f80e46 (written only when a preset differs) match the independent
    transcription of dapo_trainer.yaml in scripts/gen_fidelity.py where both have the key."""
    shared = set(reference.REFERENCE_DEFAULTS) & set(FIDELITY.REFERENCE_DEFAULTS)
    assert shared >= {"data.shuffle", "data.seed", "actor_rollout_ref.actor.ppo_epochs", "trainer.total_training_steps"}
    for key in shared:
        assert _norm(reference.REFERENCE_DEFAULTS[key][0]) == _norm(FIDELITY.REFERENCE_DEFAULTS[key]), key


def test_pins_of_the_reference_runner_are_the_reproduction_stack():
    from test_docker import makefile_var, repro_image_tag

    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["train"]["reference"]
    # `make image IMAGE_STACK=repro` builds it; its Ray is the one the reproduction stack pins
    assert values["image"] == {"repository": makefile_var("IMAGE"), "tag": repro_image_tag(), "digest": ""}
    pins = (ROOT / "docker" / "constraints-repro.txt").read_text()
    assert re.search(rf"^ray=={re.escape(values['rayVersion'])}\s", pins, re.M)
    assert re.search(rf"^VERL_COMMIT={reference.REFERENCE_COMMIT}$", (ROOT / "docker" / "repro.args").read_text(), re.M)
    assert reference.REFERENCE_COMMIT == FIDELITY.REFERENCE_COMMIT
    # the Dockerfile keeps the commit's source tree where the job's PYTHONPATH points
    assert "cp -a /src/verl /opt/verl" in (ROOT / "docker" / "Dockerfile").read_text()
    assert values["sourceDir"] == "/opt/verl"


def test_generated_chart_files_are_fresh():
    gen = _gen("gen_reference")
    present = {p.name: p.read_text() for p in (CHART_DIR / "reference").glob("*.yaml")}
    assert present == gen.expected(), "charts/dapo/reference/ is stale: run python scripts/gen_reference.py"


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_key_is_passed_checked_or_explained(name):
    try:
        t = reference.translate(load_preset(name))
    except reference.ReferenceError as exc:
        # only the CPU presets are refused: for their backend, or (verl on CPU) for their accelerator
        p = load_preset(name).placement
        assert (p.backend == "local" and str(exc).startswith("placement.backend:")) or (
            p.accelerator == "cpu" and str(exc).startswith("placement.accelerator:"))
        return
    assert set(reference.leaf_keys()) <= t.handled, sorted(set(reference.leaf_keys()) - t.handled)
    assert {k for k, _, _ in t.not_passed}.isdisjoint({a.source for a in t.args})


@pytest.mark.parametrize(
    "override, key",
    [
        ("recipe.reward.overlong_filter=true", "recipe.reward.overlong_filter:"),
        ("recipe.reward.math_verify=true", "recipe.reward.math_verify:"),
        ("recipe.actor.loss_agg_mode=seq-mean-token-sum-norm", "recipe.actor.loss_agg_mode:"),
        ("recipe.filter_groups.mode=carry", "recipe.filter_groups.mode:"),
        ("recipe.algorithm.norm_adv_by_std=false", "recipe.algorithm.norm_adv_by_std:"),
        ("recipe.model.tokenizer_path=/shared/tok", "recipe.model.tokenizer_path:"),
        ("recipe.trainer.health.stop_on=[entropy_collapse]", "recipe.trainer.health.stop_on:"),
        ("recipe.trainer.experiment_name=two words", "recipe.trainer.experiment_name:"),
        ("recipe.trainer.project_name=$HOME", "recipe.trainer.project_name:"),
    ],
)
def test_values_the_reference_cannot_express_are_refused_naming_the_key(override, key):
    with pytest.raises(reference.ReferenceError, match=re.escape(key)):
        reference.translate(load_preset("full", [override]))


def test_preset_values_off_the_reference_defaults_are_passed_in_4f80e46_names():
    preset = load_preset("full", [
        "recipe.trainer.max_ckpt_to_keep=2", "recipe.trainer.total_training_steps=40", "recipe.data.shuffle=false",
        "recipe.trainer.seed=7", "recipe.actor.optim.betas=[0.9,0.95]", "recipe.model.override_config={rope_theta: 1}",
        "placement.parallel.use_dynamic_bsz=false", "placement.parallel.ppo_micro_batch_size_per_gpu=2",
        "recipe.filter_groups.enable=false", "recipe.data.gen_batch_size=512",
    ])
    texts = reference.translate(preset).texts()
    for arg in ["trainer.max_actor_ckpt_to_keep=2", "trainer.total_training_steps=40", "data.shuffle=false",
                "+data.seed=7", "+actor_rollout_ref.actor.optim.betas=[0.9,0.95]",
                "+actor_rollout_ref.model.override_config.rope_theta=1",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.actor.use_dynamic_bsz=false", "algorithm.filter_groups.enable=false"]:
        assert arg in texts, arg
    assert not any(t.startswith("algorithm.filter_groups.metric=") for t in texts)  # not read without filtering


def test_placement_and_overrides_replace_generated_arguments_in_place():
    extra = {"nodes": 2, "gpusPerNode": 4, "overrides": [
        "trainer.total_training_steps=5", "trainer.default_local_dir=/shared/ckpts/ref-full/", "trainer.save_freq=2",
        "+trainer.log_val_generations=3", "trainer.save_freq=1"]}
    py_job = _train_job("full", extra)
    argv = py_job["spec"]["entrypoint"].split(" ")
    command, args = _split(py_job["spec"]["entrypoint"])
    assert args["trainer.nnodes"] == 2 and args["trainer.n_gpus_per_node"] == 4 and args["trainer.save_freq"] == 1
    assert command[4] == "/shared/ckpts/ref-full/logs"
    assert argv[-1:] == ["+trainer.log_val_generations=3"]  # appended (a key not generated)
    base = reference.translate(load_preset("full")).texts()
    i = base.index("trainer.save_freq=5")
    assert argv[argv.index(reference.MODULE) + 1:][i] == "trainer.save_freq=1"  # in place, the last one wins
    i = base.index("trainer.total_training_steps=320")
    assert argv[argv.index(reference.MODULE) + 1:][i] == "trainer.total_training_steps=5"  # in place
    assert py_job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 2


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"preset": "tiny"}, 'train.runner: preset "tiny" cannot run on the reference recipe: placement.backend:'),
        ({"overrides": ["recipe.trainer.total_training_steps=5"], "storage": {"storageClassName": "rwx-class"}},
         'overrides: "recipe.trainer.total_training_steps=5" is a preset key'),
    ],
)
def test_refusals_name_the_key(extra, message):
    values = user_values(REFERENCE_VALUES, extra)
    with pytest.raises(helm().HelmRenderError, match=re.escape(message)):
        chart().render(values, name="dapo-ref", namespace="ml")


def test_entrypoint_survives_the_submitter_and_job_supervisor_shells(tmp_path):
    """KubeRay's submitter (bash) and Ray's job supervisor (sh) each evaluate the entrypoint; the recipe must see
    exactly the rendered words. A stand-in `python3` records its argv."""
    job = _train_job("full")
    entry = job["spec"]["entrypoint"]
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    # bash -c "<entrypoint as the submitter's script embeds it>" -> ray job submit -- <words> -> sh -c "<joined>"
    inner = subprocess.run(["bash", "-c", f"printf '%s\\n' {entry}"], capture_output=True, text=True, check=True,
                           cwd=tmp_path, env=env).stdout.splitlines()
    out = subprocess.run(["sh", "-c", " ".join(inner)], capture_output=True, text=True, check=True, cwd=tmp_path,
                         env=env).stdout
    assert json.loads(out) == entry.split(" ")[1:]


def test_attempt_log_tees_each_attempt_to_its_own_file_and_returns_the_status(tmp_path):
    logs = tmp_path / "ckpt" / "logs"
    cmd = [sys.executable, "-m", "dapo.reference.attempt_log", "--log-dir", str(logs), "--", sys.executable, "-c",
           "import os, sys; print('out', os.getcwd()); print('err', file=sys.stderr); sys.exit(3)"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.run(cmd, capture_output=True, text=True, env=env)
    second = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert first.returncode == second.returncode == 3
    assert sorted(p.name for p in logs.iterdir()) == ["attempt-1.log", "attempt-2.log"]
    text = (logs / "attempt-2.log").read_text()
    assert f"out {logs}" in text and "err" in text and "attempt 2 exited with status 3" in text
    assert text == second.stdout  # the console gets exactly what the file holds
    missing = subprocess.run([sys.executable, "-m", "dapo.reference.attempt_log", "--log-dir", str(logs), "--",
                              str(tmp_path / "nope")], capture_output=True, text=True, env=env)
    assert missing.returncode == 127 and "cannot start" in (logs / "attempt-3.log").read_text()


def test_packaged_chart_carries_the_generated_files_and_renders_the_same(tmp_path):
    import tarfile

    archive = helm().package(str(CHART_DIR), destination=str(tmp_path))
    with tarfile.open(archive) as tar:
        packaged = sorted(m.name for m in tar.getmembers() if "/reference/" in m.name)
    assert packaged == sorted(f"dapo/reference/{p.name}" for p in (CHART_DIR / "reference").glob("*.yaml"))
    values = user_values([VALUES_DIR / "full.yaml"] + REFERENCE_VALUES)
    assert helm().Chart.load(archive).render(values, name="dapo-ref", namespace="ml") == chart().render(
        values, name="dapo-ref", namespace="ml")


def test_render_py_renders_the_reference_sets():
    assert {"reference-full", "reference-early"} <= set(render_script().RENDER_SETS)
    for name in ("reference-full", "reference-early"):
        files, release = render_script().RENDER_SETS[name]
        assert files[-1] == "reference.yaml" and release == "dapo-ref"


def test_python_m_dapo_reference_prints_the_command_for_running_by_hand(capsys):
    assert reference_command.main(["--preset", "early", "placement.nodes=4", "--notes"]) == 0
    out = capsys.readouterr().out
    lines = [line.strip().rstrip("\\").strip() for line in out.splitlines() if not line.startswith("#")]
    assert lines[0] == "python3 -m recipe.dapo.src.main_dapo"
    assert lines[1:] == reference.translate(load_preset("early", ["placement.nodes=4"])).texts()
    assert "trainer.nnodes=4" in lines and "# not passed: recipe.actor.token_mean_scope='minibatch'" in out
    assert reference_command.main(["--preset", "tiny"]) == 2
    assert "placement.backend:" in capsys.readouterr().err
