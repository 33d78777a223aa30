"""What the user still has to supply, refused at render time by the chart (Helm; scripts/render.py prints Helm's
message), all of it at once (the chart's dapo.missingValues): the fabric of a multi-node GPU run, the images
(the chart's unpublished defaults, unless the user says they exist: image.published), a ReadWriteMany class (not the
values files' placeholder), what an evaluation reads, the queue's name -- one line each, naming the key and its fix."""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from k8s_support import VALUES_DIR, chart, refusal, render_script, user_values

# full.yaml runs on 16 nodes: it declares a fabric (the chart refuses it otherwise, before these rules)
FAB = {"fabric": {"expect": "ib"}}
OWN = {"image": {"repository": "registry.example.com/ml/dapo"},
       "eval": {"image": {"repository": "registry.example.com/ml/dapo-eval"}},
       "storage": {"storageClassName": "efs-sc"}, **FAB}
# each missing value of the mission's values files and the value its line's fix sets
FIXES = {"fabric.expect": FAB, "image.repository": {"image": OWN["image"]},
         "storage.storageClassName": {"storage": OWN["storage"]}}
MISSION = ("fabric.expect", "image.repository", "storage.storageClassName")


def refused(files, extra) -> str:
    """The chart's message refusing these user values (the template position left out), without the stand-in."""
    return refusal(files, copy.deepcopy(extra), stand_in=False)


def renders(files, extra) -> None:
    chart().render(user_values(files, copy.deepcopy(extra), stand_in=False), name="dapo", namespace="ml")


def missing(msg: str) -> dict[str, str]:
    """{key: line} of a refusal of missing values; its head counts the lines."""
    head, *lines = msg.split("\n")
    assert head == f"{len(lines)} {'value' if len(lines) == 1 else 'values'} still needed before this installs:", msg
    keys = [re.match(r"- ([\w.]+): ", ln)[1] for ln in lines]
    assert len(set(keys)) == len(keys), msg  # one line per value
    return dict(zip(keys, lines))


def merged(*parts: dict) -> dict:
    out: dict = {}
    for p in parts:
        for k, v in p.items():
            out[k] = {**out.get(k, {}), **v} if isinstance(v, dict) else v
    return out


@pytest.mark.parametrize("name", ["early", "full"])
def test_the_mission_values_as_written_name_fabric_image_and_storage_class_at_once(name):
    lines = missing(refused([VALUES_DIR / f"{name}.yaml"], {}))
    assert tuple(lines) == MISSION
    assert "16 nodes x 8 GPUs, no fabric declared" in lines["fabric.expect"]
    assert "-f values/<cloud>.yaml (eks-p5, gke-a3-mega, gke-a3-high, gke-a3-ultra)" in lines["fabric.expect"]
    assert "--set fabric.expect=ib|" in lines["fabric.expect"]
    assert "ghcr.io/dapo-k8s/dapo:0.1.0-verl0.9.1 was never published" in lines["image.repository"]
    assert "make images REGISTRY=<registry>" in lines["image.repository"]
    assert "--set image.repository=<registry>/dapo (or image.published=true" in lines["image.repository"]
    assert lines["storage.storageClassName"].startswith(
        '- storage.storageClassName: "shared-rwx" is the values files\' placeholder: --set '
        "storage.storageClassName=<your ReadWriteMany class> (kubectl get storageclass")
    # readable lines, not the paragraphs each refusal used to be
    assert all(len(ln) <= 240 for ln in lines.values()), lines


@pytest.mark.parametrize("name", ["early", "full"])
def test_the_listed_fixes_applied_together_make_it_render(name):
    files = [VALUES_DIR / f"{name}.yaml"]
    renders(files, merged(*(FIXES[k] for k in missing(refused(files, {})))))


@pytest.mark.parametrize("fixed", MISSION)
def test_fixing_one_value_removes_exactly_its_line(fixed):
    files = [VALUES_DIR / "full.yaml"]
    before = missing(refused(files, {}))
    after = missing(refused(files, FIXES[fixed]))
    assert after == {k: ln for k, ln in before.items() if k != fixed}


def test_a_cloud_file_declares_the_fabric_and_leaves_the_images_and_the_class():
    lines = missing(refused([VALUES_DIR / "early.yaml", VALUES_DIR / "eks-p5.yaml"], {}))
    assert tuple(lines) == ("image.repository", "storage.storageClassName")
    assert "ghcr.io/dapo-k8s/dapo:0.1.0-verl0.9.1-efa was never published" in lines["image.repository"]
    assert "make images REGISTRY=<registry> EFA=1 (docs/images.md)" in lines["image.repository"]  # its EFA variant
    assert "EFA_TAG_SUFFIX := -efa\n" in (ROOT / "Makefile").read_text()  # the tag suffix `make images EFA=1` builds


def test_the_unpublished_default_image_is_refused_naming_the_build_command_and_the_values():
    full = [VALUES_DIR / "full.yaml"]
    lines = missing(refused(full, {"storage": {"storageClassName": "efs-sc"}, **FAB}))
    assert list(lines) == ["image.repository"]
    for needle in ("make images REGISTRY=<registry>", "docs/images.md", "--set image.repository=<registry>/dapo",
                   "image.published=true"):
        assert needle in lines["image.repository"]
    # the user's own registry, or the statement that the default images exist
    renders(full, OWN)
    renders(full, {"storage": {"storageClassName": "efs-sc"}, "image": {"published": True}, **FAB})


def test_each_image_the_release_runs_is_checked():
    full, ev, ref = VALUES_DIR / "full.yaml", VALUES_DIR / "eval.yaml", VALUES_DIR / "reference.yaml"
    own_train = {"image": OWN["image"], "storage": OWN["storage"], **FAB}
    lines = missing(refused([full, ev], own_train))
    assert lines["eval.image.repository"].startswith(
        "- eval.image.repository: ghcr.io/dapo-k8s/dapo-eval:0.1.0-ray2.60.0 was never published")
    assert "--set eval.image.repository=<registry>/dapo-eval (" in lines["eval.image.repository"]
    renders([full, ev], OWN)
    line = missing(refused([full, ref], own_train))["train.reference.image.repository"]
    assert "ghcr.io/dapo-k8s/dapo:0.1.0-repro-verl4f80e46 was never published" in line
    assert "make image IMAGE_STACK=repro IMAGE=<registry>/dapo IMAGE_PUSH=1" in line
    renders([full, ref], {**OWN, "train": {"reference": {"image": {"repository": "registry.example.com/r"}}}})
    # a follower image of the user's choice at the default name
    logs = {**OWN, "logs": {"image": {"repository": "ghcr.io/dapo-k8s/dapo", "tag": "x"}}}
    assert list(missing(refused([full], logs))) == ["logs.image.repository"]


def test_verl_on_cpu_names_the_image_once():
    """The CUDA default image on a CPU preset: one line for image.repository (vLLM's CPU build), not two."""
    lines = missing(refused([], {"preset": "verl-tiny"}))
    assert list(lines) == ["image.repository"] and "runs verl on CPU" in lines["image.repository"]


def test_the_placeholder_storage_class_of_the_values_files_is_refused():
    full = [VALUES_DIR / "full.yaml"]
    lines = missing(refused(full, {"image": OWN["image"], **FAB}))  # full.yaml carries shared-rwx
    assert list(lines) == ["storage.storageClassName"]
    # an existing claim does not use the class
    renders(full, {"image": OWN["image"], "storage": {"existingClaim": "dapo-shared"}, **FAB})


def test_the_queue_and_the_evaluation_inputs_are_listed_with_the_rest():
    lines = missing(refused([VALUES_DIR / "full.yaml"], {"queue": {"scheduler": "kai"}}))
    assert tuple(lines) == (*MISSION, "queue.name")
    assert lines["queue.name"] == '- queue.name: required with queue.scheduler "kai": --set queue.name=<queue>'


def test_a_contradiction_is_refused_on_its_own_before_the_list():
    for extra, key in (({"fabric": {"check": False}}, 'fabric.check: preset "full" runs on 16 nodes x 8 GPUs'),
                       ({"securityContext": {"runAsUser": 0}}, "securityContext.runAsUser: 0 under")):
        msg = refused([VALUES_DIR / "full.yaml"], extra)
        assert msg.startswith(key) and "\n" not in msg


def run_render(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/render.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args", [("--preset", "early"), ("-f", "values/full.yaml")])
def test_render_py_as_written_names_everything_missing_in_one_message(args):
    out = run_render(*args)
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.startswith("render.py: 3 values still needed before this installs:\n")
    assert tuple(missing(out.stderr.removeprefix("render.py: ").rstrip("\n"))) == MISSION
    # the fixes the lines name, all at once: it renders
    fixed = run_render(*args, "--set", "fabric.expect=ib", "--set", "image.repository=registry.example.com/ml/dapo",
                       "--set", "storage.storageClassName=efs-sc")
    assert fixed.returncode == 0 and "kind: RayJob" in fixed.stdout, fixed.stderr


def test_render_py_refuses_the_default_images_on_the_command_line(capsys):
    assert render_script().main(["--preset", "smoke", "--set", "storage.storageClassName=efs-sc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("render.py: 1 value still needed before this installs:\n- image.repository: "
                          "ghcr.io/dapo-k8s/dapo:") and "make images" in err
    assert render_script().main(["--preset", "smoke", "--set", "storage.storageClassName=efs-sc", "--set",
                                 "image.repository=registry.example.com/ml/dapo"]) == 0
