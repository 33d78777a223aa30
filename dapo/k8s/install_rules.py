"""Rules about what the cluster must already have before an install can start, checked at render time: the images
the release runs exist in a registry, and the claim names a real StorageClass, not the values files' placeholder.
The chart's ``dapo.installRules`` (``templates/_validate.tpl``) applies the same rules with the same messages.

- Images: the chart's default repositories (:data:`~dapo.k8s.versions.IMAGE_REPOSITORY`,
  :data:`~dapo.k8s.versions.EVAL_IMAGE_REPOSITORY`) have never been published. A release that would run one of them
  is refused -- every pod would sit in ImagePullBackOff while GPUs wait -- naming the build-and-push command
  (``make images REGISTRY=...``) and the values that point the chart at its result, unless ``image.published`` says
  that the images named do exist (a published release tag).
- Storage class: ``shared-rwx`` (:data:`PLACEHOLDER_CLASS`) is what ``values/*.yaml`` carry on the line the user
  must change; no cluster has it, the claim would stay Pending and every pod with it.
"""

from __future__ import annotations

from typing import Any

from dapo.k8s.presets import ValuesError
from dapo.k8s.versions import EVAL_IMAGE_REPOSITORY, IMAGE_REPOSITORY, image_ref
from dapo.util.gofmt import q

PLACEHOLDER_CLASS = "shared-rwx"
BUILD_COMMAND = "make images REGISTRY=<registry>"


def release_images(v: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(value key, repository, reference) of every image the release's pods run, in the chart's order: training (or
    the reproduction image), evaluation, the followers' own image."""
    out = []
    if v["train"]["enabled"]:
        if v["train"]["runner"] == "reference":
            img = v["train"]["reference"]["image"]
            out.append(("train.reference.image.repository", img["repository"], image_ref(_pin(img))))
        else:
            out.append(("image.repository", v["image"]["repository"], image_ref(_pin(v["image"]))))
    if v["eval"]["enabled"]:
        e = v["eval"]["image"]
        img = {"repository": e.get("repository") or v["image"]["repository"], "tag": e.get("tag") or v["image"]["tag"],
               "digest": e.get("digest")}
        out.append(("eval.image.repository", img["repository"], image_ref(img)))
    lg = v["logs"]
    if lg["enabled"] and lg["image"].get("repository"):
        img = {"repository": lg["image"]["repository"], "tag": lg["image"].get("tag") or v["image"]["tag"],
               "digest": lg["image"].get("digest")}
        out.append(("logs.image.repository", img["repository"], image_ref(img)))
    return out


def _pin(img: dict[str, Any]) -> dict[str, Any]:
    return {"repository": img["repository"], "tag": img["tag"], "digest": img.get("digest")}


def check_install(v: dict[str, Any]) -> None:
    """Raise :class:`ValuesError` when the release would run an unpublished default image or the placeholder
    StorageClass (module doc)."""
    if not v["image"].get("published"):
        for key, repository, image in release_images(v):
            if repository in (IMAGE_REPOSITORY, EVAL_IMAGE_REPOSITORY):
                raise ValuesError(
                    f"{key}: {image} is the chart's default image, which has not been published; build the images "
                    f"and push them to your registry with `{BUILD_COMMAND}` (docs/images.md), then set "
                    "image.repository=<registry>/dapo and eval.image.repository=<registry>/dapo-eval; if the "
                    "images named do exist (a published release tag), set image.published=true"
                )
    if not v["storage"]["existingClaim"] and v["storage"].get("storageClassName") == PLACEHOLDER_CLASS:
        raise ValuesError(
            f"storage.storageClassName: {q(PLACEHOLDER_CLASS)} is the values files' placeholder, not a class of your "
            "cluster (the claim would stay Pending): set your ReadWriteMany StorageClass, e.g. --set "
            "storage.storageClassName=$RWX_CLASS (kubectl get storageclass; docs/storage.md)"
        )
