"""What every template of the chart knows (``charts/dapo/templates/_helpers.tpl``'s names and labels): the
coalesced values checked by the chart's rules, the release and namespace, the merged preset, its placement and the
preset after the overrides, the object names, labels and metadata. :class:`dapo.k8s.pods.PodTemplates`,
:class:`dapo.k8s.rayjobs.RayJobs`, :class:`dapo.k8s.helm_tests.HelmTestPods` and :class:`dapo.k8s.manifests.Chart`
build on it.
"""

from __future__ import annotations

from typing import Any

from dapo.k8s.presets import effective_preset, merged_preset
from dapo.k8s.values import check, fullname, placement
from dapo.k8s.versions import image_ref  # noqa: F401  (the modules that build pods import it from here)


class ChartContext:
    """What the templates know: values (already coalesced with the chart defaults), release, namespace."""

    def __init__(self, values: dict[str, Any], *, release: str, namespace: str | None, chart_name: str = "dapo",
                 app_version: str = "0.1.0"):
        self.v = values
        self.release = release
        self.namespace = namespace
        self.chart_name = chart_name
        self.app_version = app_version
        self.fullname = fullname(values, release, chart_name)
        self.name = (values.get("nameOverride") or chart_name)[:63]
        self.name = self.name[:-1] if self.name.endswith("-") else self.name
        self.train_job_name = f"{self.fullname}-train"
        self.eval_job_name = f"{self.fullname}-eval"
        self.preset_cm_name = f"{self.fullname}-preset"
        check(values, train_job_name=self.train_job_name, eval_job_name=self.eval_job_name)
        self.preset = merged_preset(values["preset"])
        self.placement = placement(values, self.preset)
        # the preset after the preset-key overrides: paths, experiment name and model of the run
        self.effective = effective_preset(self.preset, list(values["overrides"]))

    # -- images (the chart's dapo.trainImage, dapo.evalImage) ----------------------------------------------------

    def train_image(self) -> dict[str, str]:
        """The training RayJob's image: image.*, or train.reference.image.* with the reference runner."""
        v = self.v
        img = v["train"]["reference"]["image"] if v["train"]["runner"] == "reference" else v["image"]
        return {"repository": img["repository"], "tag": img["tag"], "digest": img.get("digest") or ""}

    def eval_image(self) -> dict[str, str]:
        """The evaluation RayJob's image: eval.image.*, each "" falling back to image.* (the digest only when the
        evaluation runs the training image itself: repository, tag and digest all "")."""
        e, i = self.v["eval"]["image"], self.v["image"]
        digest = e.get("digest") or ("" if e.get("repository") or e.get("tag") else i.get("digest") or "")
        return {"repository": e.get("repository") or i["repository"], "tag": e.get("tag") or i["tag"],
                "digest": digest}

    # -- names and labels ----------------------------------------------------------------------------------------

    @property
    def claim_name(self) -> str:
        return self.v["storage"]["existingClaim"] or f"{self.fullname}-shared"

    def selector_labels(self, component: str) -> dict[str, str]:
        return {
            "app.kubernetes.io/name": self.name,
            "app.kubernetes.io/instance": self.release,
            "app.kubernetes.io/component": component,
        }

    def labels(self, component: str) -> dict[str, str]:
        return {
            **self.selector_labels(component),
            "app.kubernetes.io/version": self.app_version,
            "app.kubernetes.io/part-of": "dapo",
        }

    def metadata(self, name: str, component: str) -> dict[str, Any]:
        """Object metadata; without a namespace (None) the objects go to kubectl's current namespace."""
        meta: dict[str, Any] = {"name": name}
        if self.namespace is not None:
            meta["namespace"] = self.namespace
        meta["labels"] = self.labels(component)
        return meta
