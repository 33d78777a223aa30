{{/*
The log followers (logs.enabled): one Job per RayJob that prints every attempt's driver log as one stream,
`python -m dapo.cluster.follow`.
*/}}

{{/*
The directory of the attempt-<N>.log files of the training run: <trainer.default_local_dir>/logs of the preset after
the overrides, or, with train.runner reference, the --log-dir of the reference entrypoint.
*/}}
{{- define "dapo.trainLogDir" -}}
{{- if eq .Values.train.runner "reference" -}}
{{- regexReplaceAll "^.* --log-dir ([^ ]+) .*$" (include "dapo.referenceEntrypoint" .) "${1}" -}}
{{- else -}}
{{- $p := include "dapo.effectivePreset" . | fromJson -}}
{{- $trainer := (($p.recipe | default dict).trainer | default dict) -}}
{{- printf "%s/logs" (trimSuffix "/" (include "dapo.trainerPath" (dict "path" $trainer.default_local_dir "trainer" $trainer))) -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the training RayJob's follower acts between attempts (train.retries: nodes left out, the failure
budget, the heartbeat backstop; dapo.cluster.keeper).
*/}}
{{- define "dapo.followerActs" -}}
{{- $r := .Values.train.retries -}}
{{- if and .Values.logs.enabled .Values.train.enabled (or $r.leaveOutNodes.enabled $r.failureBudget.enabled (gt (int $r.heartbeatTimeoutSeconds) 0)) -}}true{{- end -}}
{{- end -}}

{{/*
The training follower's options for what it does between attempts (JSON list; [] for the evaluation's).
Usage: include "dapo.followerActArgs" (dict "root" $ "kind" "train")
*/}}
{{- define "dapo.followerActArgs" -}}
{{- $r := .root.Values.train.retries -}}
{{- $args := list -}}
{{- if and (eq .kind "train") (include "dapo.followerActs" .root) -}}
{{- /* the RayJob's status every 5 s: a failure the driver could not record is acted on before most retries are built */ -}}
{{- $args = list "--status-every" "5" -}}
{{- if $r.leaveOutNodes.enabled -}}
{{- $args = concat $args (list "--leave-out-nodes" (toString (int $r.leaveOutNodes.max))) -}}
{{- end -}}
{{- with $r.failureBudget -}}
{{- if .enabled -}}
{{- $args = concat $args (list "--max-failures" (toString (int .maxFailures)) "--failure-window-hours" (toString .windowHours) "--same-cause" (toString (int .sameCauseInARow))) -}}
{{- end -}}
{{- end -}}
{{- if gt (int $r.heartbeatTimeoutSeconds) 0 -}}
{{- $args = concat $args (list "--heartbeat-timeout" (toString (int $r.heartbeatTimeoutSeconds))) -}}
{{- end -}}
{{- end -}}
{{- toJson $args -}}
{{- end -}}

{{/*
The evaluation's checkpoint and output directories (JSON): eval.checkpointDir / eval.outputDir or the preset's.
*/}}
{{- define "dapo.evalDirs" -}}
{{- $p := include "dapo.effectivePreset" . | fromJson -}}
{{- $recipe := $p.recipe | default dict -}}
{{- $ckpt := .Values.eval.checkpointDir -}}
{{- if not $ckpt -}}
{{- $ckpt = include "dapo.trainerPath" (dict "path" $recipe.trainer.default_local_dir "trainer" $recipe.trainer) -}}
{{- end -}}
{{- $out := .Values.eval.outputDir | default (printf "%s/eval" (trimSuffix "/" $ckpt)) -}}
{{- toJson (dict "checkpointDir" $ckpt "outputDir" $out) -}}
{{- end -}}

{{/*
Image of the follower of RayJob kind "train" or "eval": logs.image, else the image of that RayJob.
Each "" falls back to the RayJob's image (the digest too when repository and tag are "" both). JSON {repository, tag,
digest}. Usage: include "dapo.followerImage" (dict "root" $ "kind" "train")
*/}}
{{- define "dapo.followerImage" -}}
{{- $v := .root.Values -}}
{{- $img := $v.logs.image -}}
{{- $job := include "dapo.trainImage" .root | fromJson -}}
{{- if eq .kind "eval" }}{{ $job = include "dapo.evalImage" .root | fromJson }}{{ end -}}
{{- $digest := $img.digest | default "" -}}
{{- if and (not $digest) (not $img.repository) (not $img.tag) }}{{ $digest = $job.digest }}{{ end -}}
{{- toJson (dict "repository" ($img.repository | default $job.repository) "tag" ($img.tag | default $job.tag) "digest" $digest) -}}
{{- end -}}

{{/*
A follower Job. Usage: include "dapo.followerJob" (dict "root" $ "kind" "train"|"eval" "hash" $sha256)
("" leaves the spec-sha256 annotation out). The main container `result` waits for /state/result, which the
restartable init container `follow` writes at the end, and exits with it: 1 (the run failed) or 2 fail the Job at
once (podFailurePolicy), evictions do not count.
*/}}
{{- define "dapo.followerJob" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $lg := $v.logs -}}
{{- $job := index $v .kind -}}
{{- $rayjob := include "dapo.trainJobName" $root -}}
{{- $logDir := "" -}}
{{- if eq .kind "eval" -}}
{{- $rayjob = include "dapo.evalJobName" $root -}}
{{- $logDir = printf "%s/logs" (trimSuffix "/" (include "dapo.evalDirs" $root | fromJson).outputDir) -}}
{{- else -}}
{{- $logDir = include "dapo.trainLogDir" $root -}}
{{- end -}}
{{- $pinned := include "dapo.followerImage" . | fromJson -}}
{{- $image := include "dapo.imageRef" $pinned -}}
{{- $acts := and (eq .kind "train") (include "dapo.followerActs" $root) -}}
{{- $args := dict "root" $root "kind" .kind "image" $image "logDir" $logDir "rayjob" $rayjob "writes" $acts -}}
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ $rayjob }}-logs
  namespace: {{ $root.Release.Namespace }}
  annotations:
    {{- with .hash }}
    dapo-k8s.github.io/spec-sha256: {{ . }}
    {{- end }}
    {{- include "dapo.checkovSkips" (concat (list "CKV_K8S_15" "CKV_K8S_38" "CKV_K8S_40") (include "dapo.tagOnly" $pinned | fromJsonArray)) | nindent 4 }}
  labels:
    {{- include "dapo.labels" (dict "root" $root "component" (printf "%s-logs" .kind)) | nindent 4 }}
spec:
  {{- /* failures of the follower pod before the Job gives up (a restart in place, evictions and the run's own failure
  do not count: podFailurePolicy) */}}
  backoffLimit: 3
  {{- if not (kindIs "invalid" $lg.ttlSecondsAfterFinished) }}
  ttlSecondsAfterFinished: {{ $lg.ttlSecondsAfterFinished | int }}
  {{- end }}
  podFailurePolicy:
    rules:
      - action: FailJob
        onExitCodes:
          containerName: result
          operator: In
          values: [1, 2]
      - action: Ignore
        onPodConditions:
          - type: DisruptionTarget
            status: "True"
  template:
    metadata:
      labels:
        {{- include "dapo.selectorLabels" (dict "root" $root "component" (printf "%s-logs" .kind)) | nindent 8 }}
      annotations:
        kubectl.kubernetes.io/default-container: follow
    spec:
      {{- include "dapo.followerPodSpec" $args | nindent 6 }}
{{- end -}}

{{/*
The follower Job's pod spec: its account, pull secrets, securityContext and the head's node placement, the
containers (dapo.followerContainers), the claim read-only and the state volume.
Usage: include "dapo.followerPodSpec" (dict "root" $ "kind" $k "image" $ref "logDir" $dir "rayjob" $name)
*/}}
{{- define "dapo.followerPodSpec" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $lg := $v.logs -}}
{{- $job := index $v .kind -}}
{{- $image := .image -}}
{{- $logDir := .logDir -}}
{{- $rayjob := .rayjob -}}
restartPolicy: Never
{{- if $lg.rbac.create }}
serviceAccountName: {{ include "dapo.fullname" $root }}-logs
{{- else if $lg.serviceAccountName }}
serviceAccountName: {{ $lg.serviceAccountName }}
{{- end }}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.head.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.head.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{ include "dapo.followerContainers" . }}
volumes:
  # read-only, but for the training follower that answers each attempt (train.retries: its acks, failures.json)
  - name: shared
    persistentVolumeClaim:
      claimName: {{ include "dapo.claimName" $root }}
      readOnly: {{ not .writes }}
  - name: state
    emptyDir:
      sizeLimit: 1Mi
{{- end -}}

{{/*
The follower's containers: `follow` (a restartable init container that prints the stream and writes its exit code
to /state/result) and `result` (waits for that file, exits with it). Same arguments as dapo.followerPodSpec.
*/}}
{{- define "dapo.followerContainers" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $lg := $v.logs -}}
{{- $job := index $v .kind -}}
{{- $image := .image -}}
{{- $logDir := .logDir -}}
{{- $rayjob := .rayjob -}}
initContainers:
  # restartable (a native sidecar): restarted in place, it keeps /state and prints nothing twice
  - name: follow
    image: {{ $image }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    restartPolicy: Always
    command: ["python", "-m", "dapo.cluster.follow"]
    args:
      {{- toYaml (concat (list "--log-dir" $logDir "--rayjob" $rayjob "--backoff-limit" (toString (int $job.backoffLimit)) "--state-dir" "/state" "--sidecar" "--release" $root.Release.Name "--kind" .kind "--claim" (include "dapo.claimName" $root)) (include "dapo.followerActArgs" . | fromJsonArray)) | nindent 6 }}
    env:
      - name: POD_NAMESPACE
        valueFrom:
          fieldRef:
            fieldPath: metadata.namespace
      - name: PYTHONDONTWRITEBYTECODE
        value: "1"
    resources:
      {{- toYaml $lg.resources | nindent 6 }}
    {{- with $lg.securityContext }}
    securityContext:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    volumeMounts:
      - name: shared
        mountPath: {{ $v.storage.mountPath }}
        readOnly: {{ not .writes }}
      - name: state
        mountPath: /state
containers:
  - name: result
    image: {{ $image }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    command: ["/bin/sh", "-c", {{ `until [ -s /state/result ]; do sleep 2; done; exit "$(cat /state/result)"` | quote }}]
    resources:
      {{- toYaml $lg.resources | nindent 6 }}
    {{- with $lg.securityContext }}
    securityContext:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    volumeMounts:
      - name: state
        mountPath: /state
        readOnly: true
{{- end -}}

{{/*
The follower Job with dapo-k8s.github.io/spec-sha256 (SHA-256 of the JSON of its spec)
and its upgrade guard. Usage: include "dapo.followerJobWithHash" (dict "root" $ "kind" "train")
*/}}
{{- define "dapo.followerJobWithHash" -}}
{{- $obj := include "dapo.followerJob" (dict "root" .root "kind" .kind "hash" "") | fromYaml -}}
{{- $hash := toJson (dict "spec" $obj.spec) | sha256sum -}}
{{- $rayjob := include "dapo.trainJobName" .root -}}
{{- if eq .kind "eval" }}{{ $rayjob = include "dapo.evalJobName" .root }}{{ end -}}
{{- include "dapo.followerGuard" (dict "root" .root "name" $obj.metadata.name "rayjob" $rayjob "hash" $hash) -}}
{{- include "dapo.followerJob" (dict "root" .root "kind" .kind "hash" $hash) -}}
{{- end -}}

{{/*
helm upgrade while a follower Job exists: its pod template cannot change, and a RayJob created again (a new run)
needs a new follower. `lookup` reads both (nothing during `helm template` / install dry runs); the upgrade is refused
when the Job's spec-sha256 differs or its RayJob is gone. dapo.k8s.upgrade.follower_refusal is the same rule.
*/}}
{{- define "dapo.followerGuard" -}}
{{- $ns := .root.Release.Namespace -}}
{{- $live := lookup "batch/v1" "Job" $ns .name -}}
{{- if $live -}}
{{- $old := index (($live.metadata | default dict).annotations | default dict) "dapo-k8s.github.io/spec-sha256" | default "" -}}
{{- $rj := lookup "ray.io/v1" "RayJob" $ns .rayjob -}}
{{- if or (ne $old .hash) (not $rj) -}}
{{- $why := "would change, and a Job's pod template cannot" -}}
{{- if not $rj -}}
{{- $why = printf "follows the RayJob %s, which no longer exists (this upgrade creates it again: a new run)" .rayjob -}}
{{- end -}}
{{- fail (printf "logs: the log follower Job %s already exists in namespace %s and %s. Delete it first (kubectl -n %s delete job %s; only the log follower goes, the run is not touched), or with its RayJob (kubectl -n %s delete rayjob/%s job/%s), then upgrade" .name $ns $why $ns .name $ns .rayjob .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
