"""What the cluster must already have, refused at render time (the chart's dapo.installRules; scripts/render.py prints
Helm's message): the chart's unpublished default images, unless the user says they exist (image.published), and the
values files' placeholder StorageClass."""

from __future__ import annotations

import copy

from k8s_support import VALUES_DIR, chart, refusal, render_script, user_values

# full.yaml runs on 16 nodes: it declares a fabric (the chart refuses it otherwise, before these rules)
FAB = {"fabric": {"expect": "ib"}}
OWN = {"image": {"repository": "registry.example.com/ml/dapo"},
       "eval": {"image": {"repository": "registry.example.com/ml/dapo-eval"}},
       "storage": {"storageClassName": "efs-sc"}, **FAB}


def refused(files, extra) -> str:
    """The chart's message for these user values, without the stand-in."""
    return refusal(files, copy.deepcopy(extra), stand_in=False)


def renders(files, extra) -> None:
    chart().render(user_values(files, extra, stand_in=False), name="dapo", namespace="ml")


def test_the_unpublished_default_image_is_refused_naming_the_build_command_and_the_values():
    full = [VALUES_DIR / "full.yaml"]
    msg = refused(full, {"storage": {"storageClassName": "efs-sc"}, **FAB})
    assert msg.startswith("image.repository: ghcr.io/dapo-k8s/dapo:0.1.0-verl0.9.1 is the chart's default image")
    for needle in ("make images REGISTRY=<registry>", "image.repository=<registry>/dapo",
                   "eval.image.repository=<registry>/dapo-eval", "image.published=true"):
        assert needle in msg
    # the user's own registry, or the statement that the default images exist
    renders(full, OWN)
    renders(full, {"storage": {"storageClassName": "efs-sc"}, "image": {"published": True}, **FAB})


def test_each_image_the_release_runs_is_checked():
    full, ev, ref = VALUES_DIR / "full.yaml", VALUES_DIR / "eval.yaml", VALUES_DIR / "reference.yaml"
    own_train = {"image": OWN["image"], "storage": OWN["storage"], **FAB}
    assert refused([full, ev], own_train).startswith(
        "eval.image.repository: ghcr.io/dapo-k8s/dapo-eval:0.1.0-ray2.60.0 is the chart's default image")
    renders([full, ev], OWN)
    assert refused([full, ref], own_train).startswith(
        "train.reference.image.repository: ghcr.io/dapo-k8s/dapo:0.1.0-repro-verl4f80e46 is the chart's default")
    renders([full, ref], {**OWN, "train": {"reference": {"image": {"repository": "registry.example.com/r"}}}})
    # a follower image of the user's choice at the default name
    logs = {**OWN, "logs": {"image": {"repository": "ghcr.io/dapo-k8s/dapo", "tag": "x"}}}
    assert refused([full], logs).startswith("logs.image.repository: ghcr.io/dapo-k8s/dapo:x ")


def test_the_placeholder_storage_class_of_the_values_files_is_refused():
    full = [VALUES_DIR / "full.yaml"]
    msg = refused(full, {"image": OWN["image"], **FAB})  # full.yaml carries storageClassName: shared-rwx
    assert msg.startswith('storage.storageClassName: "shared-rwx" is the values files\' placeholder')
    assert "--set storage.storageClassName=$RWX_CLASS" in msg and "kubectl get storageclass" in msg
    # an existing claim does not use the class
    renders(full, {"image": OWN["image"], "storage": {"existingClaim": "dapo-shared"}, **FAB})


def test_render_py_refuses_the_default_images_on_the_command_line(capsys):
    assert render_script().main(["--preset", "smoke", "--set", "storage.storageClassName=efs-sc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("render.py: image.repository: ghcr.io/dapo-k8s/dapo:") and "make images" in err
    assert render_script().main(["--preset", "smoke", "--set", "storage.storageClassName=efs-sc", "--set",
                                 "image.repository=registry.example.com/ml/dapo"]) == 0
