"""What the Python side of the cluster deployment checks against: the KubeRay operator's version and KubeRay's name
limits. The images and their Ray version are pinned where they run, ``charts/dapo/values.yaml`` (``image``,
``rayVersion``, ``eval.image``, ``train.reference``), and where they are built, the Makefile's tags (from the locks):
tests/test_docker.py holds the two equal.
"""

from __future__ import annotations

# The KubeRay operator the chart is written and validated against (a prerequisite, not bundled).
KUBERAY_VERSION = "1.7.0"

# RayJob / RayService names: KubeRay appends "-<5 chars>" for the RayCluster, whose name is limited to 53.
MAX_RAYJOB_NAME = 47
MAX_RAYSERVICE_NAME = 47
MAX_RAYCLUSTER_NAME = 53
