{{/* vim: set filetype=mustache: */}}
{{/*
Names, labels and images. The chart is the one source of the objects: scripts/render.py and `dapo doctor` render it
with Helm's engine, and the tests assert on Helm's output. The templates are split by concern: _presets.tpl (the preset merge), _pods.tpl (the pod
parts), _rayjob.tpl (the RayJobs), _upgrade.tpl, _validate.tpl and _security.tpl (the guards), _logs.tpl (the log
followers), _helm_tests.tpl, _reference.tpl.
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
Usage: include "dapo.imageRef" (dict "repository" $r "tag" $t "digest" $d).
*/}}
{{- define "dapo.imageRef" -}}
{{- if .digest -}}{{ printf "%s@%s" .repository .digest }}{{- else -}}{{ printf "%s:%s" .repository .tag }}{{- end -}}
{{- end -}}

{{/*
The training RayJob's image (image.*, or train.reference.image.* with the reference runner) and the evaluation's
(eval.image.*, each "" falling back to image.*; the digest only when repository and tag are "" too), as JSON
{repository, tag, digest}.
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
