"""The pinned versions of the cluster deployment, in one place on the Python side.

The Helm chart keeps the same pins in one place too (``charts/dapo/values.yaml``: ``image.repository``,
``image.tag``, ``rayVersion``, ``eval.image``); tests check the two agree, and the image build (``docker/constraints.txt``) is
checked against them.
"""

from __future__ import annotations

# Ray inside the image: the version verl 0.9.1 resolves to.
RAY_VERSION = "2.60.0"

# The training image (head, workers, submitter, data preparation): <dapo version>-verl<verl version>.
IMAGE_REPOSITORY = "ghcr.io/dapo-k8s/dapo"
IMAGE_TAG = "0.1.0-verl0.9.1"

# The reproduction image of the reference runs (`make image IMAGE_STACK=repro`: verl 4f80e46, vLLM 0.8.3) and its Ray
# (docker/constraints-repro.txt): what the training RayJob runs with train.runner reference.
REPRO_IMAGE_TAG = "0.1.0-repro-verl4f80e46"
REPRO_RAY_VERSION = "2.43.0"

# The evaluation image (Ray Serve LLM + vLLM, docker/Dockerfile.eval): <dapo version>-ray<ray version>.
EVAL_IMAGE_REPOSITORY = "ghcr.io/dapo-k8s/dapo-eval"
EVAL_IMAGE_TAG = "0.1.0-ray2.60.0"

# The KubeRay operator the chart is written and validated against (a prerequisite, not bundled).
KUBERAY_VERSION = "1.7.0"

# RayJob / RayService names: KubeRay appends "-<5 chars>" for the RayCluster, whose name is limited to 53.
MAX_RAYJOB_NAME = 47
MAX_RAYSERVICE_NAME = 47
MAX_RAYCLUSTER_NAME = 53
