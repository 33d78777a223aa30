{{/* vim: set filetype=mustache: */}}
{{/*
Names and labels. dapo/k8s/manifests.py (on dapo/k8s/context.py, pods.py, rayjobs.py, helm_tests.py) builds the
same objects in Python (scripts/render.py); a test renders both for every preset and compares them, so change the two
together.
*/}}

{{/*
Expand the name of the chart.
*/}}
{{- define "dapo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Fully qualified app name. If the release name contains the chart name it is used as is.
*/}}
{{- define "dapo.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Chart name and version as used by the chart label.
*/}}
{{- define "dapo.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Selector labels. Usage: include "dapo.selectorLabels" (dict "root" $ "component" "train-worker")
*/}}
{{- define "dapo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dapo.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/*
Common labels of top-level objects. Usage: include "dapo.labels" (dict "root" $ "component" "train")
*/}}
{{- define "dapo.labels" -}}
helm.sh/chart: {{ include "dapo.chart" .root }}
{{ include "dapo.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: dapo
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{/*
An image reference: <repository>@<digest> when pinned by digest, else <repository>:<tag>.
Usage: include "dapo.imageRef" (dict "repository" $r "tag" $t "digest" $d). dapo.k8s.versions.image_ref is the twin.
*/}}
{{- define "dapo.imageRef" -}}
{{- if .digest -}}{{ printf "%s@%s" .repository .digest }}{{- else -}}{{ printf "%s:%s" .repository .tag }}{{- end -}}
{{- end -}}

{{/*
The training RayJob's image (image.*, or train.reference.image.* with the reference runner) and the evaluation's
(eval.image.*, each "" falling back to image.*; the digest only when repository and tag are "" too), as JSON
{repository, tag, digest}. dapo.k8s.context.ChartContext.train_image / eval_image are the twins.
*/}}
{{- define "dapo.trainImage" -}}
{{- $img := .Values.image -}}
{{- if eq .Values.train.runner "reference" }}{{ $img = .Values.train.reference.image }}{{ end -}}
{{- toJson (dict "repository" $img.repository "tag" $img.tag "digest" ($img.digest | default "")) -}}
{{- end -}}
{{- define "dapo.evalImage" -}}
{{- $e := .Values.eval.image -}}
{{- $digest := $e.digest | default "" -}}
{{- if and (not $digest) (not $e.repository) (not $e.tag) }}{{ $digest = .Values.image.digest | default "" }}{{ end -}}
{{- toJson (dict "repository" ($e.repository | default .Values.image.repository) "tag" ($e.tag | default .Values.image.tag) "digest" $digest) -}}
{{- end -}}

{{/*
RayJob names (KubeRay: a DNS-1035 label of at most 47 characters).
*/}}
{{- define "dapo.trainJobName" -}}
{{- printf "%s-train" (include "dapo.fullname" .) -}}
{{- end -}}
{{- define "dapo.evalJobName" -}}
{{- printf "%s-eval" (include "dapo.fullname" .) -}}
{{- end -}}
{{- define "dapo.presetConfigMapName" -}}
{{- printf "%s-preset" (include "dapo.fullname" .) -}}
{{- end -}}

{{/*
The shared ReadWriteMany claim: an existing one, or <fullname>-shared created by this chart.
*/}}
{{- define "dapo.claimName" -}}
{{- if .Values.storage.existingClaim -}}
{{- .Values.storage.existingClaim -}}
{{- else -}}
{{- printf "%s-shared" (include "dapo.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/*
Preset files: the chain `<preset>.yaml` -> the file it `extends:` -> ... as a JSON list of names, the preset first.
The files live in presets/ (a link to the package's dapo/presets: the one source of hyperparameters).
*/}}
{{- define "dapo.presetFiles" -}}
{{- $name := .Values.preset -}}
{{- if or (not (regexMatch "^[a-z0-9][a-z0-9._-]*$" $name)) (hasPrefix "_" $name) -}}
{{- fail (printf "preset: %q is not a preset name (a file of presets/ without .yaml; _files are shared bases)" $name) -}}
{{- end -}}
{{- $state := dict "name" $name "files" (list) "done" false -}}
{{- range $i := until 16 -}}
{{- if not $state.done -}}
{{- $path := printf "presets/%s.yaml" $state.name -}}
{{- $raw := $.Files.Get $path -}}
{{- if not $raw -}}
{{- $known := list -}}
{{- range $p, $_ := $.Files.Glob "presets/*.yaml" -}}
{{- $base := base $p | trimSuffix ".yaml" -}}
{{- if not (hasPrefix "_" $base) -}}{{- $known = append $known $base -}}{{- end -}}
{{- end -}}
{{- if eq $state.name $name -}}
{{- fail (printf "preset: unknown preset %q; available: %s" $name (join ", " (sortAlpha $known))) -}}
{{- else -}}
{{- fail (printf "preset: %q extends %q, which is not a file of presets/" (last $state.files) $state.name) -}}
{{- end -}}
{{- end -}}
{{- $doc := fromYaml $raw -}}
{{- if hasKey $doc "Error" -}}
{{- fail (printf "preset: %s is not valid YAML: %s" $path $doc.Error) -}}
{{- end -}}
{{- $_ := set $state "files" (append $state.files $state.name) -}}
{{- if hasKey $doc "extends" -}}
{{- if has $doc.extends $state.files -}}
{{- fail (printf "preset: circular extends chain %s -> %s" (join " -> " $state.files) $doc.extends) -}}
{{- end -}}
{{- $_ := set $state "name" $doc.extends -}}
{{- else -}}
{{- $_ := set $state "done" true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $state.done -}}
{{- fail (printf "preset: extends chain of %q is longer than 16 files" $name) -}}
{{- end -}}
{{- toJson $state.files -}}
{{- end -}}

{{/*
Recursive deep merge in place, like dapo.config.deep_merge: mappings merge, everything else (lists included) is
replaced. Usage: include "dapo.deepMerge" (dict "dst" $a "src" $b)
*/}}
{{- define "dapo.deepMerge" -}}
{{- $dst := .dst -}}
{{- range $k, $v := .src -}}
{{- if and (kindIs "map" $v) (kindIs "map" (index $dst $k)) -}}
{{- include "dapo.deepMerge" (dict "dst" (index $dst $k) "src" $v) -}}
{{- else if kindIs "invalid" $v -}}
{{- $_ := set $dst $k $v -}}
{{- else -}}
{{- $_ := set $dst $k (deepCopy $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The preset with its `extends:` chain resolved (JSON), as dapo.config.load_raw_preset returns it.
*/}}
{{- define "dapo.preset" -}}
{{- $files := include "dapo.presetFiles" . | fromJsonArray -}}
{{- $merged := dict -}}
{{- range $f := reverse $files -}}
{{- $doc := fromYaml ($.Files.Get (printf "presets/%s.yaml" $f)) -}}
{{- $_ := unset $doc "extends" -}}
{{- include "dapo.deepMerge" (dict "dst" $merged "src" $doc) -}}
{{- end -}}
{{- toJson $merged -}}
{{- end -}}

{{/*
The preset after the values' `overrides` that are preset keys (root recipe, placement, local, name, description,
target_aime), applied like dapo.config.apply_overrides: each `a.b.c=VALUE` sets the key, VALUE read as YAML. What
the training run really uses for its paths, experiment name and model (evaluation, NOTES, model download).
*/}}
{{- define "dapo.effectivePreset" -}}
{{- $p := include "dapo.preset" . | fromJson -}}
{{- range $o := .Values.overrides -}}
{{- $kv := regexSplit "=" $o 2 -}}
{{- $key := trim (first $kv) -}}
{{- $root := first (splitList "." (regexReplaceAll "^[+~]+" $key "")) -}}
{{- if has $root (list "recipe" "placement" "local" "name" "description" "target_aime") -}}
{{- $val := "" -}}
{{- if trim (last $kv) -}}{{- $val = (fromYaml (printf "v: %s" (last $kv))).v -}}{{- end -}}
{{- $parts := splitList "." $key -}}
{{- $node := $p -}}
{{- range $part := initial $parts -}}
{{- if kindIs "invalid" (index $node $part) -}}{{- $_ := set $node $part dict -}}{{- end -}}
{{- if not (kindIs "map" (index $node $part)) -}}
{{- fail (printf "overrides: %q: %q is not a mapping in the preset" $o $part) -}}
{{- end -}}
{{- $node = index $node $part -}}
{{- end -}}
{{- $_ := set $node (last $parts) $val -}}
{{- end -}}
{{- end -}}
{{- toJson $p -}}
{{- end -}}

{{/*
Hugging Face repo id of the effective preset's model ("" for built-in models and local paths): what the model
download init container fetches.
*/}}
{{- define "dapo.modelRepo" -}}
{{- $p := include "dapo.effectivePreset" . | fromJson -}}
{{- $path := toString ((($p.recipe | default dict).model | default dict).path | default "") -}}
{{- if regexMatch "^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$" $path -}}{{- $path -}}{{- end -}}
{{- end -}}

{{/*
True ("true") when the data preparation downloads the model and the Ray pods run with HF_HUB_OFFLINE=1.
*/}}
{{- define "dapo.hubOffline" -}}
{{- if and .Values.dataPrep.enabled .Values.dataPrep.fetchModel (include "dapo.modelRepo" .) -}}true{{- end -}}
{{- end -}}

{{/*
Effective placement (JSON): backend, nodes and GPUs per node of the training cluster and of the evaluation cluster,
and whether verl runs on CPU (placement.accelerator: cpu: its GPUs are logical Ray slots, no device is requested).
The preset decides unless values override; the chart needs these keys spelled out in the preset chain.
*/}}
{{- define "dapo.placement" -}}
{{- $p := include "dapo.preset" . | fromJson -}}
{{- $pl := $p.placement | default dict -}}
{{- range $k := list "backend" "nodes" "gpus_per_node" -}}
{{- if not (hasKey $pl $k) -}}
{{- fail (printf "preset: %q does not set placement.%s (the chart reads it from the preset chain)" $.Values.preset $k) -}}
{{- end -}}
{{- end -}}
{{- $nodes := $pl.nodes | int -}}
{{- if not (kindIs "invalid" .Values.nodes) -}}{{- $nodes = .Values.nodes | int -}}{{- end -}}
{{- $gpus := $pl.gpus_per_node | int -}}
{{- if not (kindIs "invalid" .Values.gpusPerNode) -}}{{- $gpus = .Values.gpusPerNode | int -}}{{- end -}}
{{- $evalGpus := $gpus -}}
{{- if not (kindIs "invalid" .Values.eval.gpusPerNode) -}}{{- $evalGpus = .Values.eval.gpusPerNode | int -}}{{- end -}}
{{- /* verl's own workers on CPU (placement.accelerator: cpu, dapo.backends.verl.cpu): the GPUs are logical Ray slots */ -}}
{{- $cpu := and (ne $pl.backend "local") (eq (toString ($pl.accelerator | default "h100")) "cpu") -}}
{{- toJson (dict "backend" $pl.backend "nodes" $nodes "gpus" $gpus "evalGpus" $evalGpus "cpu" $cpu) -}}
{{- end -}}

{{/*
Substitute ${trainer.<key>} references of a preset path with the preset's trainer values (the only interpolation
the presets use). Usage: include "dapo.trainerPath" (dict "path" $s "trainer" $trainer)
*/}}
{{- define "dapo.trainerPath" -}}
{{- $s := .path -}}
{{- range $k, $v := .trainer -}}
{{- if or (kindIs "string" $v) (kindIs "float64" $v) (kindIs "int" $v) (kindIs "int64" $v) -}}
{{- $s = replace (printf "${trainer.%s}" $k) (toString $v) $s -}}
{{- end -}}
{{- end -}}
{{- if contains "${" $s -}}
{{- fail (printf "preset: cannot resolve %q (only ${trainer.<key>} references are supported)" .path) -}}
{{- end -}}
{{- $s -}}
{{- end -}}

{{/*
runtimeEnvYAML of a RayJob: env only, the code is in the image. Keys sorted, values double-quoted.
Usage: include "dapo.runtimeEnvYAML" (dict "env" $map); empty output when there is nothing to set.
*/}}
{{- define "dapo.runtimeEnvYAML" -}}
{{- if .env -}}
env_vars:
{{- range $k, $v := .env }}
  {{ $k | quote }}: {{ $v | quote }}
{{- end }}
{{ end -}}
{{- end -}}

{{/*
Where each secret goes (dapo.k8s.pods.PodTemplates: hub_reads, eval_logs_wandb, wandb_key, hf_token_here).
dapo.hubReads: "true" when the training run downloads its model from the hub itself (a hub model the data
preparation does not fetch): its driver and verl's workers, on the training workers, then need the HF token.
*/}}
{{- define "dapo.hubReads" -}}
{{- if and (include "dapo.modelRepo" .) (not (include "dapo.hubOffline" .)) -}}true{{- end -}}
{{- end -}}

{{/*
"true" when `dapo eval run` logs to wandb (--wandb-project in eval.extraArgs, WANDB_PROJECT in eval.runtimeEnv).
*/}}
{{- define "dapo.evalLogsWandb" -}}
{{- $on := hasKey (.Values.eval.runtimeEnv | default dict) "WANDB_PROJECT" -}}
{{- range .Values.eval.extraArgs -}}
{{- if eq (first (splitList "=" (toString .))) "--wandb-project" -}}{{- $on = true -}}{{- end -}}
{{- end -}}
{{- if $on -}}true{{- end -}}
{{- end -}}

{{/*
"true" for a Ray container that gets WANDB_API_KEY: the training workers (the driver runs on one of them:
entrypointNumCpus 1, head num-cpus 0), the evaluation head when the evaluation logs to wandb (its driver runs there).
Usage: include "dapo.wandbKey" (dict "root" $ "head" true "kind" "train")
*/}}
{{- define "dapo.wandbKey" -}}
{{- if or (and (eq .kind "train") (not .head)) (and (eq .kind "eval") .head (include "dapo.evalLogsWandb" .root)) -}}true{{- end -}}
{{- end -}}

{{/*
"true" for a Ray container that gets the HF token file: the training workers when the run reads the hub.
*/}}
{{- define "dapo.hfTokenHere" -}}
{{- if and (eq .kind "train") (not .head) (include "dapo.hubReads" .root) -}}true{{- end -}}
{{- end -}}

{{/*
The Hugging Face token as a file (huggingface_hub reads HF_TOKEN_PATH), never an environment variable: the volume
of the Secret's hfTokenKey. dapo.k8s.pods.HF_TOKEN_DIR is the same path.
*/}}
{{- define "dapo.hfTokenVolume" -}}
- name: hf-token
  secret:
    secretName: {{ .Values.secret.name | quote }}
    optional: {{ .Values.secret.hfTokenOptional }}
    items:
      - key: {{ .Values.secret.hfTokenKey | quote }}
        path: token
{{- end -}}

{{/*
Environment of every Ray container. Usage: include "dapo.env" (dict "root" $ "head" true "kind" "train")
*/}}
{{- define "dapo.env" -}}
{{- $v := .root.Values -}}
- name: HF_HOME
  value: {{ $v.storage.hfHome | quote }}
{{- if include "dapo.hfTokenHere" . }}
- name: HF_TOKEN_PATH
  value: /var/run/secrets/dapo/hf/token
{{- end }}
{{- if include "dapo.wandbKey" . }}
- name: WANDB_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $v.secret.name | quote }}
      key: {{ $v.secret.wandbApiKeyKey | quote }}
      optional: {{ $v.secret.wandbApiKeyOptional }}
{{- end }}
{{- if include "dapo.hubOffline" .root }}
- name: HF_HUB_OFFLINE
  value: "1"
{{- end }}
{{- with $v.wandb.entity }}
- name: WANDB_ENTITY
  value: {{ . | quote }}
{{- end }}
- name: RAY_memory_monitor_refresh_ms
  value: "0"
{{- if .head }}
- name: NVIDIA_VISIBLE_DEVICES
  value: void
{{- end }}
{{- range $k, $val := $v.nccl }}
- name: {{ $k | quote }}
  value: {{ $val | quote }}
{{- end }}
{{- range $k, $val := $v.env }}
- name: {{ $k | quote }}
  value: {{ $val | quote }}
{{- end }}
{{- end -}}

{{/*
Pod-level settings shared by head and workers. Usage: include "dapo.podCommon" $
*/}}
{{- define "dapo.podCommon" -}}
automountServiceAccountToken: {{ .Values.automountServiceAccountToken }}
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .Values.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.schedulerName }}
schedulerName: {{ . }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
Annotations of a Ray pod: the do-not-disrupt pair (disruption.doNotDisrupt), then the group's own (they win), then
checkov's skips with their reasons (dapo.rayPodSkips of the pod's spec).
Usage: include "dapo.podAnnotations" (dict "root" $ "own" $v.head.annotations "skips" $list); empty when there are none.
*/}}
{{- define "dapo.podAnnotations" -}}
{{- $a := dict -}}
{{- if .root.Values.disruption.doNotDisrupt -}}
{{- $_ := set $a "karpenter.sh/do-not-disrupt" "true" -}}
{{- $_ := set $a "cluster-autoscaler.kubernetes.io/safe-to-evict" "false" -}}
{{- end -}}
{{- range $k, $val := (.own | default dict) -}}{{- $_ := set $a $k $val -}}{{- end -}}
{{- with .skips -}}
{{- range $k, $val := (include "dapo.checkovSkips" . | fromYaml) -}}{{- $_ := set $a $k $val -}}{{- end -}}
{{- end -}}
{{- with $a -}}{{- toYaml . -}}{{- end -}}
{{- end -}}

{{/*
Container-level settings shared by the Ray containers (head and workers). A GPU worker checks its NVIDIA driver at
start (postStart): a driver too old for the image's CUDA fails the pod with that message in its events.
Usage: include "dapo.rayContainerCommon" (dict "root" $ "gpuCheck" true|false)
*/}}
{{- define "dapo.rayContainerCommon" -}}
lifecycle:
  {{- if and .gpuCheck (gt (int .root.Values.worker.minDriver) 0) }}
  postStart:
    exec:
      command: ["python", "-m", "dapo.cluster.gpu_check", "--min-driver", {{ .root.Values.worker.minDriver | int | toString | quote }}]
  {{- end }}
  preStop:
    exec:
      command: ["/bin/sh", "-c", "ray stop"]
{{- $sc := deepCopy (.root.Values.securityContext | default dict) -}}
{{- if .root.Values.ipcLock -}}
{{- $caps := deepCopy ($sc.capabilities | default dict) -}}
{{- $add := $caps.add | default list -}}
{{- if not (has "IPC_LOCK" $add) -}}{{- $add = append $add "IPC_LOCK" -}}{{- end -}}
{{- $_ := set $caps "add" $add -}}
{{- $_ := set $sc "capabilities" $caps -}}
{{- end -}}
{{- with $sc }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The container half of the Pod Security Standard "restricted": the securityContext of the chart's helper containers
(data preparation, model download, submitter, helm tests). dapo.k8s.security.RESTRICTED_CONTAINER is the same.
*/}}
{{- define "dapo.restrictedContainer" -}}
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
{{- end -}}

{{/*
A group's sidecarContainers split into Kubernetes native sidecars (restartPolicy: Always: init containers that keep
running, started -- startupProbe passed -- before the main containers) and ordinary ones (more containers).
JSON {"native": [...], "plain": [...]}. dapo.k8s.pods.split_sidecars is the twin.
*/}}
{{- define "dapo.splitSidecars" -}}
{{- $native := list -}}
{{- $plain := list -}}
{{- range $c := . | default list -}}
{{- if eq (toString $c.restartPolicy) "Always" -}}
{{- $native = append $native $c -}}
{{- else -}}
{{- $plain = append $plain $c -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "native" $native "plain" $plain) -}}
{{- end -}}

{{/*
fabric.ncclEnvProfile: the shell text a Ray worker container runs before KubeRay's `ulimit ...; ray start ...` (KubeRay
v1.7 BuildPod: "<container args> && <generated command>"), so that every Ray process of the pod inherits the
variables of the NCCL plugin installer's profile; a missing profile ends the container. Empty without a profile.
dapo.k8s.pods.env_profile_command is the twin.
*/}}
{{- define "dapo.envProfileCommand" -}}
{{- with .Values.fabric.ncclEnvProfile -}}
if [ -r "{{ . }}" ]; then . "{{ . }}"; echo "dapo: sourced {{ . }} (fabric.ncclEnvProfile)"; else echo "dapo: fabric.ncclEnvProfile {{ . }} does not exist on this node: the NCCL plugin installer DaemonSet has not installed it (docs/deploy.md, The fabric)" >&2; exit 1; fi
{{- end -}}
{{- end -}}

{{/*
Volumes of a Ray pod. Usage: include "dapo.volumes" (dict "root" $ "shm" "16Gi" "presets" true "hfToken" false
"extra" $list)
*/}}
{{- define "dapo.volumes" -}}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .shm }}
- name: shared
  persistentVolumeClaim:
    claimName: {{ include "dapo.claimName" .root }}
{{- if .presets }}
- name: presets
  configMap:
    name: {{ include "dapo.presetConfigMapName" .root }}
{{- end }}
{{- if .hfToken }}
{{ include "dapo.hfTokenVolume" .root }}
{{- end }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "dapo.volumeMounts" -}}
- name: dshm
  mountPath: /dev/shm
- name: shared
  mountPath: {{ .root.Values.storage.mountPath }}
{{- if .presets }}
- name: presets
  mountPath: {{ .root.Values.train.presetDir }}
  readOnly: true
{{- end }}
{{- if .hfToken }}
- name: hf-token
  mountPath: /var/run/secrets/dapo/hf
  readOnly: true
{{- end }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Init containers of the Ray head, in order: fix-ownership (storage.fixOwnership, as root), data-prepare
(dataPrep.enabled), model-fetch (dataPrep.fetchModel and a hub model). Usage: include "dapo.headInitContainers"
(dict "root" $ "image" $image); empty when there are none.
*/}}
{{- define "dapo.headInitContainers" -}}
{{- $v := .root.Values -}}
{{- if $v.storage.fixOwnership.enabled }}
{{ include "dapo.fixOwnershipInitContainer" . }}
{{- end }}
{{- if $v.dataPrep.enabled }}
{{ include "dapo.dataPrepInitContainer" . }}
{{- with include "dapo.modelRepo" .root }}
{{- if $v.dataPrep.fetchModel }}
- name: model-fetch
  image: {{ $.image }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  terminationMessagePolicy: FallbackToLogsOnError
  command: ["hf", "download", {{ . | quote }}]
  env:
    {{- include "dapo.hubEnv" $.root | nindent 4 }}
  securityContext:
    {{- include "dapo.restrictedContainer" . | nindent 4 }}
  resources:
    {{- toYaml $v.dataPrep.resources | nindent 4 }}
  volumeMounts:
    {{- include "dapo.hubMounts" $.root | nindent 4 }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The directories storage.fixOwnership hands to uid:gid: the mount, the data and the Hugging Face cache.
*/}}
{{- define "dapo.fixOwnershipInitContainer" -}}
{{- $v := .root.Values -}}
{{- $o := $v.storage.fixOwnership -}}
{{- $dirs := list (trimSuffix "/" $v.storage.mountPath) (trimSuffix "/" $v.dataPrep.outDir) (trimSuffix "/" $v.storage.hfHome) -}}
- name: fix-ownership
  image: {{ .image }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  terminationMessagePolicy: FallbackToLogsOnError
  command:
    - /bin/sh
    - -c
    - {{ printf "set -eu; for d in %s; do mkdir -p \"$d\"; chown %d:%d \"$d\"; chmod 2775 \"$d\"; done; ls -ld %s" (join " " (uniq $dirs)) (int $o.uid) (int $o.gid) (join " " (uniq $dirs)) | quote }}
  securityContext:
    runAsUser: 0
    runAsGroup: 0
    runAsNonRoot: false
    allowPrivilegeEscalation: false
    capabilities:
      drop: [ALL]
      add: [CHOWN, DAC_OVERRIDE, FOWNER]
  resources:
    requests:
      cpu: 100m
      memory: 64Mi
    limits:
      cpu: 100m
      memory: 64Mi
  volumeMounts:
    - name: shared
      mountPath: {{ $v.storage.mountPath }}
{{- end -}}

{{/*
HF_HOME and the token file of the download steps (data preparation, model download), then env; their mounts.
*/}}
{{- define "dapo.hubEnv" -}}
- name: HF_HOME
  value: {{ .Values.storage.hfHome | quote }}
- name: HF_TOKEN_PATH
  value: /var/run/secrets/dapo/hf/token
{{- range $k, $val := .Values.env }}
- name: {{ $k | quote }}
  value: {{ $val | quote }}
{{- end }}
{{- end -}}

{{- define "dapo.hubMounts" -}}
- name: shared
  mountPath: {{ .Values.storage.mountPath }}
- name: hf-token
  mountPath: /var/run/secrets/dapo/hf
  readOnly: true
{{- end -}}

{{/*
The data preparation init container of the Ray head.
*/}}
{{- define "dapo.dataPrepInitContainer" -}}
{{- $cmd := list "dapo" "data" "prepare" "--out" .root.Values.dataPrep.outDir -}}
{{- if .root.Values.dataPrep.dedup -}}{{- $cmd = append $cmd "--dedup" -}}{{- end -}}
{{- range .root.Values.dataPrep.extraArgs -}}{{- $cmd = append $cmd . -}}{{- end -}}
- name: data-prepare
  image: {{ .image }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  terminationMessagePolicy: FallbackToLogsOnError
  command:
    {{- toYaml $cmd | nindent 4 }}
  env:
    {{- include "dapo.hubEnv" .root | nindent 4 }}
  securityContext:
    {{- include "dapo.restrictedContainer" . | nindent 4 }}
  resources:
    {{- toYaml .root.Values.dataPrep.resources | nindent 4 }}
  volumeMounts:
    {{- include "dapo.hubMounts" .root | nindent 4 }}
{{- end -}}

{{/*
A RayJob. Usage: include "dapo.rayJob" (dict "root" $ "kind" "train"|"eval" "name" $name "job" .Values.train
  "entrypoint" $cmd "runtimeEnv" $envMap "image" $image "nodes" $n "gpus" $g "presets" true|false
  "specHash" $sha256 "rayVersion" $version
  ["entrypointNumCpus" $cpus] ["logicalGpus" $l])   (rayVersion optional: default .Values.rayVersion)
specHash goes into the annotation dapo-k8s.github.io/spec-sha256 (see dapo.rayJobWithHash); "" leaves it out.
gpus 0 renders a CPU worker group (no nvidia.com/gpu). logicalGpus N > 0 (verl on CPU) declares N logical Ray GPUs and
N x 8 logical CPUs per worker (rayStartParams num-gpus / num-cpus; dapo.backends.verl.settings.CPU_RAY_CPUS_PER_GPU).
*/}}
{{- define "dapo.rayJob" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $job := .job -}}
apiVersion: ray.io/v1
kind: RayJob
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  {{- with .specHash }}
  annotations:
    dapo-k8s.github.io/spec-sha256: {{ . }}
  {{- end }}
  labels:
    {{- include "dapo.labels" (dict "root" $root "component" .kind) | nindent 4 }}
    {{- if eq $v.queue.scheduler "kueue" }}
    kueue.x-k8s.io/queue-name: {{ $v.queue.name }}
    {{- else if eq $v.queue.scheduler "volcano" }}
    volcano.sh/queue-name: {{ $v.queue.name }}
    {{- else if eq $v.queue.scheduler "kai" }}
    kai.scheduler/queue: {{ $v.queue.name }}
    {{- end }}
spec:
  entrypoint: {{ .entrypoint | quote }}
  {{- with .entrypointNumCpus }}
  entrypointNumCpus: {{ . }}
  {{- end }}
  {{- with (include "dapo.runtimeEnvYAML" (dict "env" .runtimeEnv)) }}
  runtimeEnvYAML: |
    {{- . | nindent 4 }}
  {{- end }}
  submissionMode: {{ $job.submissionMode }}
  backoffLimit: {{ $job.backoffLimit | int }}
  {{- if not (kindIs "invalid" $job.activeDeadlineSeconds) }}
  activeDeadlineSeconds: {{ $job.activeDeadlineSeconds | int }}
  {{- end }}
  {{- if not (kindIs "invalid" $job.preRunningDeadlineSeconds) }}
  preRunningDeadlineSeconds: {{ $job.preRunningDeadlineSeconds | int }}
  {{- end }}
  shutdownAfterJobFinishes: {{ $job.shutdownAfterJobFinishes }}
  ttlSecondsAfterFinished: {{ $job.ttlSecondsAfterFinished | int }}
  {{- with $job.deletionRules }}
  deletionStrategy:
    deletionRules:
      {{- toYaml . | nindent 6 }}
  {{- end }}
  {{- if eq $job.submissionMode "K8sJobMode" }}
  submitterConfig:
    backoffLimit: {{ $job.submitter.backoffLimit | int }}
  submitterPodTemplate:
    metadata:
      labels:
        {{- include "dapo.selectorLabels" (dict "root" $root "component" (printf "%s-submitter" .kind)) | nindent 8 }}
      annotations:
        {{- include "dapo.checkovSkips" (include "dapo.submitterSkips" .image | fromJsonArray) | nindent 8 }}
    spec:
      restartPolicy: Never
      # KubeRay's submitter script only talks to the head's dashboard: no API token
      automountServiceAccountToken: {{ $v.automountServiceAccountToken }}
      {{- with $v.serviceAccountName }}
      serviceAccountName: {{ . }}
      {{- end }}
      {{- with $v.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $v.podSecurityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.head.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.head.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        # no command: KubeRay fills in its submitter script, which checks `ray job status` before submitting
        - name: ray-job-submitter
          image: {{ .image }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          # the Ray CLI's submit and log follow write no file (an HTTP client; docs/deploy.md)
          securityContext:
            {{- include "dapo.restrictedContainer" . | nindent 12 }}
            readOnlyRootFilesystem: true
          resources:
            {{- toYaml $job.submitter.resources | nindent 12 }}
  {{- end }}
  rayClusterSpec:
    rayVersion: {{ .rayVersion | default $v.rayVersion | quote }}
    enableInTreeAutoscaling: false
    {{- if $v.rayAuth.enabled }}
    # KubeRay sets RAY_AUTH_MODE / RAY_AUTH_TOKEN on every Ray container and sends the token on HTTPMode requests
    authOptions:
      mode: token
      {{- with $v.rayAuth.secretName }}
      secretName: {{ . }}
      {{- end }}
    {{- end }}
    headGroupSpec:
      rayStartParams:
        {{- toYaml $v.head.rayStartParams | nindent 8 }}
      template:
        metadata:
          labels:
            {{- include "dapo.selectorLabels" (dict "root" $root "component" (printf "%s-head" .kind)) | nindent 12 }}
            {{- with $v.head.labels }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- with (include "dapo.podAnnotations" (dict "root" $root "own" $v.head.annotations "skips" .skips.head)) }}
          annotations:
            {{- . | nindent 12 }}
          {{- end }}
        spec:
          {{- with (include "dapo.podCommon" $root | trim) }}
          {{- . | nindent 10 }}
          {{- end }}
          {{- with $v.head.restartPolicy }}
          restartPolicy: {{ . }}
          {{- end }}
          {{- with $v.head.runtimeClassName }}
          runtimeClassName: {{ . }}
          {{- end }}
          {{- with $v.head.nodeSelector }}
          nodeSelector:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $v.head.tolerations }}
          tolerations:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $v.head.affinity }}
          affinity:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- $headSidecars := include "dapo.splitSidecars" $v.head.sidecarContainers | fromJson }}
          {{- $headInit := include "dapo.headInitContainers" (dict "root" $root "image" .image) | trim }}
          {{- if or $headSidecars.native $headInit }}
          initContainers:
            {{- with $headSidecars.native }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            {{- with $headInit }}
            {{- . | nindent 12 }}
            {{- end }}
          {{- end }}
          containers:
            - name: ray-head
              image: {{ .image }}
              imagePullPolicy: {{ $v.image.pullPolicy }}
              ports:
                - name: gcs-server
                  containerPort: 6379
                - name: dashboard
                  containerPort: 8265
                - name: client
                  containerPort: 10001
                # no serve port: the evaluation's Serve proxy listens on the head's loopback (dapo.eval.serve)
              env:
                {{- include "dapo.env" (dict "root" $root "head" true "kind" .kind) | nindent 16 }}
              resources:
                {{- toYaml $v.head.resources | nindent 16 }}
              volumeMounts:
                {{- include "dapo.volumeMounts" (dict "root" $root "presets" .presets "extra" $v.head.extraVolumeMounts) | nindent 16 }}
              {{- include "dapo.rayContainerCommon" (dict "root" $root "gpuCheck" false) | nindent 14 }}
            {{- with $headSidecars.plain }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          volumes:
            {{- include "dapo.volumes" (dict "root" $root "shm" $v.head.shmSize "presets" .presets "hfToken" $v.dataPrep.enabled "extra" $v.head.extraVolumes) | nindent 12 }}
    {{- if gt (int .nodes) 0 }}
    workerGroupSpecs:
      - groupName: {{ $v.worker.groupName }}
        replicas: {{ .nodes | int }}
        minReplicas: {{ .nodes | int }}
        maxReplicas: {{ .nodes | int }}
        {{- $params := deepCopy ($v.worker.rayStartParams | default dict) }}
        {{- if gt (int (.logicalGpus | default 0)) 0 }}
        {{- $_ := set $params "num-gpus" (toString (int .logicalGpus)) }}
        {{- $_ := set $params "num-cpus" (toString (mul 8 (int .logicalGpus))) }}
        {{- end }}
        {{- with $params }}
        rayStartParams:
          {{- toYaml . | nindent 10 }}
        {{- else }}
        rayStartParams: {}
        {{- end }}
        template:
          metadata:
            labels:
              {{- include "dapo.selectorLabels" (dict "root" $root "component" (printf "%s-worker" .kind)) | nindent 14 }}
              {{- with $v.worker.labels }}
              {{- toYaml . | nindent 14 }}
              {{- end }}
            {{- with (include "dapo.podAnnotations" (dict "root" $root "own" $v.worker.annotations "skips" .skips.worker)) }}
            annotations:
              {{- . | nindent 14 }}
            {{- end }}
          spec:
            {{- with (include "dapo.podCommon" $root | trim) }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- with $v.worker.runtimeClassName }}
            runtimeClassName: {{ . }}
            {{- end }}
            {{- with $v.worker.nodeSelector }}
            nodeSelector:
              {{- toYaml . | nindent 14 }}
            {{- end }}
            {{- with $v.worker.tolerations }}
            tolerations:
              {{- toYaml . | nindent 14 }}
            {{- end }}
            {{- $affinity := deepCopy ($v.worker.affinity | default dict) -}}
            {{- if $v.worker.onePerHost -}}
            {{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "dapo.selectorLabels" (dict "root" $root "component" (printf "%s-worker" .kind)) | fromYaml)) -}}
            {{- $_ := set $affinity "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term)) -}}
            {{- end }}
            {{- with $affinity }}
            affinity:
              {{- toYaml . | nindent 14 }}
            {{- end }}
            {{- $workerSidecars := include "dapo.splitSidecars" $v.worker.sidecarContainers | fromJson }}
            {{- with $workerSidecars.native }}
            initContainers:
              {{- toYaml . | nindent 14 }}
            {{- end }}
            containers:
              - name: ray-worker
                image: {{ .image }}
                imagePullPolicy: {{ $v.image.pullPolicy }}
                {{- with (include "dapo.envProfileCommand" $root) }}
                args:
                  - {{ . | quote }}
                {{- end }}
                env:
                  {{- include "dapo.env" (dict "root" $root "head" false "kind" .kind) | nindent 18 }}
                {{- $res := deepCopy $v.worker.resources -}}
                {{- range $section := list "requests" "limits" -}}
                {{- $r := index $res $section | default dict -}}
                {{- if gt (int $.gpus) 0 -}}
                {{- $_ := set $r "nvidia.com/gpu" (toString $.gpus) -}}
                {{- end -}}
                {{- range $k, $val := $v.worker.extraResources -}}
                {{- $_ := set $r $k $val -}}
                {{- end -}}
                {{- $_ := set $res $section $r -}}
                {{- end }}
                resources:
                  {{- toYaml $res | nindent 18 }}
                volumeMounts:
                  {{- include "dapo.volumeMounts" (dict "root" $root "presets" .presets "hfToken" (include "dapo.hfTokenHere" (dict "root" $root "head" false "kind" .kind)) "extra" $v.worker.extraVolumeMounts) | nindent 18 }}
                {{- include "dapo.rayContainerCommon" (dict "root" $root "gpuCheck" (gt (int .gpus) 0)) | nindent 16 }}
              {{- with $workerSidecars.plain }}
              {{- toYaml . | nindent 14 }}
              {{- end }}
            volumes:
              {{- include "dapo.volumes" (dict "root" $root "shm" $v.worker.shmSize "presets" .presets "hfToken" (include "dapo.hfTokenHere" (dict "root" $root "head" false "kind" .kind)) "extra" $v.worker.extraVolumes) | nindent 14 }}
    {{- end }}
{{- end -}}

{{/*
The RayJob with the annotation dapo-k8s.github.io/spec-sha256: the SHA-256 of the JSON of its spec (Go's toJson:
keys sorted, no spaces) and, for training, of the preset files it reads, so that an upgrade can tell whether it
would change what the next retry runs. Same arguments as dapo.rayJob.
*/}}
{{- define "dapo.rayJobWithHash" -}}
{{- /* checkov's skips of each pod template, from the templates rendered without them (they read only the spec) */ -}}
{{- $bare := include "dapo.rayJob" (merge (dict "specHash" "" "skips" dict) .) | fromYaml -}}
{{- $cluster := $bare.spec.rayClusterSpec -}}
{{- $v := .root.Values -}}
{{- $head := dict "spec" $cluster.headGroupSpec.template.spec "sidecars" $v.head.sidecarContainers -}}
{{- $skips := dict "head" (include "dapo.rayPodSkips" $head | fromJsonArray) -}}
{{- range $cluster.workerGroupSpecs | default list -}}
{{- $worker := dict "spec" .template.spec "sidecars" $v.worker.sidecarContainers -}}
{{- $_ := set $skips "worker" (include "dapo.rayPodSkips" $worker | fromJsonArray) -}}
{{- end -}}
{{- $_ := set . "skips" $skips -}}
{{- $obj := include "dapo.rayJob" (merge (dict "specHash" "") .) | fromYaml -}}
{{- $content := dict "spec" $obj.spec -}}
{{- if .presets -}}
{{- $files := dict -}}
{{- range $f := include "dapo.presetFiles" .root | fromJsonArray -}}
{{- $_ := set $files (printf "%s.yaml" $f) ($.root.Files.Get (printf "presets/%s.yaml" $f)) -}}
{{- end -}}
{{- $_ := set $content "presetFiles" $files -}}
{{- end -}}
{{- $hash := toJson $content | sha256sum -}}
{{- include "dapo.upgradeGuard" (dict "root" .root "kind" .kind "name" .name "hash" $hash) -}}
{{- include "dapo.rayJob" (merge (dict "specHash" $hash) .) -}}
{{- end -}}

{{/*
helm upgrade of a live or finished run: KubeRay ignores a change to an existing RayJob's spec, but builds the next
retry from it (another node count would load 128-rank FSDP shards on 64 ranks). `lookup` reads the RayJob in the
cluster (nothing during `helm template` / install dry runs) and the upgrade is refused when its spec-sha256 differs.
dapo.k8s.upgrade.upgrade_refusal is the same rule for scripts/render.py --apply.
*/}}
{{- define "dapo.upgradeGuard" -}}
{{- $live := lookup "ray.io/v1" "RayJob" .root.Release.Namespace .name -}}
{{- if $live -}}
{{- $old := index (($live.metadata | default dict).annotations | default dict) "dapo-k8s.github.io/spec-sha256" | default "" -}}
{{- if ne $old .hash -}}
{{- $status := (($live.status | default dict).jobDeploymentStatus | default "unknown") -}}
{{- $delete := printf "kubectl -n %s delete rayjob %s" .root.Release.Namespace .name -}}
{{- if .root.Values.logs.enabled -}}
{{- $delete = printf "kubectl -n %s delete rayjob/%s job/%s-logs" .root.Release.Namespace .name .name -}}
{{- end -}}
{{- fail (printf "%s: the RayJob %s already exists in namespace %s (deployment status %s) and this release would change its spec; KubeRay ignores the change now but builds the next retry from it. Delete the RayJob first (%s; a new attempt resumes from the latest checkpoint) or install the change as a new release with its own recipe.trainer.experiment_name" .kind .name .root.Release.Namespace $status $delete) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Pod settings of the helm test pods: never restarted, the Ray pods' account, pull secrets and pod securityContext.
*/}}
{{- define "dapo.testPodCommon" -}}
restartPolicy: Never
automountServiceAccountToken: false
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The shell script of the shared-volume test pod (dapo.k8s.helm_tests, shared_test_script, is the same text).
*/}}
{{- define "dapo.sharedTestScript" -}}
{{- $mount := trimSuffix "/" .Values.storage.mountPath -}}
{{- printf "set -u; f=%s/.dapo-helm-test-$(hostname); want=\"written by uid $(id -u) gid $(id -g)\"; if ! echo \"$want\" > \"$f\"; then echo \"cannot write %s as uid $(id -u) gid $(id -g): set podSecurityContext.fsGroup or storage.fixOwnership.enabled (docs/deploy.md)\" >&2; exit 1; fi; if [ \"$(cat \"$f\")\" != \"$want\" ]; then echo \"%s: read back differs from what was written\" >&2; exit 1; fi; rm -f \"$f\"; for d in %s %s; do if [ -e \"$d\" ] && [ ! -w \"$d\" ]; then echo \"$d is not writable by uid $(id -u)\" >&2; exit 1; fi; done; echo \"%s: write and read back OK as uid $(id -u)\"" $mount $mount $mount .Values.dataPrep.outDir .Values.storage.hfHome $mount -}}
{{- end -}}
