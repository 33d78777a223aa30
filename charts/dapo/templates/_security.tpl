{{/*
What keeps a run to itself: the rules that refuse security settings that cannot work, and the Pod Security Standard
level a namespace needs for the values (NOTES names it; dapo doctor reads it from NOTES; tests/test_security.py holds
it against the Pod Security Standards' rules on every rendered pod); the NetworkPolicy is networkpolicy.yaml, authOptions and the securityContexts are in _rayjob.tpl and _pods.tpl.
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
hostNetwork, where no NetworkPolicy applies).
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
{{- /* extra volumes and sidecars baseline refuses */ -}}
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
{{- /* sidecars that run as root in their own securityContext (baseline allows them, restricted does not) */ -}}
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
*/}}
{{/*
["CKV_K8S_43"] (JSON) for an image pinned by tag only, [] for one pinned by digest.
Usage: include "dapo.tagOnly" (dict "digest" $d ...)
*/}}
{{- define "dapo.tagOnly" -}}
{{- if .digest }}[]{{ else }}["CKV_K8S_43"]{{ end -}}
{{- end -}}

{{- define "dapo.checkovSkips" -}}
{{- $reasons := dict
  "CKV_K8S_8" "a hook pod (preflight, start guard, helm test) runs its checks to completion and serves nothing: no liveness probe"
  "CKV_K8S_9" "a hook pod (preflight, start guard, helm test) runs its checks to completion and serves nothing: no readiness probe"
  "CKV_K8S_15" "image.pullPolicy IfNotPresent: a pod starts without asking the registry once its node holds the image; pinned by digest that copy is the pushed image, pinned by tag NOTES warns that it may be an older push under the same tag"
  "CKV_K8S_22" "torch's import and the CUDA check write caches under HOME and /tmp"
  "CKV_K8S_25" "storage.fixOwnership: the preflight runs the head's ownership step, root with only CHOWN, DAC_OVERRIDE and FOWNER, to fail the install where it would fail the head"
  "CKV_K8S_38" "the follower reads the API server: get on this release's RayJobs (by name) and list on the namespace's pods and events (why a run waits); with train.retries the training follower also patches or deletes its RayJob (by name) and deletes the pod of a frozen driver"
  "CKV_K8S_40" "the images' user is uid 1000 as in Ray's own images; runAsNonRoot is enforced"
  "CKV_K8S_43" "the image is pinned by tag only (no digest value set; NOTES warns): make images prints the --set of its digest"
  "CKV_K8S_8:submitter" "KubeRay's K8sJobMode submitter runs ray job submit, then follows the job's logs to its end, and serves nothing: no liveness probe"
  "CKV_K8S_9:submitter" "KubeRay's K8sJobMode submitter runs ray job submit, then follows the job's logs to its end, and serves nothing: no readiness probe"
  "CKV_K8S_8:ray" "KubeRay v1.7.0 gives the Ray container its liveness probe when it creates the pod (common/pod.go initLivenessAndReadinessProbe, unless the operator sets ENABLE_PROBES_INJECTION to false); a sidecar of the values has the probes of its own manifest"
  "CKV_K8S_9:ray" "KubeRay v1.7.0 gives the Ray container its readiness probe when it creates the pod (common/pod.go initLivenessAndReadinessProbe, unless the operator sets ENABLE_PROBES_INJECTION to false); a sidecar of the values has the probes of its own manifest"
  "CKV_K8S_22:ray" "Ray writes its session directory (/tmp/ray: logs, sockets, spilled objects) and the job's libraries their caches under HOME in the container's file system"
  "CKV_K8S_40:ray" "the images' user is uid 1000 as in Ray's own images, runAsNonRoot enforced; only storage.fixOwnership's init container, when on, runs as root to hand the volume's directories to it"
  "CKV_K8S_19" "hostNetwork: true (values, for an RDMA or EFA fabric that needs the host's network): no NetworkPolicy applies to these pods, the chart requires token authentication with it, NOTES names the privileged Pod Security level"
  "CKV_K8S_10" "a sidecar of the values (head/worker.sidecarContainers) without a CPU request: the chart runs the values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has it)"
  "CKV_K8S_11" "a sidecar of the values (head/worker.sidecarContainers) without a CPU limit: the chart runs the values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has it)"
  "CKV_K8S_12" "a sidecar of the values (head/worker.sidecarContainers) without a memory request: the chart runs the values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has it)"
  "CKV_K8S_13" "a sidecar of the values (head/worker.sidecarContainers) without a memory limit: the chart runs the values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has it)"
  "CKV_K8S_16" "a privileged sidecar of the values (head/worker.sidecarContainers): the chart runs the values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has it); NOTES names the privileged Pod Security level"
  "CKV_K8S_20" "a sidecar of the values (head/worker.sidecarContainers) without allowPrivilegeEscalation: false: the chart runs the values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has it)"
  "CKV_K8S_25:ray" "capabilities the values add: ipcLock (IPC_LOCK, RDMA memory registration), storage.fixOwnership (CHOWN, DAC_OVERRIDE, FOWNER in its root init container) or a sidecar's own (head/worker.sidecarContainers); NOTES names the Pod Security level they need"
  "CKV_K8S_28" "a sidecar of the values (head/worker.sidecarContainers) that drops neither NET_RAW nor ALL: the chart runs the values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has it)"
  "CKV_K8S_30" "a sidecar of the values (head/worker.sidecarContainers) without a securityContext: the chart runs the values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has it)"
  "CKV_K8S_35" "WANDB_API_KEY: wandb reads an API key from that variable or a netrc file (wandb 0.31, wandb/sdk/lib/wbauth) and the Secret holds the bare key, so the containers where the driver runs get the variable (the HF token is a mounted file); or a sidecar of the values that takes a secret as a variable"
  "CKV_K8S_37" "a sidecar of the values (head/worker.sidecarContainers) that does not drop ALL capabilities: the chart runs the values' sidecars as given (a cloud's fabric daemon as its vendor's manifest has it)"
-}}
{{- range $i, $check := . }}
checkov.io/skip{{ add1 $i }}: {{ printf "%s=%s" (first (splitList ":" $check)) (index $reasons $check) | quote }}
{{- end }}
{{- end -}}

{{/*
What checkov finds in the K8sJobMode submitter's pod template that stays (JSON list).
Usage: include "dapo.submitterSkips" $image
*/}}
{{- define "dapo.submitterSkips" -}}
{{- $out := list "CKV_K8S_8:submitter" "CKV_K8S_9:submitter" "CKV_K8S_15" "CKV_K8S_40" -}}
{{- if not (contains "@" .) }}{{ $out = append $out "CKV_K8S_43" }}{{ end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
What checkov finds in a Ray pod template (exported as a Pod) that stays (JSON list): KubeRay's probes, the pull policy,
Ray's writable file system, uid 1000; hostNetwork; each container check, as checkov 3.3 evaluates it, that one of the
values' sidecars fails, and of the chart's own containers only the capabilities the values add and wandb's key as a
variable; the image by tag.
Usage: include "dapo.rayPodSkips" (dict "spec" $spec "sidecars" $group.sidecarContainers)
*/}}
{{- define "dapo.rayPodSkips" -}}
{{- $spec := .spec -}}
{{- $sidecars := list -}}
{{- range .sidecars | default list }}{{ $sidecars = append $sidecars (toString .name) }}{{ end -}}
{{- $out := list "CKV_K8S_8:ray" "CKV_K8S_9:ray" "CKV_K8S_15" "CKV_K8S_22:ray" "CKV_K8S_40:ray" -}}
{{- if $spec.hostNetwork }}{{ $out = append $out "CKV_K8S_19" }}{{ end -}}
{{- $found := dict -}}
{{- range $c := concat ($spec.initContainers | default list) ($spec.containers | default list) -}}
{{- $mine := has (toString $c.name) $sidecars -}}
{{- $sc := $c.securityContext | default dict -}}
{{- $caps := $sc.capabilities | default dict -}}
{{- $res := $c.resources | default dict -}}
{{- $req := $res.requests | default dict -}}
{{- $lim := $res.limits | default dict -}}
{{- $drops := join " " ($caps.drop | default list) -}}
{{- if and $mine (not $req.cpu) }}{{ $_ := set $found "CKV_K8S_10" true }}{{ end -}}
{{- if and $mine (not $lim.cpu) }}{{ $_ := set $found "CKV_K8S_11" true }}{{ end -}}
{{- if and $mine (not $req.memory) }}{{ $_ := set $found "CKV_K8S_12" true }}{{ end -}}
{{- if and $mine (not $lim.memory) }}{{ $_ := set $found "CKV_K8S_13" true }}{{ end -}}
{{- if and $mine $sc.privileged }}{{ $_ := set $found "CKV_K8S_16" true }}{{ end -}}
{{- if and $mine (not (and (kindIs "bool" $sc.allowPrivilegeEscalation) (not $sc.allowPrivilegeEscalation))) }}{{ $_ := set $found "CKV_K8S_20" true }}{{ end -}}
{{- if $caps.add }}{{ $_ := set $found "CKV_K8S_25:ray" true }}{{ end -}}
{{- if and $mine (not (or (contains "ALL" $drops) (contains "all" $drops) (contains "NET_RAW" $drops))) }}{{ $_ := set $found "CKV_K8S_28" true }}{{ end -}}
{{- if and $mine (not $c.securityContext) }}{{ $_ := set $found "CKV_K8S_30" true }}{{ end -}}
{{- range $e := $c.env | default list }}{{ if hasKey ($e.valueFrom | default dict) "secretKeyRef" }}{{ $_ := set $found "CKV_K8S_35" true }}{{ end }}{{ end -}}
{{- range $e := $c.envFrom | default list }}{{ if hasKey $e "secretRef" }}{{ $_ := set $found "CKV_K8S_35" true }}{{ end }}{{ end -}}
{{- if and $mine (not (or (contains "ALL" $drops) (contains "all" $drops))) }}{{ $_ := set $found "CKV_K8S_37" true }}{{ end -}}
{{- end -}}
{{- range $k := list "CKV_K8S_10" "CKV_K8S_11" "CKV_K8S_12" "CKV_K8S_13" "CKV_K8S_16" "CKV_K8S_20" "CKV_K8S_25:ray" "CKV_K8S_28" "CKV_K8S_30" "CKV_K8S_35" "CKV_K8S_37" -}}
{{- if hasKey $found $k }}{{ $out = append $out $k }}{{ end -}}
{{- end -}}
{{- if not (contains "@" (first $spec.containers).image) }}{{ $out = append $out "CKV_K8S_43" }}{{ end -}}
{{- toJson $out -}}
{{- end -}}
