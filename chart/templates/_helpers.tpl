{{/*
Chart name, truncated to 63 characters (the DNS label limit).
*/}}
{{- define "ate-devplugin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Full name of the release's objects, truncated to 63 characters. The release
name alone is used when it already contains the chart name.
*/}}
{{- define "ate-devplugin.fullname" -}}
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
A name made of the full name and a suffix, still at most 63 characters: the
full name is shortened, never the suffix.
Usage: include "ate-devplugin.suffixed" (list . "dashboard-fleet")
*/}}
{{- define "ate-devplugin.suffixed" -}}
{{- $ctx := index . 0 -}}
{{- $suffix := regexReplaceAll "[^a-z0-9-]+" (index . 1 | lower) "-" | trimAll "-" | trunc 40 | trimSuffix "-" -}}
{{- $base := include "ate-devplugin.fullname" $ctx | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base $suffix -}}
{{- end -}}

{{/*
The regular expression of the release's DaemonSets (every pool's): what the alerts'
kube-state-metrics series select (prometheusrule.yaml) and the Fleet dashboard's hidden
constant "daemonset", which its kube-state-metrics panels read (dashboards.yaml,
persesdashboards.yaml).
*/}}
{{- define "ate-devplugin.daemonSetsPattern" -}}
{{- $pools := dict "root" . -}}
{{- include "ate-devplugin.poolContexts" $pools -}}
{{- $daemonSets := list -}}
{{- range $pools.contexts -}}
{{- $daemonSets = append $daemonSets (include "ate-devplugin.daemonSetName" .) -}}
{{- end -}}
{{- join "|" $daemonSets -}}
{{- end -}}

{{/*
The names that make the dashboards this release's own (dashboards.yaml and
persesdashboards.yaml apply them), so that two releases side by side keep two sets:
"prefix" starts their UIDs (Grafana's uid, Perses' metadata.name: <prefix>-fleet,
<prefix>-node), tag and file names, "title" their titles ("<title> / Fleet"). Both are the
full name, so the default release (ate-devplugin) keeps the generated ones; Grafana takes
UIDs of at most 40 characters, so a longer prefix is cut and made unique with a hash of the
full name.
*/}}
{{- define "ate-devplugin.dashboardNames" -}}
{{- $full := include "ate-devplugin.fullname" . -}}
{{- $prefix := $full -}}
{{- if gt (len $full) 34 -}}
{{- $prefix = printf "%s-%s" ($full | trunc 27 | trimSuffix "-") ($full | sha256sum | trunc 6) -}}
{{- end -}}
{{- dict "prefix" $prefix "title" $full | toJson -}}
{{- end -}}

{{/*
Namespace of every object.
*/}}
{{- define "ate-devplugin.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Chart label value: name-version, "+" replaced (not allowed in label values).
*/}}
{{- define "ate-devplugin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Selector labels: stable for the life of the release (a DaemonSet's selector
cannot change).
*/}}
{{- define "ate-devplugin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ate-devplugin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
Labels of the pod template: the DaemonSet's selector and labels that stay the same from
one chart version to the next, so that upgrading the chart alone restarts no pod (no
helm.sh/chart, no app.kubernetes.io/version: a new image changes the pod anyway).
Takes a pool context (ate-devplugin.poolContexts).
*/}}
{{- define "ate-devplugin.podLabels" -}}
{{ include "ate-devplugin.daemonSetSelector" . }}
app.kubernetes.io/component: device-plugin
app.kubernetes.io/part-of: ate-devplugin
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- with .Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
A DaemonSet's selector: the release's selector labels and, for a pool, the pool's name
(the Service, NetworkPolicy and monitors select the pods of every pool).
*/}}
{{- define "ate-devplugin.daemonSetSelector" -}}
{{ include "ate-devplugin.selectorLabels" . }}
{{- with .Pool }}
ate.dev/pool: {{ . }}
{{- end }}
{{- end -}}

{{/*
Name of a pool's DaemonSet and ConfigMap: the full name, suffixed with the pool's.
*/}}
{{- define "ate-devplugin.daemonSetName" -}}
{{- if .Pool -}}
{{- include "ate-devplugin.suffixed" (list . .Pool) -}}
{{- else -}}
{{- include "ate-devplugin.fullname" . -}}
{{- end -}}
{{- end -}}

{{/*
Name of a pool's KVM prober DaemonSet (kvm-prober.yaml), and of its ResourceClaimTemplate in
dra mode.
*/}}
{{- define "ate-devplugin.kvmProberName" -}}
{{- printf "%s-kvm-prober" (include "ate-devplugin.daemonSetName" . | trunc 52 | trimSuffix "-") -}}
{{- end -}}

{{/*
One context per DaemonSet: without pools the root context, otherwise one per pool (in
name order) whose .Values are the top-level values with each key the pool sets replaced
as a whole, and .Pool its name. Writes the list to .contexts of the dict it is given:
  {{- $pools := dict "root" $ }}{{- include "ate-devplugin.poolContexts" $pools }}
  {{- range $pools.contexts }}...{{- end }}
*/}}
{{- define "ate-devplugin.poolContexts" -}}
{{- $root := .root -}}
{{- $contexts := list -}}
{{- range $name := keys $root.Values.pools | sortAlpha -}}
{{- $values := deepCopy $root.Values -}}
{{- range $key, $value := index $root.Values.pools $name -}}
{{- if eq $key "kvmProbe" -}}
{{- /* A pool's kvmProbe replaces the top-level kvmProbe's keys one by one. */ -}}
{{- $probe := deepCopy $values.kvmProbe -}}
{{- range $k, $v := $value }}{{ $_ := set $probe $k $v }}{{ end -}}
{{- $_ := set $values $key $probe -}}
{{- else -}}
{{- $_ := set $values $key $value -}}
{{- end -}}
{{- end -}}
{{- $contexts = append $contexts (dict "Values" $values "Pool" $name "Release" $root.Release "Chart" $root.Chart "Capabilities" $root.Capabilities "Template" $root.Template "Files" $root.Files) -}}
{{- else -}}
{{- $contexts = list (dict "Values" $root.Values "Pool" "" "Release" $root.Release "Chart" $root.Chart "Capabilities" $root.Capabilities "Template" $root.Template "Files" $root.Files) -}}
{{- end -}}
{{- $_ := set . "contexts" $contexts -}}
{{- end -}}

{{/*
The pods' affinity: the affinity value with nodeRequirements (and, with
nodeFeatureRule.enabled, its label) added to every term of the required node affinity;
one term holding just them when there is none.
*/}}
{{- define "ate-devplugin.affinity" -}}
{{- $affinity := deepCopy (default (dict) .Values.affinity) -}}
{{- $required := list -}}
{{- range .Values.nodeRequirements -}}
{{- $required = append $required . -}}
{{- end -}}
{{- if .Values.nodeFeatureRule.enabled -}}
{{- $required = append $required (dict "key" .Values.nodeFeatureRule.label "operator" "In" "values" (list "true")) -}}
{{- end -}}
{{- if $required -}}
{{- $nodeAffinity := default (dict) (get $affinity "nodeAffinity") -}}
{{- $selector := default (dict) (get $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution") -}}
{{- $terms := list -}}
{{- range default (list (dict)) (get $selector "nodeSelectorTerms") -}}
{{- $terms = append $terms (set . "matchExpressions" (concat (default (list) (get . "matchExpressions")) $required)) -}}
{{- end -}}
{{- $_ := set $selector "nodeSelectorTerms" $terms -}}
{{- $_ := set $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" $selector -}}
{{- $_ := set $affinity "nodeAffinity" $nodeAffinity -}}
{{- end -}}
{{- with $affinity -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

{{/*
Standard labels on every object.
*/}}
{{- define "ate-devplugin.labels" -}}
helm.sh/chart: {{ include "ate-devplugin.chart" . }}
{{ include "ate-devplugin.selectorLabels" . }}
app.kubernetes.io/version: {{ include "ate-devplugin.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: device-plugin
app.kubernetes.io/part-of: ate-devplugin
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Labels of the uninstall hook's objects (uninstall-hook.yaml): the standard ones with a name
of their own, so that no selector of the plugin's pods (the DaemonSet's, the Service's, the
NetworkPolicy's, the monitors') takes the hook's pod for one of them.
*/}}
{{- define "ate-devplugin.hookLabels" -}}
helm.sh/chart: {{ include "ate-devplugin.chart" . }}
app.kubernetes.io/name: {{ printf "%s-uninstall" (include "ate-devplugin.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ include "ate-devplugin.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: uninstall
app.kubernetes.io/part-of: ate-devplugin
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Labels of the helm test's objects (tests/verify.yaml): a name of their own, as the uninstall
hook's, so that no selector of the plugin's pods takes the test pod for one of them.
*/}}
{{- define "ate-devplugin.testLabels" -}}
helm.sh/chart: {{ include "ate-devplugin.chart" . }}
app.kubernetes.io/name: {{ printf "%s-test" (include "ate-devplugin.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ include "ate-devplugin.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: test
app.kubernetes.io/part-of: ate-devplugin
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Name of the ServiceAccount.
*/}}
{{- define "ate-devplugin.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ate-devplugin.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Image tag: the value, or the chart's appVersion.
*/}}
{{- define "ate-devplugin.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag -}}
{{- end -}}

{{/*
The project's home (values.home, no trailing slash): its source repository.
*/}}
{{- define "ate-devplugin.home" -}}
{{- trimSuffix "/" .Values.home -}}
{{- end -}}

{{/*
A link to a file of the project's repository at the chart's version (the tag v<version>,
which tools/release.sh asks to push with the release), as GitHub serves it, so that the
runbook and pages an installed chart links to are those of its own release:
  include "ate-devplugin.docsUrl" (list . "docs/dra.md")
*/}}
{{- define "ate-devplugin.docsUrl" -}}
{{- printf "%s/blob/v%s/%s" (include "ate-devplugin.home" (index . 0)) (index . 0).Chart.Version (index . 1) -}}
{{- end -}}

{{/*
Image repository: image.repository, or else <owner>/ate-devplugin for the owner of a
github.com home, in lower case: where tools/release.sh publishes the image by default
(ghcr.io/<owner>/ate-devplugin).
*/}}
{{- define "ate-devplugin.imageRepository" -}}
{{- if .Values.image.repository -}}
{{- .Values.image.repository -}}
{{- else -}}
{{- $home := include "ate-devplugin.home" . -}}
{{- if not (regexMatch "^https://github\\.com/[^/]+/[^/]+$" $home) -}}
{{- fail (printf "image.repository is empty and home %q is no github.com repository (https://github.com/OWNER/NAME) to take it from: set image.repository (and image.registry)" .Values.home) -}}
{{- end -}}
{{- printf "%s/ate-devplugin" (index (splitList "/" $home) 3) | lower -}}
{{- end -}}
{{- end -}}

{{/*
Full image reference: [registry/]repository[:tag][@digest]. The registry is
global.imageRegistry when set (it wins over image.registry, as in prometheus-node-exporter's
chart), else image.registry. A repository that names its own registry (its first component
holds a "." or ":" or is localhost, as image references are read) is used as it is:
image.repository=registry.example.com/ate-devplugin keeps meaning that image although
image.registry defaults to the published one's.
*/}}
{{- define "ate-devplugin.image" -}}
{{- $repo := include "ate-devplugin.imageRepository" . -}}
{{- $registry := default .Values.image.registry .Values.global.imageRegistry -}}
{{- $first := splitList "/" $repo | first -}}
{{- $ownRegistry := and (contains "/" $repo) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- if and $registry (not $ownRegistry) -}}
{{- $repo = printf "%s/%s" $registry $repo -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (include "ate-devplugin.imageTag" .) -}}
{{- end -}}
{{- end -}}

{{/*
The pods' imagePullSecrets, YAML (empty: none): global.imagePullSecrets, as a parent chart
shares them (names, or {name: ...} as Bitnami's charts take them), then imagePullSecrets,
each name once. Every pod of the chart uses them: the DaemonSets, the KVM prober, the
uninstall hook and the helm test.
*/}}
{{- define "ate-devplugin.imagePullSecrets" -}}
{{- $names := list -}}
{{- range concat (default list .Values.global.imagePullSecrets) .Values.imagePullSecrets -}}
{{- $names = append $names (ternary . (get (kindIs "map" . | ternary . dict) "name") (kindIs "string" .)) -}}
{{- end -}}
{{- $lines := list -}}
{{- range $names | uniq -}}
{{- $lines = append $lines (printf "- name: %s" (quote .)) -}}
{{- end -}}
{{- join "\n" $lines -}}
{{- end -}}

{{/*
Name of the ConfigMap holding config.yaml.
*/}}
{{- define "ate-devplugin.configMapName" -}}
{{- default (include "ate-devplugin.daemonSetName" .) .Values.deviceConfig.existingConfigMap -}}
{{- end -}}

{{/*
The daemon's configuration file, rendered from values.
*/}}
{{- define "ate-devplugin.configYaml" -}}
version: {{ include "ate-devplugin.configVersion" . }}
resources:
{{- range .Values.deviceConfig.resources }}
  - name: {{ .name | quote }}
    devices:
    {{- range (kindIs "string" .devices | ternary (list .devices) .devices) }}
      - {{ . | quote }}
    {{- end }}
    {{- if hasKey . "units" }}
    units: {{ .units | int64 }}
    {{- end }}
    {{- if hasKey . "permissions" }}
    permissions: {{ .permissions | quote }}
    {{- end }}
    {{- with .mounts }}
    mounts:
    {{- range . }}
      - container_path: {{ .container_path | quote }}
        host_path: {{ .host_path | quote }}
        {{- if hasKey . "read_only" }}
        read_only: {{ .read_only }}
        {{- end }}
    {{- end }}
    {{- end }}
    {{- with .env }}
    env:
    {{- range $k, $v := . }}
      {{ $k | quote }}: {{ $v | toString | quote }}
    {{- end }}
    {{- end }}
    {{- if hasKey . "allocate" }}
    allocate: {{ .allocate | quote }}
    {{- end }}
    {{- with .cdi }}
    {{- $cdi := . }}
    cdi:
      {{- if hasKey . "file_mode" }}
      file_mode: {{ .file_mode | quote }}
      {{- end }}
      {{- range $key := list "uid" "gid" }}
      {{- if hasKey $cdi $key }}
      {{ $key }}: {{ index $cdi $key | int64 }}
      {{- end }}
      {{- end }}
    {{- end }}
    {{- if hasKey . "health" }}
    health: {{ .health | quote }}
    {{- end }}
    {{- if hasKey . "preferred_allocation" }}
    preferred_allocation: {{ .preferred_allocation }}
    {{- end }}
    {{- if hasKey . "restore_profiles" }}
    restore_profiles:
      {{- toYaml .restore_profiles | nindent 6 }}
    {{- end }}
{{- end }}
{{- end -}}

{{/*
--metrics-address value: HOST:PORT, IPv6 hosts in brackets.
*/}}
{{- define "ate-devplugin.metricsAddress" -}}
{{- $host := .Values.metrics.bindAddress -}}
{{- if contains ":" $host -}}
{{- printf "[%s]:%d" (trimAll "[]" $host) (int .Values.metrics.port) -}}
{{- else -}}
{{- printf "%s:%d" $host (int .Values.metrics.port) -}}
{{- end -}}
{{- end -}}

{{/*
Whether a monitoring.coreos.com/v1 kind may be rendered: its API is known to
helm (a live cluster, or `helm template --api-versions monitoring.coreos.com/v1/KIND`)
or forceMonitoringApi is set. Returns "true" or "".
Usage: include "ate-devplugin.monitoringApi" (list . "ServiceMonitor")
*/}}
{{- define "ate-devplugin.monitoringApi" -}}
{{- $ctx := index . 0 -}}
{{- $kind := index . 1 -}}
{{- if or $ctx.Values.forceMonitoringApi ($ctx.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind)) -}}
true
{{- end -}}
{{- end -}}

{{/*
The `node` label every scrape gets, from the pod's node name.
*/}}
{{- define "ate-devplugin.nodeRelabeling" -}}
- sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node
  action: replace
{{- end -}}

{{/*
OTEL_RESOURCE_ATTRIBUTES: k8s.* from the downward API (the $(VAR) references
are expanded by the kubelet from the env vars defined before it), then the
extra attributes from values, sorted by key.
*/}}
{{- define "ate-devplugin.otelResourceAttributes" -}}
{{- $attrs := list
  "k8s.node.name=$(K8S_NODE_NAME)"
  "k8s.pod.name=$(K8S_POD_NAME)"
  "k8s.pod.uid=$(K8S_POD_UID)"
  "k8s.namespace.name=$(K8S_NAMESPACE_NAME)"
  (printf "k8s.daemonset.name=%s" (include "ate-devplugin.daemonSetName" .))
  "k8s.container.name=ate-devplugin" -}}
{{- range $k := keys .Values.tracing.resourceAttributes | sortAlpha -}}
{{- $attrs = append $attrs (printf "%s=%v" $k (index $.Values.tracing.resourceAttributes $k)) -}}
{{- end -}}
{{- join "," $attrs -}}
{{- end -}}

{{/*
checkov findings that do not apply to this workload, each with its reason,
as checkov.io/skipN annotations (see chart/README.md "Security").
*/}}
{{- define "ate-devplugin.checkovSkips" -}}
{{- $skips := list
  "CKV_K8S_23=The kubelet's device-plugin socket directory belongs to root and is writable by its owner only; the daemon must create its sockets there; it runs as UID 0 but with every capability dropped, no privilege escalation, a read-only root filesystem and RuntimeDefault seccomp"
  "CKV_K8S_40=Same reason as CKV_K8S_23: UID 0 is required to write to the root-owned kubelet socket directory; a high UID cannot create the socket. No capabilities are kept"
-}}
{{- if not .Values.image.digest -}}
{{- $skips = append $skips "CKV_K8S_43=A digest is known only once the image is pushed (tools/release.sh prints it), so the chart's default is the release tag; set image.digest to pin it (this skip then disappears)" -}}
{{- if ne .Values.image.pullPolicy "Always" -}}
{{- $skips = append $skips "CKV_K8S_15=A node-critical daemon must restart without the registry (node reboot during a registry outage); pinning image.digest is the supported way to guarantee the image (this skip then disappears)" -}}
{{- end -}}
{{- end -}}
{{- if not (dig "limits" "cpu" "" .Values.resources) -}}
{{- $skips = append $skips "CKV_K8S_11=No CPU limit by default: Allocate runs on the pod start path and CFS throttling would delay pod admission; the daemon is idle otherwise (set resources.limits.cpu to add one; this skip then disappears)" -}}
{{- end -}}
{{- if include "ate-devplugin.dra" . -}}
{{- $skips = append $skips "CKV_K8S_38=dra.mode is dra or both: the DRA driver publishes this node's ResourceSlices and reads the claims it prepares, with the token of a ServiceAccount bound to exactly those verbs (dra-rbac.yaml)" -}}
{{- end -}}
{{- if not .Values.networkPolicy.enabled -}}
{{- $skips = append $skips "CKV2_K8S_6=networkPolicy.enabled is false: the operator chose to manage network policy for this namespace outside the chart" -}}
{{- end -}}
{{- $lines := list -}}
{{- range $i, $skip := $skips -}}
{{- $lines = append $lines (printf "checkov.io/skip%d: %s" (add1 $i) ($skip | quote)) -}}
{{- end -}}
{{- join "\n" $lines -}}
{{- end -}}

{{/*
"true" when the daemon is a DRA driver (dra.mode dra or both).
*/}}
{{- define "ate-devplugin.dra" -}}
{{- if ne .Values.dra.mode "device-plugin" -}}true{{- end -}}
{{- end -}}

{{/*
"true" when helm learned its Capabilities from the cluster: helm install and upgrade, `helm
template --validate` or `--dry-run=server`, and a GitOps tool that passes the cluster's
--api-versions (Argo CD does). The API list helm reads from a cluster names every kind
(apps/v1/DaemonSet); the one it makes up offline names groups and versions only (apps/v1),
with its own newest release as the version, which a template cannot tell from a
--kube-version given by hand.
*/}}
{{- define "ate-devplugin.clusterKnown" -}}
{{- if .Capabilities.APIVersions.Has "apps/v1/DaemonSet" -}}true{{- end -}}
{{- end -}}

{{/*
The Kubernetes release the templates may assume, or "" when nothing says it: kubeVersionOverride
when set (_validate.tpl refuses one newer than the cluster helm sees), else the cluster's when
helm knows it.
A release-dependent setting renders only for a known release at or above its bound, so a
render that cannot know the release is what every supported release (Chart.yaml kubeVersion)
takes. Callers compare with semverCompare after checking it is not empty.
*/}}
{{- define "ate-devplugin.kubeVersion" -}}
{{- if .Values.kubeVersionOverride -}}
{{- .Values.kubeVersionOverride -}}
{{- else if include "ate-devplugin.clusterKnown" . -}}
{{- .Capabilities.KubeVersion.Version -}}
{{- end -}}
{{- end -}}

{{/*
"true" when a rolling update overlaps the old and the new plugin pod on a node: device-plugin
mode on Kubernetes 1.37+, whose kubelet keeps one device plugin endpoint per socket path;
each pod then names its sockets with its UID (--socket-suffix), which the socket path length
rule of _deviceconfig.tpl counts too. Not when the release is unknown: an older kubelet
marks the new pod's devices unhealthy when the old pod stops.
*/}}
{{- define "ate-devplugin.overlap" -}}
{{- $kube := include "ate-devplugin.kubeVersion" . -}}
{{- if and (eq .Values.dra.mode "device-plugin") (eq .Values.updateStrategy.type "RollingUpdate") $kube (semverCompare ">=1.37.0-0" $kube) -}}true{{- end -}}
{{- end -}}

{{/*
"true" when the daemon serves the kubelet's device plugin API: the resources (not in dra
mode), or the prober's resource beside the probed one (kvmProbe.enabled, in every mode).
*/}}
{{- define "ate-devplugin.devicePlugin" -}}
{{- if or (ne .Values.dra.mode "dra") .Values.kvmProbe.enabled -}}true{{- end -}}
{{- end -}}

{{/*
"true" when the daemon writes CDI specs: a resource answers Allocate with its CDI device
name, cdi.mount says so, or the daemon is a DRA driver (an existingConfigMap's resources are not seen here).
*/}}
{{- define "ate-devplugin.usesCdi" -}}
{{- $uses := or .Values.cdi.mount (include "ate-devplugin.dra" .) -}}
{{- range .Values.deviceConfig.resources -}}
{{- if and (hasKey . "allocate") (ne .allocate "devices") -}}
{{- $uses = true -}}
{{- end -}}
{{- end -}}
{{- if $uses -}}true{{- end -}}
{{- end -}}


{{/*
Egress rules to the API server for the DRA driver under networkPolicy.restrictEgress: the
apiServerEgress value, or else what the cluster says at install: the `kubernetes`
Service's ClusterIP and the addresses of its EndpointSlice (a NetworkPolicy cannot name
the API server, and CNIs differ in whether they match before or after the Service's
translation). Fails when neither is known (helm template, no access to default).
*/}}
{{- define "ate-devplugin.apiServerEgress" -}}
{{- if .Values.networkPolicy.apiServerEgress -}}
{{- toYaml .Values.networkPolicy.apiServerEgress -}}
{{- else -}}
{{- $rules := list -}}
{{- $service := lookup "v1" "Service" "default" "kubernetes" -}}
{{- with $service -}}
{{- range .spec.ports -}}
{{- $rules = append $rules (dict "to" (list (dict "ipBlock" (dict "cidr" (printf "%s/%s" $service.spec.clusterIP (ternary "128" "32" (contains ":" $service.spec.clusterIP)))))) "ports" (list (dict "port" .port "protocol" "TCP"))) -}}
{{- end -}}
{{- end -}}
{{- with lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" -}}
{{- $peers := list -}}
{{- range .endpoints -}}
{{- range .addresses -}}
{{- $peers = append $peers (dict "ipBlock" (dict "cidr" (printf "%s/%s" . (ternary "128" "32" (contains ":" .))))) -}}
{{- end -}}
{{- end -}}
{{- $ports := list -}}
{{- range .ports -}}
{{- $ports = append $ports (dict "port" .port "protocol" "TCP") -}}
{{- end -}}
{{- if and $peers $ports -}}
{{- $rules = append $rules (dict "to" $peers "ports" $ports) -}}
{{- end -}}
{{- end -}}
{{- if not $rules -}}
{{- fail "networkPolicy.restrictEgress=true with dra.mode=dra or both: the DRA driver must reach the API server, and a NetworkPolicy can only allow it by address. The chart looks the addresses up on helm install and upgrade; here it cannot (helm template, or no read access to the default namespace), so set networkPolicy.apiServerEgress, e.g. [{to: [{ipBlock: {cidr: 10.0.0.10/32}}], ports: [{port: 6443, protocol: TCP}]}]" -}}
{{- end -}}
{{- toYaml $rules -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the API server serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy, or
when helm cannot ask it: DRA mode needs Kubernetes 1.34, and the policy API is GA since 1.30.
*/}}
{{- define "ate-devplugin.admissionPolicyApi" -}}
{{- if or (not (include "ate-devplugin.clusterKnown" .)) (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") -}}true{{- end -}}
{{- end -}}

{{/*
The DeviceClass of a resource name: <name>.<domain> (ate.dev/kvm: kvm.ate.dev).
*/}}
{{- define "ate-devplugin.deviceClassName" -}}
{{- printf "%s.%s" (splitList "/" . | last) (splitList "/" . | first) | lower | replace "_" "-" | trunc 253 -}}
{{- end -}}
