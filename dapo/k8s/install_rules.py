"""Rules about what the cluster must already have before an install can start, checked at render time: the images
the release runs exist in a registry, and the claim names a real StorageClass, not the values files' placeholder.
Each gives a line of the one refusal that lists every value still needed (:func:`dapo.k8s.values.missing_values`);
the chart's ``dapo.missingImages`` and ``dapo.missingValues`` (``templates/_validate.tpl``) give the same lines.

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

from dapo.k8s.versions import EVAL_IMAGE_REPOSITORY, IMAGE_REPOSITORY, image_ref
from dapo.util.gofmt import q

PLACEHOLDER_CLASS = "shared-rwx"
BUILD_COMMAND = "make images REGISTRY=<registry>"
REPRO_BUILD_COMMAND = "make image IMAGE_STACK=repro IMAGE=<registry>/dapo IMAGE_PUSH=1"
EFA_TAG_SUFFIX = "-efa"  # the Makefile's: the tag of the training image's EFA variant


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


def missing_images(v: dict[str, Any], pl: dict[str, Any]) -> list[str]:
    """The chart's ``dapo.missingImages``: a line for each image the release runs that does not exist: verl on CPU
    with the CUDA training image, then the unpublished default images (module doc)."""
    out = []
    cpu_image = pl["cpu"] and v["image"]["repository"] == IMAGE_REPOSITORY
    if cpu_image:
        out.append(f"- image.repository: preset {q(v['preset'])} runs verl on CPU, which needs vLLM's CPU build; "
                   f"{IMAGE_REPOSITORY} carries the CUDA one: --set image.repository=<an image with the vLLM-on-CPU "
                   "stack> (docs/verl.md, 'verl on CPU')")
    if v["image"].get("published"):
        return out
    for key, repository, image in release_images(v):
        if repository in (IMAGE_REPOSITORY, EVAL_IMAGE_REPOSITORY) and not (cpu_image and key == "image.repository"):
            build = REPRO_BUILD_COMMAND if key == "train.reference.image.repository" else BUILD_COMMAND
            if key == "image.repository" and str(v["image"]["tag"]).endswith(EFA_TAG_SUFFIX):
                build += " EFA=1"  # values/eks-p5.yaml's tag: the EFA variant of the training image
            out.append(f"- {key}: {image} was never published: {build} (docs/images.md), then --set "
                       f"{key}=<registry>/{repository.rsplit('/', 1)[-1]} (or image.published=true if it exists)")
    return out


def missing_storage_class(v: dict[str, Any], pl: dict[str, Any]) -> list[str]:
    """The line for the claim's class: the values files' placeholder, or none for a GPU run (the cluster's default
    class is ReadWriteOnce on EKS and GKE, and the claim would stay Pending)."""
    s = v["storage"]
    if s["existingClaim"]:
        return []
    fix = "--set storage.storageClassName=<your ReadWriteMany class> (kubectl get storageclass; docs/storage.md)"
    if s.get("storageClassName") == PLACEHOLDER_CLASS:
        return [f"- storage.storageClassName: {q(PLACEHOLDER_CLASS)} is the values files' placeholder: {fix}"]
    gpu_run = (v["train"]["enabled"] and pl["backend"] != "local" and not pl["cpu"]) or v["eval"]["enabled"]
    if not s.get("storageClassName") and gpu_run:
        return ["- storage.storageClassName: unset, and the default class is ReadWriteOnce on EKS and GKE (the claim "
                f"would stay Pending): {fix}, or storage.existingClaim=<claim>"]
    return []
