"""Images by digest: a digest value pins every pod of the run to `<repository>@sha256:...`,
NOTES says when a run is pinned by tag only, checkov's digest finding is skipped only where the image has no digest,
and the committed examples pull from a registry name that cannot resolve. (`make images` recording the digests it
pushes and printing their --set: tests/test_docker.py.)"""

from __future__ import annotations

import pytest
import yaml

from conftest import ROOT
from k8s_support import RWX, objects_by_key, helm_notes, helm_objects, pod_templates, render_script

TRAIN = "sha256:" + "1" * 64
EVAL = "sha256:" + "2" * 64
REPRO = "sha256:" + "3" * 64
REGISTRY = "reg.example.com/ml"


def images(objects) -> dict[str, set[str]]:
    """{object: the images of its containers}, RayJob pod templates (submitter included) and init containers too."""
    out = {}
    for o in objects:
        if o["kind"] == "RayJob":
            specs = [t["spec"] for _, t in pod_templates(o)]
        elif o["kind"] in ("Job", "Pod"):
            specs = [o["spec"]["template"]["spec"] if o["kind"] == "Job" else o["spec"]]
        else:
            continue
        # the values' sidecars (a cloud's fabric daemons) are the vendor's images, not ours
        out[f"{o['kind']} {o['metadata']['name']}"] = {
            c["image"] for s in specs for c in s.get("initContainers", []) + s.get("containers", [])
            if c["image"].startswith(REGISTRY)}
    return out


def _pinned_values(**extra):
    return {**RWX, "image": {"repository": f"{REGISTRY}/dapo", "digest": TRAIN},
            "eval": {"enabled": True, "submissionMode": "K8sJobMode",
                     "image": {"repository": f"{REGISTRY}/dapo-eval", "digest": EVAL}},
            "train": {"submissionMode": "K8sJobMode"}, **extra}


def test_a_digest_pins_every_pod_of_the_run_to_the_pushed_image():
    values = _pinned_values()
    h = objects_by_key(values)
    found = images(list(h.values()) + helm_objects(values, hooks=True))
    assert found["RayJob dapo-train"] == found["Job dapo-train-logs"] == found["Job dapo-preflight"] == \
        found["Pod dapo-test-gpu"] == found["Pod dapo-test-shared"] == {f"{REGISTRY}/dapo@{TRAIN}"}
    assert found["RayJob dapo-eval"] == found["Job dapo-eval-logs"] == {f"{REGISTRY}/dapo-eval@{EVAL}"}
    notes = helm_notes(values)
    assert "pinned by tag only" not in notes
    # checkov's "image should use digest" (CKV_K8S_43) is skipped nowhere: it passes
    for o in list(h.values()) + helm_objects(values, hooks=True):
        assert "CKV_K8S_43" not in str((o["metadata"].get("annotations") or {})), o["metadata"]["name"]


def test_a_run_pinned_by_tag_only_renders_tags_and_notes_says_so():
    values = {**RWX, "image": {"repository": f"{REGISTRY}/dapo"}, "eval": {"enabled": True}}
    h = objects_by_key(values)
    found = images(h.values())
    assert found["RayJob dapo-train"] == {f"{REGISTRY}/dapo:0.1.0-verl0.9.1"}
    notes = " ".join(helm_notes(values).split())
    assert (f"Images pinned by tag only: {REGISTRY}/dapo:0.1.0-verl0.9.1, ghcr.io/dapo-k8s/dapo-eval:0.1.0-ray2.60.0. "
            "A tag can be pushed again, and with imagePullPolicy IfNotPresent each node keeps the first image it "
            "pulled under it") in notes
    skips = h[("Job", "dapo-train-logs")]["metadata"]["annotations"]
    assert any(v.startswith("CKV_K8S_43=the image is pinned by tag only") for v in skips.values())


def test_the_reference_image_the_followers_and_the_evaluation_fall_back_as_their_tags_do():
    values = {**RWX, "train": {"runner": "reference", "reference": {"image": {
        "repository": f"{REGISTRY}/dapo", "digest": REPRO}}}, "rayAuth": {"enabled": False},
        "image": {"repository": f"{REGISTRY}/dapo", "digest": TRAIN}}
    h = objects_by_key(values)
    found = images(h.values())
    assert found["RayJob dapo-train"] == found["Job dapo-train-logs"] == {f"{REGISTRY}/dapo@{REPRO}"}
    # the evaluation on the training image (eval.image all ""): the training image's digest
    same = {**RWX, "image": {"repository": f"{REGISTRY}/dapo", "digest": TRAIN},
            "eval": {"enabled": True, "image": {"repository": "", "tag": "", "digest": ""}}}
    assert images(objects_by_key(same).values())["RayJob dapo-eval"] == {f"{REGISTRY}/dapo@{TRAIN}"}
    # another tag for the evaluation: that tag, not the training image's digest
    other = {**same, "eval": {"enabled": True, "image": {"repository": "", "tag": "other", "digest": ""}}}
    h = objects_by_key(other)
    assert images(h.values())["RayJob dapo-eval"] == {f"{REGISTRY}/dapo:other"}
    # a follower image of its own: its own digest, or its tag
    own = {**same, "logs": {"image": {"repository": f"{REGISTRY}/follow", "tag": "1", "digest": ""}}}
    h = objects_by_key(own)
    (follow,) = {c["image"] for c in h[("Job", "dapo-train-logs")]["spec"]["template"]["spec"]["containers"]}
    assert follow == f"{REGISTRY}/follow:1"


@pytest.mark.parametrize("digest", ["sha256:abc", "1" * 64, "sha512:" + "1" * 64, "sha256:" + "A" * 64])
def test_a_malformed_digest_is_refused_naming_the_key(digest):
    from helm_python.errors import HelmValuesError

    values = {**RWX, "eval": {"enabled": True, "image": {"digest": digest}}}
    with pytest.raises(HelmValuesError, match="/eval/image/digest"):
        helm_objects(values)


def test_the_committed_examples_pull_from_a_registry_that_cannot_resolve():
    """k8s/rendered/: every image of ours comes from registry.invalid (RFC 6761: .invalid never resolves), so no one
    can publish what an applied example would pull; the header says so."""
    sets = render_script().RENDER_SETS
    for name in sets:
        path = ROOT / "k8s" / "rendered" / f"{name}.yaml"
        text = path.read_text()
        assert "registry.invalid" in text.split("---", 1)[0] and "never" in text.split("---", 1)[0], path
        objects = [o for o in yaml.safe_load_all(text) if o]
        ours = [c["image"] for o in objects for t in (
            [t for _, t in pod_templates(o)] if o["kind"] == "RayJob" else
            [o["spec"]["template"]] if o["kind"] == "Job" else [])
            for c in t["spec"].get("initContainers", []) + t["spec"].get("containers", [])
            if c["image"].split("@")[0].split(":")[0].rsplit("/", 1)[-1] in ("dapo", "dapo-eval")]
        assert ours and all(i.startswith("registry.invalid/") for i in ours), (path, ours)
        assert "ghcr.io/dapo-k8s" not in text, path
