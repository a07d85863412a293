{{/*
Checks across values that values.schema.json cannot express with a clear
message. Included from daemonset.yaml, once per pool; renders nothing. The
deviceConfig rules come from the daemon's model (_deviceconfig.tpl, generated), the
daemon.extraArgs and extraEnv rules from its argument parser (_daemonargs.tpl, generated).
*/}}
{{- define "ate-devplugin.validate" -}}
{{- include "ate-devplugin.deviceConfigRules" . -}}
{{- range $k, $v := .Values.hostPaths -}}
{{- if regexMatch "(^|/)\\.\\.(/|$)" $v -}}
{{- fail (printf "hostPaths.%s %q contains '..'; give the plain absolute path" $k $v) -}}
{{- end -}}
{{- end -}}
{{- if regexMatch "(^|/)\\.\\.(/|$)" .Values.podResources.hostPath -}}
{{- fail (printf "podResources.hostPath %q contains '..'; give the plain absolute path" .Values.podResources.hostPath) -}}
{{- end -}}
{{- include "ate-devplugin.daemonArgsRules" . -}}
{{- if regexMatch "(^|/)\\.\\.(/|$)" .Values.kvmProbe.socketDir -}}
{{- fail (printf "kvmProbe.socketDir %q contains '..'; give the plain absolute path" .Values.kvmProbe.socketDir) -}}
{{- end -}}
{{- if and .Values.nfd.enabled (not .Values.kvmProbe.enabled) -}}
{{- fail "nfd.enabled=true needs kvmProbe.enabled=true: the daemon writes the node's KVM facts from the probe's verdicts, and without the prober it has none" -}}
{{- end -}}
{{- if regexMatch "(^|/)\\.\\.(/|$)" .Values.nfd.featuresDir -}}
{{- fail (printf "nfd.featuresDir %q contains '..'; give the plain absolute path" .Values.nfd.featuresDir) -}}
{{- end -}}
{{- if and .Values.kubeVersionOverride (include "ate-devplugin.clusterKnown" .) -}}
{{- $minor := regexFind "^[0-9]+\\.[0-9]+" (trimPrefix "v" .Values.kubeVersionOverride) -}}
{{- if semverCompare (printf "<%s.0-0" $minor) .Capabilities.KubeVersion.Version -}}
{{- fail (printf "kubeVersionOverride %q is newer than this cluster (%s): what it turns on would break this cluster's rollouts; leave it empty (helm follows the cluster) or set the oldest release the chart is installed on" .Values.kubeVersionOverride .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}
{{- $kube := include "ate-devplugin.kubeVersion" . -}}
{{- if and (include "ate-devplugin.dra" .) $kube (semverCompare "<1.34-0" $kube) -}}
{{- fail (printf "dra.mode=%s needs Kubernetes 1.34 or later (resource.k8s.io/v1); %s is %s" .Values.dra.mode (ternary "kubeVersionOverride" "this cluster" (ne .Values.kubeVersionOverride "")) $kube) -}}
{{- end -}}
{{- if and (include "ate-devplugin.dra" .) (not (or .Values.serviceAccount.create .Values.serviceAccount.name)) -}}
{{- fail "dra.mode needs a ServiceAccount to bind its RBAC to: serviceAccount.create=true or serviceAccount.name" -}}
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
