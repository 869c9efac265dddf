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
{{- if $otlp.enabled }}
{{- $upstream := (($exporters.otlp) | default dict).endpoint }}
{{- range .Values.extraEnv }}
{{- if has .name (list "OTEL_EXPORTER_OTLP_ENDPOINT" "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") }}
{{- $upstream = true }}
{{- end }}
{{- end }}
{{- if not $upstream }}
{{- fail "config.receivers.otlp.enabled needs an upstream: the agent forwards what it receives; set config.exporters.otlp.endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT in extraEnv)" }}
{{- end }}
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
{{- end }}
