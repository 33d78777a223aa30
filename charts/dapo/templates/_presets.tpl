{{/*
The preset merge: the preset's `extends:` chain read from presets/ (a link to the package's dapo/presets),
merged like dapo.config.chain (the one Python implementation; tests/test_preset_chain.py renders these defines
through Helm and compares them with it on every preset and a table of override spellings), the values' overrides
applied, the placement and model it implies.
*/}}

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
Recursive deep merge in place, like dapo.config.chain.deep_merge: mappings merge, everything else (lists included) is
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
The preset with its `extends:` chain resolved (JSON), as dapo.config.chain.merged_preset returns it.
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
target_aime), applied like dapo.config.chain.apply_overrides: each `a.b.c=VALUE` sets the key, VALUE read as the
YAML of `v: VALUE`. What the training run really uses for its paths, experiment name and model (evaluation, NOTES,
model download).
*/}}
{{- define "dapo.effectivePreset" -}}
{{- $p := include "dapo.preset" . | fromJson -}}
{{- range $o := .Values.overrides -}}
{{- if not (contains "=" $o) -}}
{{- fail (printf "overrides: %q is not of the form key=value" $o) -}}
{{- end -}}
{{- $kv := regexSplit "=" $o 2 -}}
{{- $key := trim (first $kv) -}}
{{- $root := first (splitList "." (regexReplaceAll "^[+~]+" $key "")) -}}
{{- if has $root (list "recipe" "placement" "local" "name" "description" "target_aime") -}}
{{- include "dapo.setOverride" (dict "preset" $p "override" $o "key" $key "raw" (last $kv)) -}}
{{- end -}}
{{- end -}}
{{- toJson $p -}}
{{- end -}}

{{/*
Set one preset override in place, refusing what dapo.config.chain.parse_override refuses with its messages.
Usage: include "dapo.setOverride" (dict "preset" $p "override" $o "key" $key "raw" $value)
*/}}
{{- define "dapo.setOverride" -}}
{{- $o := .override -}}
{{- if regexMatch "^[+~]" .key -}}
{{- fail (printf "overrides: %q: a preset key takes no Hydra prefix (+, ~)" $o) -}}
{{- end -}}
{{- if has "" (splitList "." .key) -}}{{- fail (printf "overrides: %q: empty key" $o) -}}{{- end -}}
{{- $val := "" -}}
{{- $raw := trim .raw -}}
{{- if $raw -}}
{{- /* YAML's infinities and NaN: JSON has none, so Helm would read null */ -}}
{{- if regexMatch `^(\.(nan|NaN|NAN)|[-+]?\.(inf|Inf|INF))$` $raw -}}
{{- fail (printf "overrides: %q: %s is not a finite number (Helm reads it as null)" $o $raw) -}}
{{- end -}}
{{- /* a decimal integer beyond 2^53: Helm's float64 would round it */ -}}
{{- $digits := regexReplaceAll "[-+_]" $raw "" -}}
{{- if and (regexMatch `^[-+]?[1-9][0-9_]*$` $raw) (or (gt (len $digits) 16) (and (eq (len $digits) 16) (gt $digits "9007199254740992"))) -}}
{{- fail (printf "overrides: %q: %s is beyond 2^53, where Helm's 64-bit float numbers are no longer exact" $o $raw) -}}
{{- end -}}
{{- $doc := fromYaml (printf "v: %s" .raw) -}}
{{- if hasKey $doc "Error" -}}{{- fail (printf "overrides: %q: the value is not valid YAML" $o) -}}{{- end -}}
{{- $val = $doc.v -}}
{{- end -}}
{{- $parts := splitList "." .key -}}
{{- $node := .preset -}}
{{- range $part := initial $parts -}}
{{- if kindIs "invalid" (index $node $part) -}}{{- $_ := set $node $part dict -}}{{- end -}}
{{- if not (kindIs "map" (index $node $part)) -}}
{{- fail (printf "overrides: %q: %q is not a mapping in the preset" $o $part) -}}
{{- end -}}
{{- $node = index $node $part -}}
{{- end -}}
{{- $_ := set $node (last $parts) $val -}}
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
the presets use), like dapo.config.chain.resolve_trainer_refs. Usage: include "dapo.trainerPath" (dict "path" $s "trainer" $trainer)
*/}}
{{- define "dapo.trainerPath" -}}
{{- $s := .path -}}
{{- range $k, $v := .trainer -}}
{{- if or (kindIs "string" $v) (kindIs "float64" $v) (kindIs "int" $v) (kindIs "int64" $v) -}}
{{- $str := toString $v -}}
{{- /* a whole number as an integer (toString would print 1000000 as 1e+06), like dapo.util.gofmt.go_string */ -}}
{{- if and (kindIs "float64" $v) (eq $v (floor $v)) (lt $v 1e21) (gt $v -1e21) -}}{{- $str = printf "%.0f" $v -}}{{- end -}}
{{- $s = replace (printf "${trainer.%s}" $k) $str $s -}}
{{- end -}}
{{- end -}}
{{- if contains "${" $s -}}
{{- fail (printf "preset: cannot resolve %q (only ${trainer.<key>} references are supported)" .path) -}}
{{- end -}}
{{- $s -}}
{{- end -}}
