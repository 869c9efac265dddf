{{/*
The chart name, or nameOverride; truncated to 63 characters (a DNS label).
*/}}
{{- define "aaco.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name: fullnameOverride, else <release>-<name> (just <release> when it already contains
the name); truncated to 63 characters because Kubernetes names and labels are DNS labels.
*/}}
{{- define "aaco.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
<chart>-<version>, for the helm.sh/chart label of resources (never of pods: a chart upgrade that
changes nothing in the pod must not restart every agent).
*/}}
{{- define "aaco.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: stable for the life of a release (a DaemonSet's selector is immutable).
*/}}
{{- define "aaco.selectorLabels" -}}
app.kubernetes.io/name: {{ include "aaco.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of every resource.
*/}}
{{- define "aaco.labels" -}}
helm.sh/chart: {{ include "aaco.chart" . }}
{{ include "aaco.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: aaco
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Labels of the agent pods: the selector labels and the component, no chart version.
*/}}
{{- define "aaco.podLabels" -}}
{{ include "aaco.selectorLabels" . }}
app.kubernetes.io/component: agent
app.kubernetes.io/part-of: aaco
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- with .Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The ServiceAccount's name.
*/}}
{{- define "aaco.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "aaco.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image reference: repository@digest, else repository:tag (tag defaults to appVersion).
*/}}
{{- define "aaco.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Ports and paths read from the agent's config (with the agent's own defaults), so that the
config stays the one place they are set.
*/}}
{{- define "aaco.metricsPort" -}}
{{- $prom := (((.Values.config).exporters).prometheus) | default dict }}
{{- $prom.port | default 9464 | int }}
{{- end }}

{{- define "aaco.receiverEnabled" -}}
{{- $otlp := (((.Values.config).receivers).otlp) | default dict }}
{{- if $otlp.enabled }}true{{ end }}
{{- end }}

{{- define "aaco.otlpGrpcPort" -}}
{{- $otlp := (((.Values.config).receivers).otlp) | default dict }}
{{- $otlp.grpc_port | default 4317 | int }}
{{- end }}

{{- define "aaco.otlpHttpPort" -}}
{{- $otlp := (((.Values.config).receivers).otlp) | default dict }}
{{- $otlp.http_port | default 4318 | int }}
{{- end }}

{{/*
The capabilities the enabled features need, one per line, each with its reason. Empty when no
feature needs one. Everything else is dropped (drop: [ALL]).
*/}}
{{- define "aaco.capabilities" -}}
{{- if .Values.ebpf.enabled }}
# BPF: bpf(2) to load the scheduler programs and create their maps (kernel >= 5.8).
- BPF
# PERFMON: perf_event_open(2) to attach them to the sched:* tracepoints (kernel >= 5.8).
- PERFMON
# SYS_RESOURCE: raise RLIMIT_MEMLOCK; kernels before 5.11 charge BPF maps against it.
- SYS_RESOURCE
{{- end }}
{{- if or .Values.processDiscovery.enabled .Values.capture.enabled }}
# SYS_PTRACE: read other users' /proc/<pid>/fd to find GPU processes, and attach rocprofv3 to them (capture windows).
- SYS_PTRACE
{{- end }}
{{- if and .Values.traceSpool.enabled .Values.traceSpool.readAnyFile }}
# DAC_READ_SEARCH: read spool trace files that workloads wrote without read permission for others.
- DAC_READ_SEARCH
{{- end }}
{{- end }}

{{/*
Refuse values that would deploy an agent that cannot work, each with the reason.
*/}}
{{- define "aaco.validate" -}}
{{- $config := .Values.config | default dict }}
{{- $exporters := $config.exporters | default dict }}
{{- $prom := $exporters.prometheus | default dict }}
{{- if and (hasKey $prom "enabled") (not $prom.enabled) }}
{{- fail "config.exporters.prometheus.enabled is false: the liveness and readiness probes use its /healthz and /readyz" }}
{{- end }}
{{- if or (not $prom.address) (hasPrefix "127." (toString $prom.address)) (eq (toString $prom.address) "localhost") (eq (toString $prom.address) "::1") }}
{{- fail (printf "config.exporters.prometheus.address is %v: the kubelet probes and Prometheus connect to the pod IP; use 0.0.0.0 (or ::)" ($prom.address | default "unset (the agent's default 127.0.0.1)")) }}
{{- end }}
{{- $otlp := (($config.receivers).otlp) | default dict }}
{{- if and $otlp.enabled (or (not $otlp.address) (hasPrefix "127." (toString $otlp.address)) (eq (toString $otlp.address) "localhost") (eq (toString $otlp.address) "::1")) }}
{{- fail (printf "config.receivers.otlp.address is %v: applications reach the receiver through the pod IP; use 0.0.0.0 (or ::)" ($otlp.address | default "unset (the agent's default 127.0.0.1)")) }}
{{- end }}
{{- $lake := $exporters.lake | default dict }}
{{- if or (not (hasKey $lake "enabled")) $lake.enabled }}
{{- $path := toString ($lake.path | default "aaco-data") }}
{{- $root := printf "%s/" (trimSuffix "/" .Values.state.mountPath) }}
{{- if not (hasPrefix $root $path) }}
{{- fail (printf "config.exporters.lake.path is %s: it must lie under state.mountPath (%s), the only persistent writable path (the root filesystem is read-only)" $path .Values.state.mountPath) }}
{{- end }}
{{- end }}
{{- $mounted := list (printf "%s/" (trimSuffix "/" .Values.state.mountPath)) }}
{{- if .Values.traceSpool.enabled }}
{{- $mounted = append $mounted (printf "%s/" (trimSuffix "/" .Values.traceSpool.mountPath)) }}
{{- end }}
{{- if .Values.capture.enabled }}
{{- $mounted = append $mounted (printf "%s/" (trimSuffix "/" .Values.capture.mountPath)) }}
{{- end }}
{{- range .Values.extraVolumeMounts }}
{{- $mounted = append $mounted (printf "%s/" (trimSuffix "/" .mountPath)) }}
{{- end }}
{{- range ($config.sources | default list) }}
{{- if eq (toString .type) "trace_dir" }}
{{- $dir := printf "%s/" (trimSuffix "/" (toString .path)) }}
{{- $found := false }}
{{- range $mounted }}
{{- if hasPrefix . $dir }}
{{- $found = true }}
{{- end }}
{{- end }}
{{- if not $found }}
{{- fail (printf "config.sources: the trace_dir source reads %s, which no volume provides (the root filesystem is read-only): use traceSpool.mountPath (%s) with traceSpool.enabled, or mount it with extraVolumes" (toString .path) $.Values.traceSpool.mountPath) }}
{{- end }}
{{- end }}
{{- if eq (toString .type) "capture" }}
{{- if not $.Values.capture.enabled }}
{{- fail "config.sources has a capture source but capture.enabled is false: attaching a profiler needs SYS_PTRACE and the shared capture directory" }}
{{- end }}
{{- $out := printf "%s/" (trimSuffix "/" (toString (.out_dir | default "/var/lib/aaco/captures"))) }}
{{- $found := false }}
{{- range $mounted }}
{{- if hasPrefix . $out }}
{{- $found = true }}
{{- end }}
{{- end }}
{{- if not $found }}
{{- fail (printf "config.sources: the capture source writes to %s, which no volume provides; use capture.mountPath (%s), shared with the workloads" (trimSuffix "/" $out) $.Values.capture.mountPath) }}
{{- end }}
{{- end }}
{{- if and (eq (toString .type) "sched") (eq (toString .backend) "ebpf") (not $.Values.ebpf.enabled) }}
{{- fail "config.sources has a sched source with backend ebpf but ebpf.enabled is false (it grants BPF, PERFMON, SYS_RESOURCE, tracefs and the kernel headers); enable it or use backend auto or proc" }}
{{- end }}
{{- end }}
{{- if and .Values.gpu.amd.devices (not .Values.privileged) }}
{{- fail "gpu.amd.devices needs privileged: true: a non-privileged container's device cgroup denies opening /dev/kfd and /dev/dri even when they are mounted (the smi source's sysfs backend needs neither)" }}
{{- end }}
{{- if and (ne (int .Values.runAsUser) 0) (include "aaco.capabilities" . | trim) }}
{{- fail (printf "runAsUser is %d but enabled features add capabilities: Kubernetes grants added capabilities to root only; use runAsUser 0 or disable ebpf, processDiscovery, capture and traceSpool.readAnyFile" (int .Values.runAsUser)) }}
{{- end }}
{{- if and .Values.otlpTls.secretName (not (hasPrefix "/" .Values.otlpTls.mountPath)) }}
{{- fail "otlpTls.mountPath must be an absolute path" }}
{{- end }}
{{- if and .Values.metrics.tls.enabled (not .Values.metrics.tls.existingSecret) }}
{{- fail "metrics.tls.enabled needs metrics.tls.existingSecret: a Secret with tls.crt and tls.key (kubernetes.io/tls, e.g. from cert-manager), and ca.crt for client certificates" }}
{{- end }}
{{- if hasPrefix "Require" .Values.metrics.tls.clientAuthType }}
{{- fail (printf "metrics.tls.clientAuthType %s: the kubelet's probes present no client certificate, so /healthz and /readyz would fail; use VerifyClientCertIfGiven (with basic auth for the rest)" .Values.metrics.tls.clientAuthType) }}
{{- end }}
{{- if and .Values.metrics.basicAuth.username (not (regexMatch "^\\$2[aby]?\\$[0-9]{2}\\$.{53}$" (toString .Values.metrics.basicAuth.passwordHash))) }}
{{- fail "metrics.basicAuth.passwordHash must be a bcrypt hash (the web-config format stores no passwords): htpasswd -nBC 10 '' | tr -d ':\\n'" }}
{{- end }}
{{- if and .Values.metrics.basicAuth.username .Values.metrics.webConfig.existingSecret }}
{{- fail "metrics.basicAuth.username and metrics.webConfig.existingSecret are both set: put the users in the existing web-config file (basic_auth_users), or let the chart render it" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled .Values.metrics.basicAuth.username (not .Values.serviceMonitor.basicAuthSecret.name) }}
{{- fail "metrics.basicAuth is on but serviceMonitor.basicAuthSecret.name is empty: Prometheus needs the plaintext username and password from a Secret to scrape" }}
{{- end }}
{{- if and .Values.receiver.tls.existingSecret (not (include "aaco.receiverEnabled" .)) }}
{{- fail "receiver.tls.existingSecret is set but config.receivers.otlp.enabled is false: there is no receiver to serve TLS" }}
{{- end }}
{{- end }}

{{/*
The memory limit: resources.limits.memory when set, else derived from the OTLP byte budget:
memoryLimit.baseMiB (the agent without OTLP data) + 2 x config.exporters.otlp.memory_budget_mib
(what the budget does not count, allowed as much again). docs/security.md, "Memory". The agent's memory
guard reads the limit from its cgroup and holds the process under nine tenths of it.
*/}}
{{- define "aaco.memoryLimit" -}}
{{- $limits := (.Values.resources).limits | default dict }}
{{- if $limits.memory }}
{{- $limits.memory }}
{{- else }}
{{- $budget := (((.Values.config).exporters).otlp | default dict).memory_budget_mib | default 256 | int }}
{{- printf "%dMi" (add (int .Values.memoryLimit.baseMiB) (mul 2 $budget)) }}
{{- end }}
{{- end }}

{{/*
The container's resources, with the memory limit of aaco.memoryLimit.
*/}}
{{- define "aaco.resources" -}}
{{- $resources := deepCopy (.Values.resources | default dict) }}
{{- $limits := $resources.limits | default dict }}
{{- $_ := set $limits "memory" (include "aaco.memoryLimit" .) }}
{{- $_ := set $resources "limits" $limits }}
{{- toYaml $resources }}
{{- end }}

{{/*
Admin actions (POST /api/v1/capture, the capture source's on-demand windows) need a bearer token:
mounted from a Secret whenever capture windows are on (the only admin action).
*/}}
{{- define "aaco.adminToken" -}}
{{- if .Values.capture.enabled }}true{{ end }}
{{- end }}

{{- define "aaco.adminSecretName" -}}
{{- .Values.admin.existingSecret | default (printf "%s-admin" (include "aaco.fullname" .)) }}
{{- end }}

{{/*
/metrics behind a Prometheus web-config file (TLS, basic auth): the chart's own or metrics.webConfig.existingSecret.
*/}}
{{- define "aaco.webConfigEnabled" -}}
{{- if or .Values.metrics.tls.enabled .Values.metrics.basicAuth.username .Values.metrics.webConfig.existingSecret }}true{{ end }}
{{- end }}

{{- define "aaco.webConfigSecretName" -}}
{{- .Values.metrics.webConfig.existingSecret | default (printf "%s-web-config" (include "aaco.fullname" .)) }}
{{- end }}

{{/*
The web-config file the chart renders (exporter-toolkit format, as node-exporter and dcgm-exporter read it).
*/}}
{{- define "aaco.webConfig" -}}
{{- $web := dict }}
{{- if .Values.metrics.tls.enabled }}
{{- $root := trimSuffix "/" .Values.metrics.tls.mountPath }}
{{- $tls := dict "cert_file" (printf "%s/tls.crt" $root) "key_file" (printf "%s/tls.key" $root) }}
{{- if ne .Values.metrics.tls.clientAuthType "NoClientCert" }}
{{- $_ := set $tls "client_auth_type" .Values.metrics.tls.clientAuthType }}
{{- $_ := set $tls "client_ca_file" (printf "%s/ca.crt" $root) }}
{{- end }}
{{- $_ := set $web "tls_server_config" $tls }}
{{- end }}
{{- with .Values.metrics.basicAuth.username }}
{{- $_ := set $web "basic_auth_users" (dict . $.Values.metrics.basicAuth.passwordHash) }}
{{- end }}
{{- toYaml $web }}
{{- end }}

{{/*
The agent's config: .Values.config with the keys the chart owns when it mounts their files
(admin.token_file, exporters.prometheus.web_config_file, receivers.otlp.tls).
*/}}
{{- define "aaco.config" -}}
{{- $config := deepCopy (.Values.config | default dict) }}
{{- if include "aaco.adminToken" . }}
{{- $admin := get $config "admin" | default dict }}
{{- $_ := set $admin "token_file" (printf "%s/token" (trimSuffix "/" .Values.admin.mountPath)) }}
{{- $_ := set $config "admin" $admin }}
{{- end }}
{{- if include "aaco.webConfigEnabled" . }}
{{- $exporters := get $config "exporters" | default dict }}
{{- $prom := get $exporters "prometheus" | default dict }}
{{- $_ := set $prom "web_config_file" (printf "%s/web-config.yml" (trimSuffix "/" .Values.metrics.webConfig.mountPath)) }}
{{- $_ := set $exporters "prometheus" $prom }}
{{- $_ := set $config "exporters" $exporters }}
{{- end }}
{{- if .Values.receiver.tls.existingSecret }}
{{- $root := trimSuffix "/" .Values.receiver.tls.mountPath }}
{{- $receivers := get $config "receivers" | default dict }}
{{- $otlp := get $receivers "otlp" | default dict }}
{{- $tls := dict "cert_file" (printf "%s/tls.crt" $root) "key_file" (printf "%s/tls.key" $root) "client_ca_file" nil }}
{{- if .Values.receiver.tls.verifyClients }}
{{- $_ := set $tls "client_ca_file" (printf "%s/ca.crt" $root) }}
{{- end }}
{{- $_ := set $otlp "tls" $tls }}
{{- $_ := set $receivers "otlp" $otlp }}
{{- $_ := set $config "receivers" $receivers }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/*
Secret volumes: 0400, read by the agent (root). A non-root agent reads them through fsGroup (the
kubelet makes them 0440, group-owned by it).
*/}}
{{- define "aaco.fsGroup" -}}
{{- if ne (int .Values.runAsUser) 0 }}{{ .Values.runAsGroup }}{{ end }}
{{- end }}

{{/*
Node Problem Detector running `aaco health` as a custom plugin (nodeProblemDetector.enabled): its
resources' name (<fullname>-npd, within 63 characters), its pods' labels (another
app.kubernetes.io/name, so that the agent's Services and DaemonSet never select them), NPD's image.
*/}}
{{- define "aaco.npd.fullname" -}}
{{- printf "%s-npd" (include "aaco.fullname" . | trunc 59 | trimSuffix "-") }}
{{- end }}

{{- define "aaco.npd.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-node-problem-detector" (include "aaco.name" . | trunc 40 | trimSuffix "-") }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "aaco.npd.image" -}}
{{- $image := .Values.nodeProblemDetector.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository $image.tag }}
{{- end }}
{{- end }}

{{/*
Where the plugin's files are mounted in the NPD container, and where the node's kernel log is.
*/}}
{{- define "aaco.npd.configDir" -}}
/etc/aaco/npd
{{- end }}

{{- define "aaco.npd.kernelLogDir" -}}
/host/kernel-log
{{- end }}

{{/*
The `aaco health` command line of the plugin script: the node's sysfs as the agent mounts it, the
thresholds of the agent's config (analyzers.health), the kernel log when one is given.
*/}}
{{- define "aaco.npd.healthArgs" -}}
{{- $args := list "health" }}
{{- if .Values.host.sys.enabled }}
{{- $args = concat $args (list "--sysfs-root" .Values.host.sys.mountPath) }}
{{- end }}
{{- $args = concat $args (list "--config" (printf "%s/health.yaml" (include "aaco.npd.configDir" .))) }}
{{- with .Values.nodeProblemDetector.kernelLog }}
{{- $args = concat $args (list "--kernel-log" (printf "%s/%s" (include "aaco.npd.kernelLogDir" $) (base .))) }}
{{- end }}
{{- range $args }} {{ . | squote }}{{ end }}
{{- end }}
