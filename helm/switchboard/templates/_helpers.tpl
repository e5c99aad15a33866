{{/* The chart name, or nameOverride. */}}
{{- define "switchboard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release-qualified name: fullnameOverride, or <release>-<chart> (just <release> when it
already contains the chart name). Truncated so that "-<service>" still fits in 63 characters. */}}
{{- define "switchboard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart label value */}}
{{- define "switchboard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "switchboard.labels" -}}
helm.sh/chart: {{ include "switchboard.chart" . }}
app.kubernetes.io/name: {{ include "switchboard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: switchboard
{{- end }}

{{/* Selector labels of one service; call with (dict "root" $ "service" "directory"). */}}
{{- define "switchboard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "switchboard.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .service }}
{{- end }}

{{/* The name of the Secret holding the NATS credentials ("" when there is none). */}}
{{- define "switchboard.natsSecretName" -}}
{{- $auth := .Values.nats.auth }}
{{- if ne $auth.type "none" }}
{{- default (printf "%s-nats" (include "switchboard.fullname" .)) $auth.existingSecret }}
{{- end }}
{{- end }}

{{/* The name of the ConfigMap holding the people file (key people.toml). */}}
{{- define "switchboard.peopleConfigMap" -}}
{{- default (printf "%s-people" (include "switchboard.fullname" .)) .Values.people.existingConfigMap }}
{{- end }}

{{/* The image reference. */}}
{{- define "switchboard.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* A service's config section name: inbox-fanout -> INBOX_FANOUT. */}}
{{- define "switchboard.section" -}}
{{- . | replace "-" "_" | upper }}
{{- end }}

{{/* An environment value: lists become figment's [a,b] form, everything else a string. */}}
{{- define "switchboard.envValue" -}}
{{- if kindIs "slice" . }}
{{- printf "[%s]" (join "," .) | quote }}
{{- else }}
{{- toString . | quote }}
{{- end }}
{{- end }}

{{/* Fails rendering on values that cannot work. */}}
{{- define "switchboard.validate" -}}
{{- $types := list "none" "nkey" "userPassword" "token" "creds" }}
{{- if not (has .Values.nats.auth.type $types) }}
{{- fail (printf "nats.auth.type must be one of %s, got %q" (join ", " $types) .Values.nats.auth.type) }}
{{- end }}
{{- $auth := .Values.nats.auth }}
{{- if and $auth.consoleNkeySeed (or (ne $auth.type "nkey") $auth.existingSecret (not $auth.nkeySeed)) }}
{{- fail "nats.auth.consoleNkeySeed goes into the Secret the chart renders, which needs nats.auth.type nkey, nats.auth.nkeySeed and no existingSecret: otherwise put the key console.nk into your own Secret" }}
{{- end }}
{{- if not .Values.nats.urls }}
{{- fail "nats.urls must list at least one server" }}
{{- end }}
{{- $replicas := int .Values.jetstream.replicas }}
{{- if or (lt $replicas 1) (gt $replicas 5) }}
{{- fail (printf "jetstream.replicas must be 1..5, got %d" $replicas) }}
{{- end }}
{{- $known := list "directory" "inbox-fanout" "reply-correlator" "task-lifecycle" "audit" "a2a-gateway" "people" "limits" "files" "console" }}
{{- range $name, $svc := .Values.services }}
{{- if not (has $name $known) }}
{{- fail (printf "services.%s: not a Switchboard service (one of %s)" $name (join ", " $known)) }}
{{- end }}
{{- end }}
{{- if .Values.metrics.enabled }}
{{- $port := int .Values.metrics.port }}
{{- if or (lt $port 1) (gt $port 65535) }}
{{- fail (printf "metrics.port must be 1..65535, got %d" $port) }}
{{- end }}
{{- if and (index .Values.services "a2a-gateway").enabled (eq $port (int .Values.a2aGateway.port)) }}
{{- fail (printf "metrics.port %d is the A2A gateway's port (a2aGateway.port): give them different ports" $port) }}
{{- end }}
{{- if and .Values.services.console.enabled (eq $port (int .Values.console.port)) }}
{{- fail (printf "metrics.port %d is the console's port (console.port): give them different ports" $port) }}
{{- end }}
{{- else if .Values.metrics.serviceMonitor.enabled }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.enabled (the ServiceMonitor scrapes the metrics port)" }}
{{- end }}
{{- $console := .Values.services.console }}
{{- if $console.enabled }}
{{- if gt (int $console.replicas) 1 }}
{{- fail "services.console.replicas must be 1: sign-ins live in the console process's memory, another replica would not know them" }}
{{- end }}
{{- $consolePort := int .Values.console.port }}
{{- if or (lt $consolePort 1) (gt $consolePort 65535) }}
{{- fail (printf "console.port must be 1..65535, got %d" $consolePort) }}
{{- end }}
{{- with .Values.console.traceUrlTemplate }}
{{- if not (and (regexMatch "^https?://" .) (contains "{trace_id}" .)) }}
{{- fail (printf "console.traceUrlTemplate must be an http(s) URL with {trace_id} in it, got %q" .) }}
{{- end }}
{{- end }}
{{- if not (kindIs "slice" .Values.console.allowedHosts) }}
{{- fail "console.allowedHosts must be a list of Host values, e.g. [console.example.com]" }}
{{- end }}
{{- end }}
{{- $audit := .Values.services.audit }}
{{- if and .Values.auditIndex.persistence.enabled $audit.enabled (gt (int $audit.replicas) 1) }}
{{- fail "auditIndex.persistence needs services.audit.replicas = 1 (one index file per replica)" }}
{{- end }}
{{- end }}
