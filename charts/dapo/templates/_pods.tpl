{{/*
The pod parts of the Ray pods: which secret goes where, the containers' environment, the head group and the
worker group with their containers, init containers, sidecars and volumes.
*/}}

{{/*
Where each secret goes.
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
of the Secret's hfTokenKey.
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
# the Kubernetes node and pod of this Ray process, from the downward API: the run names a failing or slow node by them
- name: DAPO_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: DAPO_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
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
terminationGracePeriodSeconds of the training RayJob's pods when they copy their logs (train.evidence): the copy
and `ray stop` must end within it. Empty otherwise. Usage: include "dapo.evidenceGrace" (dict "root" $ "kind" $k)
*/}}
{{- define "dapo.evidenceGrace" -}}
{{- if and (eq .kind "train") .root.Values.train.evidence.enabled -}}
terminationGracePeriodSeconds: {{ .root.Values.train.evidence.terminationGracePeriodSeconds | int }}
{{- end -}}
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
The preStop command of a Ray container: the training RayJob's pods first copy their Ray logs to the run's volume
(train.evidence, dapo.cluster.evidence), then `ray stop`.
Usage: include "dapo.preStopCommand" (dict "root" $ "kind" "train"|"eval")
*/}}
{{- define "dapo.preStopCommand" -}}
{{- $ev := .root.Values.train.evidence -}}
{{- if and (eq .kind "train") $ev.enabled -}}
{{- printf "python -m dapo.cluster.evidence --log-dir %s --max-bytes %d --seconds %v; ray stop" (include "dapo.trainLogDir" .root | squote) (int64 $ev.maxBytesPerPod) $ev.seconds -}}
{{- else -}}
ray stop
{{- end -}}
{{- end -}}

{{/*
Container-level settings shared by the Ray containers (head and workers). A GPU worker checks its NVIDIA driver at
start (postStart): a driver too old for the image's CUDA fails the pod with that message in its events.
Usage: include "dapo.rayContainerCommon" (dict "root" $ "gpuCheck" true|false "kind" "train"|"eval")
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
      command: ["/bin/sh", "-c", {{ include "dapo.preStopCommand" . | quote }}]
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
(data preparation, model download, submitter, helm tests).
*/}}
{{- define "dapo.restrictedContainer" -}}
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
{{- end -}}

{{/*
A group's sidecarContainers split into Kubernetes native sidecars (restartPolicy: Always: init containers that keep
running, started -- startupProbe passed -- before the main containers) and ordinary ones (more containers).
JSON {"native": [...], "plain": [...]}.
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
*/}}
{{- define "dapo.envProfileCommand" -}}
{{- with .Values.fabric.ncclEnvProfile -}}
if [ -r "{{ . }}" ]; then . "{{ . }}"; echo "dapo: sourced {{ . }} (fabric.ncclEnvProfile)"; else echo "dapo: fabric.ncclEnvProfile {{ . }} does not exist on this node: the NCCL plugin installer DaemonSet has not installed it (docs/fabric.md)" >&2; exit 1; fi
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
The RayJob's headGroupSpec: its pod template (labels, annotations with checkov's skips, scheduling, init
containers, the ray-head container, sidecars, volumes). Same arguments as dapo.rayJob.
*/}}
{{- define "dapo.headGroupSpec" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
headGroupSpec:
  rayStartParams:
    {{- toYaml $v.head.rayStartParams | nindent 4 }}
  template:
    metadata:
      labels:
        {{- include "dapo.selectorLabels" (dict "root" $root "component" (printf "%s-head" .kind)) | nindent 8 }}
        {{- with $v.head.labels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with (include "dapo.podAnnotations" (dict "root" $root "own" $v.head.annotations "skips" .skips.head)) }}
      annotations:
        {{- . | nindent 8 }}
      {{- end }}
    spec:
      {{- with (printf "%s\n%s" (include "dapo.podCommon" $root) (include "dapo.evidenceGrace" .) | trim) }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- with $v.head.restartPolicy }}
      restartPolicy: {{ . }}
      {{- end }}
      {{- with $v.head.runtimeClassName }}
      runtimeClassName: {{ . }}
      {{- end }}
      {{- with $v.head.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.head.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.head.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- $headSidecars := include "dapo.splitSidecars" $v.head.sidecarContainers | fromJson }}
      {{- $headInit := include "dapo.headInitContainers" (dict "root" $root "image" .image) | trim }}
      {{- if or $headSidecars.native $headInit }}
      initContainers:
        {{- with $headSidecars.native }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- with $headInit }}
        {{- . | nindent 8 }}
        {{- end }}
      {{- end }}
      containers:
        {{- include "dapo.rayHeadContainer" . | nindent 8 }}
        {{- with $headSidecars.plain }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      volumes:
        {{- include "dapo.volumes" (dict "root" $root "shm" $v.head.shmSize "presets" .presets "hfToken" $v.dataPrep.enabled "extra" $v.head.extraVolumes) | nindent 8 }}
{{- end -}}

{{/*
The ray-head container (its client ports; no serve port: the evaluation's Serve proxy listens on the head's
loopback). Same arguments as dapo.rayJob.
*/}}
{{- define "dapo.rayHeadContainer" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
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
    {{- include "dapo.env" (dict "root" $root "head" true "kind" .kind) | nindent 4 }}
  resources:
    {{- toYaml $v.head.resources | nindent 4 }}
  volumeMounts:
    {{- include "dapo.volumeMounts" (dict "root" $root "presets" .presets "extra" $v.head.extraVolumeMounts) | nindent 4 }}
  {{- include "dapo.rayContainerCommon" (dict "root" $root "gpuCheck" false "kind" .kind) | nindent 2 }}
{{- end -}}

{{/*
The RayJob's one worker group: nodes replicas, logical GPUs on CPU (num-gpus, num-cpus), the pod template
(one worker per host with worker.onePerHost). Same arguments as dapo.rayJob.
*/}}
{{- define "dapo.workerGroupSpec" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
- groupName: {{ $v.worker.groupName }}
  replicas: {{ .nodes | int }}
  minReplicas: {{ .nodes | int }}
  maxReplicas: {{ .nodes | int }}
  {{- include "dapo.workerRayStartParams" . | nindent 2 }}
  template:
    metadata:
      labels:
        {{- include "dapo.selectorLabels" (dict "root" $root "component" (printf "%s-worker" .kind)) | nindent 8 }}
        {{- with $v.worker.labels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with (include "dapo.podAnnotations" (dict "root" $root "own" $v.worker.annotations "skips" .skips.worker)) }}
      annotations:
        {{- . | nindent 8 }}
      {{- end }}
    spec:
      {{- with (printf "%s\n%s" (include "dapo.podCommon" $root) (include "dapo.evidenceGrace" .) | trim) }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- with $v.worker.runtimeClassName }}
      runtimeClassName: {{ . }}
      {{- end }}
      {{- with $v.worker.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.worker.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- $affinity := deepCopy ($v.worker.affinity | default dict) -}}
      {{- if $v.worker.onePerHost -}}
      {{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "dapo.selectorLabels" (dict "root" $root "component" (printf "%s-worker" .kind)) | fromYaml)) -}}
      {{- $_ := set $affinity "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term)) -}}
      {{- end }}
      {{- with $affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- $workerSidecars := include "dapo.splitSidecars" $v.worker.sidecarContainers | fromJson }}
      {{- with $workerSidecars.native }}
      initContainers:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        {{- include "dapo.rayWorkerContainer" . | nindent 8 }}
        {{- with $workerSidecars.plain }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      volumes:
        {{- include "dapo.volumes" (dict "root" $root "shm" $v.worker.shmSize "presets" .presets "hfToken" (include "dapo.hfTokenHere" (dict "root" $root "head" false "kind" .kind)) "extra" $v.worker.extraVolumes) | nindent 8 }}
{{- end -}}

{{/*
The worker group's rayStartParams: worker.rayStartParams, with logicalGpus N > 0 (verl on CPU) num-gpus N and
num-cpus 8 N (dapo.backends.verl.settings.CPU_RAY_CPUS_PER_GPU). Same arguments as dapo.rayJob.
*/}}
{{- define "dapo.workerRayStartParams" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $params := deepCopy ($v.worker.rayStartParams | default dict) }}
{{- if gt (int (.logicalGpus | default 0)) 0 }}
{{- $_ := set $params "num-gpus" (toString (int .logicalGpus)) }}
{{- $_ := set $params "num-cpus" (toString (mul 8 (int .logicalGpus))) }}
{{- end }}
{{- with $params -}}
rayStartParams:
  {{- toYaml . | nindent 2 }}
{{- else -}}
rayStartParams: {}
{{- end }}
{{- end -}}

{{/*
The ray-worker container: its resources with the group's GPUs and worker.extraResources. Same arguments as
dapo.rayJob.
*/}}
{{- define "dapo.rayWorkerContainer" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
- name: ray-worker
  image: {{ .image }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- with (include "dapo.envProfileCommand" $root) }}
  args:
    - {{ . | quote }}
  {{- end }}
  env:
    {{- include "dapo.env" (dict "root" $root "head" false "kind" .kind) | nindent 4 }}
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
    {{- toYaml $res | nindent 4 }}
  volumeMounts:
    {{- include "dapo.volumeMounts" (dict "root" $root "presets" .presets "hfToken" (include "dapo.hfTokenHere" (dict "root" $root "head" false "kind" .kind)) "extra" $v.worker.extraVolumeMounts) | nindent 4 }}
  {{- include "dapo.rayContainerCommon" (dict "root" $root "gpuCheck" (gt (int .gpus) 0) "kind" .kind) | nindent 2 }}
{{- end -}}
