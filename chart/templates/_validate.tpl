{{/*
Checks across values that values.schema.json cannot express with a clear
message. Included once, from daemonset.yaml; renders nothing.
*/}}
{{- define "ate-devplugin.validate" -}}
{{- $names := list -}}
{{- range $i, $r := .Values.deviceConfig.resources -}}
{{- $where := printf "deviceConfig.resources[%d]" $i -}}
{{- if has $r.name $names -}}
{{- fail (printf "%s.name %q is used twice: every resource name must be unique" $where $r.name) -}}
{{- end -}}
{{- $names = append $names $r.name -}}
{{- if regexMatch "(^|\\.)kubernetes\\.io/" $r.name -}}
{{- fail (printf "%s.name %q: the kubernetes.io domain is reserved for Kubernetes' own resources; use a domain of your own, e.g. ate.dev/kvm" $where $r.name) -}}
{{- end -}}
{{- range $r.devices -}}
{{- if regexMatch "(^|/)\\.\\.(/|$)" . -}}
{{- fail (printf "%s.devices: %q contains '..'; device paths must stay under /dev" $where .) -}}
{{- end -}}
{{- end -}}
{{- range $m := $r.mounts -}}
{{- range $k := list "container_path" "host_path" -}}
{{- if regexMatch "(^|/)\\.\\.(/|$)" (index $m $k) -}}
{{- fail (printf "%s.mounts: %s %q contains '..'" $where $k (index $m $k)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $k, $v := .Values.hostPaths -}}
{{- if regexMatch "(^|/)\\.\\.(/|$)" $v -}}
{{- fail (printf "hostPaths.%s %q contains '..'; give the plain absolute path" $k $v) -}}
{{- end -}}
{{- end -}}
{{- range .Values.daemon.extraArgs -}}
{{- if regexMatch "^--(config|device-root|plugin-dir|metrics-address|log-format|log-level)(=|$)" . -}}
{{- fail (printf "daemon.extraArgs: %q is set by the chart; use the matching value instead (deviceConfig, hostPaths, metrics, daemon.logFormat, daemon.logLevel)" .) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.tracing.enabled (not .Values.tracing.endpoint) -}}
{{- fail "tracing.enabled=true needs tracing.endpoint, the OTLP collector URL (e.g. http://otel-collector.observability:4317)" -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled (not .Values.service.enabled) -}}
{{- fail "serviceMonitor.enabled=true needs service.enabled=true (a ServiceMonitor scrapes through the Service); or use podMonitor.enabled=true instead" -}}
{{- end -}}
{{- if and (eq .Values.updateStrategy.type "RollingUpdate") .Values.updateStrategy.rollingUpdate -}}
{{- if not (has (toString .Values.updateStrategy.rollingUpdate.maxUnavailable) (list "<nil>" "")) -}}
{{- if has (toString .Values.updateStrategy.rollingUpdate.maxUnavailable) (list "0" "0%") -}}
{{- fail "updateStrategy.rollingUpdate.maxUnavailable must be at least 1: with maxSurge 0 a rollout could not make progress" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
