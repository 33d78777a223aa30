{{/*
The RayJobs: the object around the pod parts (_pods.tpl), its K8sJobMode submitter, and its spec hash.
*/}}

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
    kueue.x-k8s.io/queue-name: {{ $v.queue.name | quote }}
    {{- else if eq $v.queue.scheduler "volcano" }}
    volcano.sh/queue-name: {{ $v.queue.name | quote }}
    {{- else if eq $v.queue.scheduler "kai" }}
    kai.scheduler/queue: {{ $v.queue.name | quote }}
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
  {{- include "dapo.submitter" . | nindent 2 }}
  {{- end }}
  {{- include "dapo.rayClusterSpec" . | nindent 2 }}
{{- end -}}

{{/*
The RayJob's rayClusterSpec: the Ray version, token authentication (KubeRay's authOptions), the head group and
the worker group (_pods.tpl). Same arguments as dapo.rayJob.
*/}}
{{- define "dapo.rayClusterSpec" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
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
  {{- include "dapo.headGroupSpec" . | nindent 2 }}
  {{- if gt (int .nodes) 0 }}
  workerGroupSpecs:
    {{- include "dapo.workerGroupSpec" . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/*
The K8sJobMode submitter of a RayJob: submitterConfig and submitterPodTemplate (KubeRay fills in the command).
Same arguments as dapo.rayJob.
*/}}
{{- define "dapo.submitter" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $job := .job -}}
submitterConfig:
  backoffLimit: {{ $job.submitter.backoffLimit | int }}
submitterPodTemplate:
  metadata:
    labels:
      {{- include "dapo.selectorLabels" (dict "root" $root "component" (printf "%s-submitter" .kind)) | nindent 6 }}
    annotations:
      {{- include "dapo.checkovSkips" (include "dapo.submitterSkips" .image | fromJsonArray) | nindent 6 }}
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
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $v.imagePullSecrets }}
    imagePullSecrets:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $v.head.nodeSelector }}
    nodeSelector:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $v.head.tolerations }}
    tolerations:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    containers:
      # no command: KubeRay fills in its submitter script, which checks `ray job status` before submitting
      - name: ray-job-submitter
        image: {{ .image }}
        imagePullPolicy: {{ $v.image.pullPolicy }}
        # the Ray CLI's submit and log follow write no file (an HTTP client; docs/security.md)
        securityContext:
          {{- include "dapo.restrictedContainer" . | nindent 10 }}
          readOnlyRootFilesystem: true
        resources:
          {{- toYaml $job.submitter.resources | nindent 10 }}
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
