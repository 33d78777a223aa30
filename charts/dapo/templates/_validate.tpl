{{/*
Cross-field rules that values.schema.json cannot express. Every message starts with the offending key, but the last:
the values the install still needs, all in one message (dapo.validateMissing). scripts/render.py and `dapo doctor`
render through Helm's engine, so they refuse with these same messages.
Usage: at the top of every template: {{- include "dapo.validate" . -}}
*/}}
{{- define "dapo.validate" -}}
{{- include "dapo.validateNames" . -}}
{{- include "dapo.validatePlacement" . -}}
{{- include "dapo.validateLifecycle" . -}}
{{- include "dapo.validateResources" . -}}
{{- include "dapo.validateEnv" . -}}
{{- include "dapo.validateHead" . -}}
{{- include "dapo.validateStorage" . -}}
{{- include "dapo.validateRun" . -}}
{{- include "dapo.validateSecurity" . -}}
{{- include "dapo.validateMissing" . -}}
{{- end -}}

{{/*
Part of dapo.validate: what is deployed and its RayJob names.
*/}}
{{- define "dapo.validateNames" -}}
{{- $v := .Values -}}
{{- if and (not $v.train.enabled) (not $v.eval.enabled) -}}
{{- fail "train.enabled: train.enabled and eval.enabled are both false; nothing to deploy" -}}
{{- end -}}

{{- /* RayJob names: DNS-1035 labels of at most 47 characters (KubeRay appends a 6-character suffix). */ -}}
{{- range $kind := list "train" "eval" -}}
{{- if (index $v $kind).enabled -}}
{{- $name := include (printf "dapo.%sJobName" $kind) $ -}}
{{- if gt (len $name) 47 -}}
{{- fail (printf "fullnameOverride: the RayJob name %q has %d characters; KubeRay allows at most 47 (use a shorter release name or set fullnameOverride)" $name (len $name)) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "fullnameOverride: the RayJob name %q is not a DNS-1035 label (lower-case letters, digits, '-', starting with a letter)" $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Part of dapo.validate: the placement: from the preset unless values override it.
*/}}
{{- define "dapo.validatePlacement" -}}
{{- $v := .Values -}}
{{- /* Placement: from the preset unless values override it. */ -}}
{{- $pl := include "dapo.placement" . | fromJson -}}
{{- if lt (int $pl.nodes) 1 -}}
{{- fail (printf "nodes: must be >= 1, got %d (values nodes or the preset's placement.nodes)" (int $pl.nodes)) -}}
{{- end -}}
{{- if eq $pl.backend "local" -}}
{{- if not (kindIs "invalid" $v.gpusPerNode) -}}
{{- fail (printf "gpusPerNode: preset %q runs on the local backend in a CPU worker pod; gpusPerNode does not apply" $v.preset) -}}
{{- end -}}
{{- else -}}
{{- if lt (int $pl.gpus) 1 -}}
{{- fail (printf "gpusPerNode: must be >= 1 for the verl backend, got %d (values gpusPerNode or the preset's placement.gpus_per_node)" (int $pl.gpus)) -}}
{{- end -}}
{{- if $pl.cpu -}}
{{- /* verl on CPU: logical GPUs declared by the chart; an image with vLLM's CPU build */ -}}
{{- range $key := list "num-gpus" "num-cpus" -}}
{{- if hasKey ($v.worker.rayStartParams | default dict) $key -}}
{{- fail (printf "worker.rayStartParams.%s: preset %q runs verl on CPU; the chart declares the worker's logical GPUs (gpusPerNode) and CPUs (8 per GPU) itself" $key $v.preset) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $o := $v.overrides -}}
{{- $key := regexReplaceAll "^[+]+" (first (splitList "=" $o)) "" -}}
{{- if has $key (list "placement.nodes" "placement.gpus_per_node" "placement.backend" "trainer.nnodes" "trainer.n_gpus_per_node") -}}
{{- fail (printf "overrides: %q changes the placement; set the values nodes / gpusPerNode instead (the worker group is sized from them)" $o) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Part of dapo.validate: the RayJobs' lifecycle under KubeRay v1.7 and the queue.
*/}}
{{- define "dapo.validateLifecycle" -}}
{{- $v := .Values -}}
{{- /* RayJob lifecycle rules of KubeRay v1.7, per job. */ -}}
{{- range $kind := list "train" "eval" -}}
{{- $job := index $v $kind -}}
{{- if $job.enabled -}}
{{- if and (not $job.shutdownAfterJobFinishes) (gt (int $job.ttlSecondsAfterFinished) 0) -}}
{{- fail (printf "%s.ttlSecondsAfterFinished: must be 0 when %s.shutdownAfterJobFinishes is false (KubeRay rejects the RayJob)" $kind $kind) -}}
{{- end -}}
{{- include "dapo.validateDeletionRules" (dict "kind" $kind "job" $job) -}}
{{- if and (eq $v.queue.scheduler "kueue") (not $job.shutdownAfterJobFinishes) -}}
{{- fail (printf "queue.scheduler: kueue suspends RayJobs, which KubeRay allows only with %s.shutdownAfterJobFinishes: true" $kind) -}}
{{- end -}}
{{- if and (eq $v.queue.scheduler "kai") (eq $job.submissionMode "K8sJobMode") -}}
{{- fail (printf "queue.scheduler: kai does not support %s.submissionMode K8sJobMode (the submitter pod escapes the gang); use HTTPMode or SidecarMode" $kind) -}}
{{- end -}}
{{- if and (eq $job.submissionMode "SidecarMode") (not (has $v.head.restartPolicy (list "" "Never"))) -}}
{{- fail (printf "head.restartPolicy: must be empty or Never with %s.submissionMode SidecarMode, got %q" $kind $v.head.restartPolicy) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $ev := $v.train.evidence -}}
{{- if and $v.train.enabled $ev.enabled (ge (float64 $ev.seconds) (float64 $ev.terminationGracePeriodSeconds)) -}}
{{- fail (printf "train.evidence.seconds: the copy of the logs (%v s) must end within train.evidence.terminationGracePeriodSeconds (%v s), which also holds `ray stop`" $ev.seconds $ev.terminationGracePeriodSeconds) -}}
{{- end -}}
{{- end -}}

{{/*
A job's deletionRules as KubeRay v1.7 validates them: one condition each, no duplicate, the TTLs in
policy order. Usage: include "dapo.validateDeletionRules" (dict "kind" "train" "job" .Values.train)
*/}}
{{- define "dapo.validateDeletionRules" -}}
{{- $kind := .kind -}}
{{- $job := .job -}}
{{- if $job.deletionRules -}}
{{- if $job.shutdownAfterJobFinishes -}}
{{- fail (printf "%s.deletionRules: mutually exclusive with %s.shutdownAfterJobFinishes: true (KubeRay v1.7); set shutdownAfterJobFinishes: false and ttlSecondsAfterFinished: 0" $kind $kind) -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $i, $r := $job.deletionRules -}}
{{- $c := $r.condition -}}
{{- $cond := "" -}}
{{- if and (hasKey $c "jobStatus") (not (hasKey $c "jobDeploymentStatus")) -}}
{{- $cond = printf "JobStatus %s" $c.jobStatus -}}
{{- else if and (hasKey $c "jobDeploymentStatus") (not (hasKey $c "jobStatus")) -}}
{{- $cond = printf "JobDeploymentStatus %s" $c.jobDeploymentStatus -}}
{{- else -}}
{{- fail (printf "%s.deletionRules[%d].condition: set exactly one of jobStatus and jobDeploymentStatus" $kind $i) -}}
{{- end -}}
{{- $key := printf "%s/%s" $cond $r.policy -}}
{{- if hasKey $seen $key -}}
{{- fail (printf "%s.deletionRules[%d]: duplicate rule for policy %s and %s" $kind $i $r.policy $cond) -}}
{{- end -}}
{{- $_ := set $seen $key (int ($c.ttlSeconds | default 0)) -}}
{{- end -}}
{{- range $i, $r := $job.deletionRules -}}
{{- $c := $r.condition -}}
{{- $cond := ternary (printf "JobStatus %s" (toString $c.jobStatus)) (printf "JobDeploymentStatus %s" (toString $c.jobDeploymentStatus)) (hasKey $c "jobStatus") -}}
{{- $ttl := int ($c.ttlSeconds | default 0) -}}
{{- $order := list "DeleteWorkers" "DeleteCluster" "DeleteSelf" -}}
{{- if has $r.policy $order -}}
{{- $idx := 0 -}}
{{- range $j, $p := $order -}}{{- if eq $p $r.policy -}}{{- $idx = $j -}}{{- end -}}{{- end -}}
{{- range $j, $p := $order -}}
{{- if lt $j $idx -}}
{{- $k := printf "%s/%s" $cond $p -}}
{{- if and (hasKey $seen $k) (lt $ttl (int (index $seen $k))) -}}
{{- fail (printf "%s.deletionRules[%d]: for %s the %s TTL (%d) must be >= the %s TTL (%d)" $kind $i $cond $r.policy $ttl $p (int (index $seen $k))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Part of dapo.validate: resources: no GPU on the head, GPUs only from the placement.
*/}}
{{- define "dapo.validateResources" -}}
{{- $v := .Values -}}
{{- /* No GPU-holding head. */ -}}
{{- range $section := list "requests" "limits" -}}
{{- if hasKey (index $v.head.resources $section | default dict) "nvidia.com/gpu" -}}
{{- fail (printf "head.resources.%s: the Ray head must not hold GPUs (it runs GCS, the dashboard and the driver; GPUs belong to the worker group)" $section) -}}
{{- end -}}
{{- if hasKey (index $v.worker.resources $section | default dict) "nvidia.com/gpu" -}}
{{- fail (printf "worker.resources.%s: nvidia.com/gpu is set from gpusPerNode / the preset's placement.gpus_per_node; remove it here" $section) -}}
{{- end -}}
{{- end -}}
{{- if ne (toString (index $v.head.rayStartParams "num-cpus")) "0" -}}
{{- fail "head.rayStartParams.num-cpus: must be \"0\" so that the training driver (the DAPO loop, entrypointNumCpus 1) and every Ray task and actor run on the workers, not on the head" -}}
{{- end -}}
{{- if ne (toString (index $v.head.rayStartParams "num-gpus")) "0" -}}
{{- fail "head.rayStartParams.num-gpus: must be \"0\" so that no GPU work (verl's driver task, vLLM) lands on the head" -}}
{{- end -}}
{{- range $k, $_ := $v.worker.extraResources -}}
{{- if has $k (list "cpu" "memory" "nvidia.com/gpu") -}}
{{- fail (printf "worker.extraResources.%s: extraResources is for device resources (RDMA, EFA); cpu/memory go in worker.resources, GPUs come from gpusPerNode" $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Part of dapo.validate: environment and labels: tokens only from the Secret, nothing the chart sets.
*/}}
{{- define "dapo.validateEnv" -}}
{{- $v := .Values -}}
{{- /* Environment: tokens only from the Secret, no clash with what the chart sets. */ -}}
{{- $managed := list "HF_HOME" "HF_TOKEN_PATH" "WANDB_ENTITY" "RAY_memory_monitor_refresh_ms" "NVIDIA_VISIBLE_DEVICES" -}}
{{- range $where := list "env" "nccl" "train.runtimeEnv" "eval.runtimeEnv" -}}
{{- $m := dict -}}
{{- if eq $where "env" }}{{ $m = $v.env }}{{ else if eq $where "nccl" }}{{ $m = $v.nccl }}{{ else if eq $where "train.runtimeEnv" }}{{ $m = $v.train.runtimeEnv }}{{ else }}{{ $m = $v.eval.runtimeEnv }}{{ end -}}
{{- range $k, $_ := $m -}}
{{- if has $k (list "HF_TOKEN" "WANDB_API_KEY") -}}
{{- fail (printf "%s.%s: tokens come only from the Secret (secret.name, secret.hfTokenKey / secret.wandbApiKeyKey), never from values" $where $k) -}}
{{- end -}}
{{- if and (has $where (list "env" "nccl")) (has $k $managed) -}}
{{- fail (printf "%s.%s: set by the chart (see storage.hfHome, wandb.entity); remove it here" $where $k) -}}
{{- end -}}
{{- if and (eq $where "env") (hasKey $v.nccl $k) -}}
{{- fail (printf "env.%s: also set in nccl; set it in one place" $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- range $group := list "head" "worker" -}}
{{- range $k, $_ := ((index $v $group).labels | default dict) -}}
{{- if has $k (list "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/component") -}}
{{- fail (printf "%s.labels.%s: set by the chart (selector label); remove it here" $group $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- if and (include "dapo.hubOffline" .) (hasKey $v.env "HF_HUB_OFFLINE") -}}
{{- fail "env.HF_HUB_OFFLINE: set by the chart when dataPrep.fetchModel downloads the model; remove it here" -}}
{{- end -}}
{{- end -}}

{{/*
Part of dapo.validate: the head pod stays Guaranteed; hostNetwork; paths under the mount.
*/}}
{{- define "dapo.validateHead" -}}
{{- $v := .Values -}}
{{- /* A Guaranteed head pod (evicted last): requests equal limits for cpu and memory in every container. */ -}}
{{- $guaranteed := list (list "head.resources" $v.head.resources) -}}
{{- if $v.dataPrep.enabled -}}{{- $guaranteed = append $guaranteed (list "dataPrep.resources" $v.dataPrep.resources) -}}{{- end -}}
{{- range $i, $c := $v.head.sidecarContainers -}}
{{- $guaranteed = append $guaranteed (list (printf "head.sidecarContainers[%d].resources" $i) ($c.resources | default dict)) -}}
{{- end -}}
{{- range $pair := $guaranteed -}}
{{- $r := last $pair -}}
{{- range $res := list "cpu" "memory" -}}
{{- $req := index ($r.requests | default dict) $res -}}
{{- $lim := index ($r.limits | default dict) $res -}}
{{- if or (kindIs "invalid" $req) (kindIs "invalid" $lim) (ne (toString $req) (toString $lim)) -}}
{{- fail (printf "%s: requests.%s and limits.%s must both be set and equal (got %v and %v): every container of the Ray head must keep the pod in the Guaranteed QoS class, the last to be evicted" (first $pair) $res $res (toString ($req | default "unset")) (toString ($lim | default "unset"))) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- if and $v.hostNetwork (not $v.worker.onePerHost) -}}
{{- fail "worker.onePerHost: must be true with hostNetwork (two Ray workers on one host would collide on ports)" -}}
{{- end -}}
{{- range $key := list "dataPrep.outDir" "storage.hfHome" -}}
{{- $path := ternary $v.dataPrep.outDir $v.storage.hfHome (eq $key "dataPrep.outDir") -}}
{{- if not (hasPrefix (printf "%s/" (trimSuffix "/" $v.storage.mountPath)) $path) -}}
{{- fail (printf "%s: %q is not under storage.mountPath %q (it would not survive the pod)" $key $path $v.storage.mountPath) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Part of dapo.validate: the created volume's size.
*/}}
{{- define "dapo.validateStorage" -}}
{{- $v := .Values -}}
{{- /* The created volume holds max_ckpt_to_keep + 1 checkpoints + model cache + data: the bytes per preset come
from files/requirements.yaml (generated by `dapo plan --requirements-file`; dapo/plan/memory.py computes the same for
scripts/render.py). An existing claim is not sized here (docs/storage.md#size). */ -}}
{{- if and $v.train.enabled (not $v.storage.existingClaim) -}}
{{- $req := index (((.Files.Get "files/requirements.yaml") | fromYaml).presets | default dict) $v.preset -}}
{{- if not $req -}}
{{- fail (printf "preset: %q has no entry in files/requirements.yaml; regenerate it: dapo plan --requirements-file charts/dapo/files/requirements.yaml" $v.preset) -}}
{{- end -}}
{{- if not (kindIs "invalid" $req.storageBytes) -}}
{{- if lt (include "dapo.quantityBytes" $v.storage.size | float64) (float64 $req.storageBytes) -}}
{{- fail (printf "storage.size: %s is smaller than what preset %s needs: %s (dapo plan --preset %s); raise storage.size or lower recipe.trainer.max_ckpt_to_keep" $v.storage.size $v.preset $req.storage $v.preset) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Part of dapo.validate: the evaluation's GPUs and the fabric check of a GPU run.
*/}}
{{- define "dapo.validateRun" -}}
{{- $v := .Values -}}
{{- $pl := include "dapo.placement" . | fromJson -}}
{{- if and $v.eval.enabled (lt (int $pl.evalGpus) 1) -}}
{{- fail (printf "eval.gpusPerNode: the evaluation serves the model on GPUs; must be >= 1, got %d" (int $pl.evalGpus)) -}}
{{- end -}}
{{- /* A multi-node GPU run of our trainer checks its fabric */ -}}
{{- if and (include "dapo.multiNodeGpu" .) (not $v.fabric.check) -}}
{{- fail (printf "fabric.check: preset %q runs on %d nodes x %d GPUs: every multi-node run checks its fabric first (about a minute, against days of training); set fabric.check: true (fabric.expect=socket trains over TCP, reported by the check)" $v.preset (int $pl.nodes) (int $pl.gpus)) -}}
{{- end -}}
{{- end -}}

{{/*
"true" for a run of our trainer on more than one GPU node: it declares its fabric and checks it.
*/}}
{{- define "dapo.multiNodeGpu" -}}
{{- $v := .Values -}}
{{- $pl := include "dapo.placement" . | fromJson -}}
{{- if and $v.train.enabled (ne $v.train.runner "reference") (ne $pl.backend "local") (not $pl.cpu) (gt (int $pl.nodes) 1) -}}true{{- end -}}
{{- end -}}

{{/*
Part of dapo.validate, after every contradiction: the values the install still needs, all in one refusal, one line
each (the key, what is missing, the fix), from dapo.missingValues.
*/}}
{{- define "dapo.validateMissing" -}}
{{- $lines := compact (splitList "\n" (include "dapo.missingValues" .)) -}}
{{- if $lines -}}
{{- fail (printf "%d %s still needed before this installs:\n%s" (len $lines) (ternary "value" "values" (eq (len $lines) 1)) (join "\n" $lines)) -}}
{{- end -}}
{{- end -}}

{{/*
The values a documented values file leaves to the user, one line each: the fabric of a multi-node GPU run, the images
(dapo.missingImages), a ReadWriteMany class (not the values files' placeholder shared-rwx), what an evaluation reads,
the queue's name.
*/}}
{{- define "dapo.missingValues" -}}
{{- $v := .Values -}}
{{- $pl := include "dapo.placement" . | fromJson -}}
{{- if and (include "dapo.multiNodeGpu" .) (not $v.fabric.expect) -}}
{{- printf "- fabric.expect: %d nodes x %d GPUs, no fabric declared (NCCL would silently use TCP): -f values/<cloud>.yaml (eks-p5, gke-a3-mega, gke-a3-high, gke-a3-ultra) or --set fabric.expect=ib|efa|tcpx|tcpxo|gib|socket (docs/fabric.md)\n" (int $pl.nodes) (int $pl.gpus) -}}
{{- end -}}
{{- include "dapo.missingImages" . -}}
{{- $class := $v.storage.storageClassName | default "" -}}
{{- $rwx := "--set storage.storageClassName=<your ReadWriteMany class> (kubectl get storageclass; docs/storage.md)" -}}
{{- if and (not $v.storage.existingClaim) (eq $class "shared-rwx") -}}
{{- printf "- storage.storageClassName: \"shared-rwx\" is the values files' placeholder: %s\n" $rwx -}}
{{- else if and (not $v.storage.existingClaim) (not $class) (or (and $v.train.enabled (ne $pl.backend "local") (not $pl.cpu)) $v.eval.enabled) -}}
{{- printf "- storage.storageClassName: unset, and the default class is ReadWriteOnce on EKS and GKE (the claim would stay Pending): %s, or storage.existingClaim=<claim>\n" $rwx -}}
{{- end -}}
{{- if $v.eval.enabled -}}
{{- $p := include "dapo.effectivePreset" . | fromJson -}}
{{- if and (not $v.eval.testFile) (not (($p.recipe | default dict).data | default dict).val_files) -}}
{{- printf "- eval.testFile: preset %q has no recipe.data.val_files: --set eval.testFile=<the test file>\n" $v.preset -}}
{{- end -}}
{{- if and (not $v.eval.checkpointDir) (not (($p.recipe | default dict).trainer | default dict).default_local_dir) -}}
{{- printf "- eval.checkpointDir: preset %q has no recipe.trainer.default_local_dir: --set eval.checkpointDir=<the checkpoints' directory>\n" $v.preset -}}
{{- end -}}
{{- end -}}
{{- if and $v.queue.scheduler (not $v.queue.name) -}}
{{- printf "- queue.name: required with queue.scheduler %q: --set queue.name=<queue>\n" $v.queue.scheduler -}}
{{- end -}}
{{- end -}}

{{/*
The images the release runs that do not exist, one line each: verl on CPU
with the CUDA training image; the chart's default repositories, never published (unless image.published says that
the images named exist).
*/}}
{{- define "dapo.missingImages" -}}
{{- $v := .Values -}}
{{- $pl := include "dapo.placement" . | fromJson -}}
{{- $cpuImage := and $pl.cpu (eq $v.image.repository "ghcr.io/dapo-k8s/dapo") -}}
{{- if $cpuImage -}}
{{- printf "- image.repository: preset %q runs verl on CPU, which needs vLLM's CPU build; ghcr.io/dapo-k8s/dapo carries the CUDA one: --set image.repository=<an image with the vLLM-on-CPU stack> (docs/verl.md, 'verl on CPU')\n" $v.preset -}}
{{- end -}}
{{- if not $v.image.published -}}
{{- $images := list -}}
{{- if $v.train.enabled -}}
{{- if eq $v.train.runner "reference" -}}
{{- $images = append $images (list "train.reference.image.repository" $v.train.reference.image.repository (include "dapo.imageRef" $v.train.reference.image)) -}}
{{- else if not $cpuImage -}}
{{- $images = append $images (list "image.repository" $v.image.repository (include "dapo.imageRef" $v.image)) -}}
{{- end -}}
{{- end -}}
{{- if $v.eval.enabled -}}
{{- $e := dict "repository" ($v.eval.image.repository | default $v.image.repository) "tag" ($v.eval.image.tag | default $v.image.tag) "digest" $v.eval.image.digest -}}
{{- $images = append $images (list "eval.image.repository" $e.repository (include "dapo.imageRef" $e)) -}}
{{- end -}}
{{- if and $v.logs.enabled $v.logs.image.repository -}}
{{- $l := dict "repository" $v.logs.image.repository "tag" ($v.logs.image.tag | default $v.image.tag) "digest" $v.logs.image.digest -}}
{{- $images = append $images (list "logs.image.repository" $l.repository (include "dapo.imageRef" $l)) -}}
{{- end -}}
{{- range $i := $images -}}
{{- $repo := index $i 1 -}}
{{- if has $repo (list "ghcr.io/dapo-k8s/dapo" "ghcr.io/dapo-k8s/dapo-eval") -}}
{{- $build := ternary "make image IMAGE_STACK=repro IMAGE=<registry>/dapo IMAGE_PUSH=1" "make images REGISTRY=<registry>" (eq (index $i 0) "train.reference.image.repository") -}}
{{- if and (eq (index $i 0) "image.repository") (hasSuffix "-efa" (toString $v.image.tag)) -}}{{- $build = "make images REGISTRY=<registry> EFA=1" -}}{{- end -}}
{{- printf "- %s: %s was never published: %s (docs/images.md), then --set %s=<registry>/%s (or image.published=true if it exists)\n" (index $i 0) (index $i 2) $build (index $i 0) (base $repo) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Bytes of a Kubernetes quantity as values.schema.json allows it (500Gi, 8Ti, 1.5T, 1000), as a float string.
dapo/plan/memory.py parse_quantity is the Python twin.
*/}}
{{- define "dapo.quantityBytes" -}}
{{- $q := toString . -}}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" $q -}}
{{- $suffix := trimPrefix $num $q -}}
{{- $mult := dict "" "1" "k" "1e3" "K" "1e3" "M" "1e6" "G" "1e9" "T" "1e12" "P" "1e15" "E" "1e18" "Ki" "1024" "Mi" "1048576" "Gi" "1073741824" "Ti" "1099511627776" "Pi" "1125899906842624" "Ei" "1152921504606846976" -}}
{{- if not (hasKey $mult $suffix) -}}
{{- fail (printf "storage.size: %q is not a quantity like 500Gi or 8Ti" $q) -}}
{{- end -}}
{{- mulf (float64 $num) (float64 (index $mult $suffix)) -}}
{{- end -}}
