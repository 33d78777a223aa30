{{/*
What keeps a run to itself: the rules that refuse security settings that cannot work, and the Pod Security Standard
level a namespace needs for the values. dapo/k8s/security.py (check_security, pod_security_profile) is the twin;
the NetworkPolicy is networkpolicy.yaml, authOptions and the securityContexts are in _helpers.tpl.
*/}}
{{- define "dapo.validateSecurity" -}}
{{- $v := .Values -}}
{{- if $v.rayAuth.enabled -}}
{{- $versions := list -}}
{{- if $v.train.enabled -}}
{{- if eq $v.train.runner "reference" -}}
{{- $versions = append $versions (list "train.reference.rayVersion" $v.train.reference.rayVersion) -}}
{{- else -}}
{{- $versions = append $versions (list "rayVersion" $v.rayVersion) -}}
{{- end -}}
{{- end -}}
{{- if $v.eval.enabled -}}
{{- $versions = append $versions (list "rayVersion" $v.rayVersion) -}}
{{- end -}}
{{- range $pair := $versions -}}
{{- if not (semverCompare ">=2.52.0-0" (toString (last $pair))) -}}
{{- fail (printf "rayAuth.enabled: %s %s has no token authentication (Ray >= 2.52.0; KubeRay refuses authOptions.mode token below it). Set rayAuth.enabled: false (values/reference.yaml does) and keep networkPolicy.enabled: the NetworkPolicy is then the run's only fence" (first $pair) (toString (last $pair))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- include "dapo.checkOpenRay" . -}}
{{- $pod := $v.podSecurityContext | default dict -}}
{{- $ctr := $v.securityContext | default dict -}}
{{- if and (eq (toString $ctr.runAsUser) "0") $pod.runAsNonRoot (not (and (hasKey $ctr "runAsNonRoot") (eq (toString $ctr.runAsNonRoot) "false"))) -}}
{{- fail "securityContext.runAsUser: 0 under podSecurityContext.runAsNonRoot: true: the kubelet refuses to start the Ray containers; also set securityContext.runAsNonRoot: false (the namespace then needs the privileged Pod Security profile)" -}}
{{- end -}}
{{- end -}}

{{/*
Token auth off leaves the NetworkPolicy as the Ray head's only fence: refused without it (networkPolicy off, or
hostNetwork, where no NetworkPolicy applies). dapo.k8s.security.check_open_ray is the twin.
*/}}
{{- define "dapo.checkOpenRay" -}}
{{- $v := .Values -}}
{{- if not $v.rayAuth.enabled -}}
{{- $key := "" -}}
{{- $where := "" -}}
{{- if not $v.networkPolicy.enabled -}}
{{- $key = "networkPolicy.enabled" -}}
{{- $where = "false together with rayAuth.enabled: false leaves the Ray head open" -}}
{{- else if $v.hostNetwork -}}
{{- $key = "hostNetwork" -}}
{{- $where = "true together with rayAuth.enabled: false leaves the Ray head open on the node's address, where no NetworkPolicy applies" -}}
{{- end -}}
{{- if $key -}}
{{- fail (printf "%s: %s: whoever reaches its dashboard (8265) submits code that runs with this run's tokens and checkpoints (CVE-2023-48022, \"ShadowRay\"). Turn token authentication on (rayAuth.enabled: true, Ray >= 2.52) or keep the NetworkPolicy as the fence: networkPolicy.enabled: true and no hostNetwork (values/reference.yaml, whose Ray 2.43 has no token authentication, does)" $key $where) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The Pod Security Standard level the namespace needs for these values, and why (JSON {"level", "reasons"}).
*/}}
{{- define "dapo.podSecurityProfile" -}}
{{- $v := .Values -}}
{{- $privileged := list -}}
{{- $baseline := list -}}
{{- if $v.hostNetwork -}}
{{- $privileged = append $privileged "hostNetwork (host namespaces; NetworkPolicies do not apply to hostNetwork pods)" -}}
{{- end -}}
{{- if $v.ipcLock -}}
{{- $privileged = append $privileged "ipcLock (IPC_LOCK is not among the capabilities baseline allows)" -}}
{{- end -}}
{{- /* extra volumes and sidecars baseline refuses (dapo.k8s.security._extra_pod_parts) */ -}}
{{- $baselineCaps := list "AUDIT_WRITE" "CHOWN" "DAC_OVERRIDE" "FOWNER" "FSETID" "KILL" "MKNOD" "NET_BIND_SERVICE" "SETFCAP" "SETGID" "SETPCAP" "SETUID" "SYS_CHROOT" -}}
{{- range $role := list "head" "worker" -}}
{{- $g := index $v $role -}}
{{- $host := false -}}
{{- range $vol := $g.extraVolumes | default list -}}
{{- if hasKey $vol "hostPath" }}{{ $host = true }}{{ end -}}
{{- end -}}
{{- if $host -}}
{{- $privileged = append $privileged (printf "%s.extraVolumes (hostPath volumes)" $role) -}}
{{- end -}}
{{- range $c := $g.sidecarContainers | default list -}}
{{- $sc := $c.securityContext | default dict -}}
{{- $beyond := false -}}
{{- range $cap := (($sc.capabilities | default dict).add | default list) -}}
{{- if not (has (trimPrefix "CAP_" (toString $cap)) $baselineCaps) }}{{ $beyond = true }}{{ end -}}
{{- end -}}
{{- if or $sc.privileged $beyond -}}
{{- $privileged = append $privileged (printf "%s.sidecarContainers %s (privileged or capabilities beyond baseline)" $role $c.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $ctr := $v.securityContext | default dict -}}
{{- if or (eq (toString $ctr.runAsUser) "0") (and (hasKey $ctr "runAsNonRoot") (eq (toString $ctr.runAsNonRoot) "false")) -}}
{{- $baseline = append $baseline "securityContext runs the Ray containers as root" -}}
{{- end -}}
{{- /* sidecars that run as root in their own securityContext (dapo.k8s.security._root_sidecars) */ -}}
{{- range $role := list "head" "worker" -}}
{{- range $c := (index $v $role).sidecarContainers | default list -}}
{{- $sc := $c.securityContext | default dict -}}
{{- if or (eq (toString $sc.runAsUser) "0") (and (hasKey $sc "runAsNonRoot") (eq (toString $sc.runAsNonRoot) "false")) -}}
{{- $baseline = append $baseline (printf "%s.sidecarContainers %s (runs as root)" $role $c.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $v.storage.fixOwnership.enabled -}}
{{- $baseline = append $baseline "storage.fixOwnership (an init container runs as root with CHOWN, DAC_OVERRIDE, FOWNER)" -}}
{{- end -}}
{{- if or (and $v.train.enabled (eq $v.train.submissionMode "SidecarMode")) (and $v.eval.enabled (eq $v.eval.submissionMode "SidecarMode")) -}}
{{- $baseline = append $baseline "SidecarMode (KubeRay adds its submitter container to the head without a securityContext)" -}}
{{- end -}}
{{- if $privileged -}}
{{- toJson (dict "level" "privileged" "reasons" (concat $privileged $baseline)) -}}
{{- else if $baseline -}}
{{- toJson (dict "level" "baseline" "reasons" $baseline) -}}
{{- else -}}
{{- toJson (dict "level" "restricted" "reasons" list) -}}
{{- end -}}
{{- end -}}

{{/*
checkov (make test) findings on the chart's own Jobs and Pods that stay, each with its reason, as the annotations
checkov reads (`checkov.io/skipN: <check>=<reason>`). Usage: include "dapo.checkovSkips" (list "CKV_K8S_15" ...).
dapo.k8s.security.CHECKOV_REASONS is the same text.
*/}}
{{/*
["CKV_K8S_43"] (JSON) for an image pinned by tag only, [] for one pinned by digest (dapo.k8s.security.tag_only).
Usage: include "dapo.tagOnly" (dict "digest" $d ...)
*/}}
{{- define "dapo.tagOnly" -}}
{{- if .digest }}[]{{ else }}["CKV_K8S_43"]{{ end -}}
{{- end -}}

{{- define "dapo.checkovSkips" -}}
{{- $reasons := dict
  "CKV_K8S_8" "a helm test or preflight pod runs its checks to completion and serves nothing: no liveness probe"
  "CKV_K8S_9" "a helm test or preflight pod runs its checks to completion and serves nothing: no readiness probe"
  "CKV_K8S_15" "image.pullPolicy IfNotPresent: a pod starts without asking the registry once its node holds the image; pinned by digest that copy is the pushed image, pinned by tag NOTES warns that it may be an older push under the same tag"
  "CKV_K8S_22" "torch's import and the CUDA check write caches under HOME and /tmp"
  "CKV_K8S_25" "storage.fixOwnership: the preflight runs the head's ownership step, root with only CHOWN, DAC_OVERRIDE and FOWNER, to fail the install where it would fail the head"
  "CKV_K8S_38" "the follower reads its RayJob's status from the API server (a Role allowing get on the release's RayJobs only)"
  "CKV_K8S_40" "the images' user is uid 1000 as in Ray's own images; runAsNonRoot is enforced"
  "CKV_K8S_43" "the image is pinned by tag only (no digest value set; NOTES warns): make images prints the --set of its digest"
-}}
{{- range $i, $check := . }}
checkov.io/skip{{ add1 $i }}: {{ printf "%s=%s" $check (index $reasons $check) | quote }}
{{- end }}
{{- end -}}
