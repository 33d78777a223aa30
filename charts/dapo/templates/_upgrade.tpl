{{/*
The upgrade guard of the RayJobs (the log followers' is dapo.followerGuard, _logs.tpl). dapo/k8s/upgrade.py says
the same for `scripts/render.py --apply`, which renders without a cluster.
*/}}

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
