{{/*
The `helm test` pods' shared parts (templates/tests/).
*/}}

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
The shell script of the shared-volume test pod.
*/}}
{{- define "dapo.sharedTestScript" -}}
{{- $mount := trimSuffix "/" .Values.storage.mountPath -}}
{{- printf "set -u; f=%s/.dapo-helm-test-$(hostname); want=\"written by uid $(id -u) gid $(id -g)\"; if ! echo \"$want\" > \"$f\"; then echo \"cannot write %s as uid $(id -u) gid $(id -g): set podSecurityContext.fsGroup or storage.fixOwnership.enabled (docs/storage.md#permissions)\" >&2; exit 1; fi; if [ \"$(cat \"$f\")\" != \"$want\" ]; then echo \"%s: read back differs from what was written\" >&2; exit 1; fi; rm -f \"$f\"; for d in %s %s; do if [ -e \"$d\" ] && [ ! -w \"$d\" ]; then echo \"$d is not writable by uid $(id -u)\" >&2; exit 1; fi; done; echo \"%s: write and read back OK as uid $(id -u)\"" $mount $mount $mount .Values.dataPrep.outDir .Values.storage.hfHome $mount -}}
{{- end -}}
