{{/* vim: set filetype=mustache: */}}
{{/*
Names and labels. dapo/k8s/manifests.py builds the same objects in Python (scripts/render.py); a test renders
both for every preset and compares them, so change the two together.
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
Effective placement (JSON): backend, nodes and GPUs per node of the training cluster and of the evaluation cluster.
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
{{- toJson (dict "backend" $pl.backend "nodes" $nodes "gpus" $gpus "evalGpus" $evalGpus) -}}
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
Environment of every Ray container. Usage: include "dapo.env" (dict "root" $ "head" true)
*/}}
{{- define "dapo.env" -}}
{{- $v := .root.Values -}}
- name: HF_HOME
  value: {{ $v.storage.hfHome | quote }}
- name: HF_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $v.secret.name | quote }}
      key: {{ $v.secret.hfTokenKey | quote }}
      optional: {{ $v.secret.hfTokenOptional }}
- name: WANDB_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $v.secret.name | quote }}
      key: {{ $v.secret.wandbApiKeyKey | quote }}
      optional: {{ $v.secret.wandbApiKeyOptional }}
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
{{- end -}}

{{/*
Container-level settings shared by the Ray containers (head and workers).
*/}}
{{- define "dapo.rayContainerCommon" -}}
lifecycle:
  preStop:
    exec:
      command: ["/bin/sh", "-c", "ray stop"]
{{- if .Values.ipcLock }}
securityContext:
  capabilities:
    add: ["IPC_LOCK"]
{{- end }}
{{- end -}}

{{/*
Volumes of a Ray pod. Usage: include "dapo.volumes" (dict "root" $ "shm" "16Gi" "presets" true)
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
  command:
    {{- toYaml $cmd | nindent 4 }}
  env:
    - name: HF_HOME
      value: {{ .root.Values.storage.hfHome | quote }}
    - name: HF_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ .root.Values.secret.name | quote }}
          key: {{ .root.Values.secret.hfTokenKey | quote }}
          optional: {{ .root.Values.secret.hfTokenOptional }}
    {{- range $k, $val := .root.Values.env }}
    - name: {{ $k | quote }}
      value: {{ $val | quote }}
    {{- end }}
  resources:
    {{- toYaml .root.Values.dataPrep.resources | nindent 4 }}
  volumeMounts:
    - name: shared
      mountPath: {{ .root.Values.storage.mountPath }}
{{- end -}}

{{/*
A RayJob. Usage: include "dapo.rayJob" (dict "root" $ "kind" "train"|"eval" "name" $name "job" .Values.train
  "entrypoint" $cmd "runtimeEnv" $envMap "image" $image "nodes" $n "gpus" $g "presets" true|false)
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
  {{- with (include "dapo.runtimeEnvYAML" (dict "env" .runtimeEnv)) }}
  runtimeEnvYAML: |
    {{- . | nindent 4 }}
  {{- end }}
  submissionMode: {{ $job.submissionMode }}
  backoffLimit: {{ $job.backoffLimit | int }}
  {{- if not (kindIs "invalid" $job.activeDeadlineSeconds) }}
  activeDeadlineSeconds: {{ $job.activeDeadlineSeconds | int }}
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
    spec:
      restartPolicy: Never
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
          resources:
            {{- toYaml $job.submitter.resources | nindent 12 }}
  {{- end }}
  rayClusterSpec:
    rayVersion: {{ $v.rayVersion | quote }}
    enableInTreeAutoscaling: false
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
          {{- with $v.head.annotations }}
          annotations:
            {{- toYaml . | nindent 12 }}
          {{- end }}
        spec:
          {{- with (include "dapo.podCommon" $root | trim) }}
          {{- . | nindent 10 }}
          {{- end }}
          {{- with $v.head.restartPolicy }}
          restartPolicy: {{ . }}
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
          {{- if $v.dataPrep.enabled }}
          initContainers:
            {{- include "dapo.dataPrepInitContainer" (dict "root" $root "image" .image) | nindent 12 }}
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
                - name: serve
                  containerPort: 8000
              env:
                {{- include "dapo.env" (dict "root" $root "head" true) | nindent 16 }}
              resources:
                {{- toYaml $v.head.resources | nindent 16 }}
              volumeMounts:
                {{- include "dapo.volumeMounts" (dict "root" $root "presets" .presets) | nindent 16 }}
              {{- include "dapo.rayContainerCommon" $root | nindent 14 }}
          volumes:
            {{- include "dapo.volumes" (dict "root" $root "shm" $v.head.shmSize "presets" .presets) | nindent 12 }}
    {{- if gt (int .nodes) 0 }}
    workerGroupSpecs:
      - groupName: {{ $v.worker.groupName }}
        replicas: {{ .nodes | int }}
        minReplicas: {{ .nodes | int }}
        maxReplicas: {{ .nodes | int }}
        {{- with $v.worker.rayStartParams }}
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
            {{- with $v.worker.annotations }}
            annotations:
              {{- toYaml . | nindent 14 }}
            {{- end }}
          spec:
            {{- with (include "dapo.podCommon" $root | trim) }}
            {{- . | nindent 12 }}
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
            containers:
              - name: ray-worker
                image: {{ .image }}
                imagePullPolicy: {{ $v.image.pullPolicy }}
                env:
                  {{- include "dapo.env" (dict "root" $root "head" false) | nindent 18 }}
                {{- $res := deepCopy $v.worker.resources -}}
                {{- range $section := list "requests" "limits" -}}
                {{- $r := index $res $section | default dict -}}
                {{- $_ := set $r "nvidia.com/gpu" (toString $.gpus) -}}
                {{- range $k, $val := $v.worker.extraResources -}}
                {{- $_ := set $r $k $val -}}
                {{- end -}}
                {{- $_ := set $res $section $r -}}
                {{- end }}
                resources:
                  {{- toYaml $res | nindent 18 }}
                volumeMounts:
                  {{- include "dapo.volumeMounts" (dict "root" $root "presets" .presets) | nindent 18 }}
                {{- include "dapo.rayContainerCommon" $root | nindent 16 }}
            volumes:
              {{- include "dapo.volumes" (dict "root" $root "shm" $v.worker.shmSize "presets" .presets) | nindent 14 }}
    {{- end }}
{{- end -}}
