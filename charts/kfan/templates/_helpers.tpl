{{/*
Chart name, overridable by nameOverride.
*/}}
{{- define "kfan.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name, also the Service name and so the host of the default
advertised address. Truncated to 63 characters: it must be a DNS label.
A release whose name already contains the chart name is used as is.
*/}}
{{- define "kfan.fullname" -}}
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

{{- define "kfan.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kfan.labels" -}}
helm.sh/chart: {{ include "kfan.chart" . }}
{{ include "kfan.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Selector labels: immutable on a Deployment, so nothing that changes between
upgrades (versions) belongs here.
*/}}
{{- define "kfan.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kfan.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kfan.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kfan.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kfan.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The address clients are told to connect to: the advertise value, else the
Service's cluster DNS name and client port. Every replica advertises the same
address, which is what makes replicas interchangeable behind the Service.
*/}}
{{- define "kfan.advertise" -}}
{{- if .Values.advertise }}
{{- .Values.advertise }}
{{- else }}
{{- printf "%s.%s.svc.%s:%d" (include "kfan.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.service.port) }}
{{- end }}
{{- end }}

{{/*
Replicas the PodDisruptionBudget must reason about: the HPA's floor when it
owns the replica count.
*/}}
{{- define "kfan.minReplicas" -}}
{{- if .Values.autoscaling.enabled }}
{{- int .Values.autoscaling.minReplicas }}
{{- else }}
{{- int .Values.replicaCount }}
{{- end }}
{{- end }}

{{/*
The bootstrap brokers as kfan's KFAN_BOOTSTRAP wants them: HOST:PORT,HOST:PORT.
kafka.bootstrap may be that string or a list of HOST:PORT.
*/}}
{{- define "kfan.bootstrap" -}}
{{- $b := .Values.kafka.bootstrap -}}
{{- if kindIs "slice" $b -}}
{{- $b = join "," $b -}}
{{- end -}}
{{- required "kafka.bootstrap is required: the HOST:PORT[,HOST:PORT...] of the Kafka brokers" $b -}}
{{- end }}

{{/*
Seconds the kubelet waits between the start of pod deletion and SIGKILL:
the preStop sleep, kfan's drain (shutdownTimeoutSeconds, rounded up) and 5 s
to close (with workers, the parent waits 5 s beyond the drain for them).
An explicit terminationGracePeriodSeconds below that is refused.
*/}}
{{- define "kfan.terminationGracePeriodSeconds" -}}
{{- $need := add (int .Values.preStopSleepSeconds) (int (ceil .Values.shutdownTimeoutSeconds)) 5 -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds -}}
{{- $need -}}
{{- else if lt (int .Values.terminationGracePeriodSeconds) (int $need) -}}
{{- fail (printf "terminationGracePeriodSeconds %d is shorter than kfan's shutdown: preStopSleepSeconds (%d) + shutdownTimeoutSeconds (%v, rounded up) + 5 = %d; raise it, lower shutdownTimeoutSeconds, or leave it empty to have it computed" (int .Values.terminationGracePeriodSeconds) (int .Values.preStopSleepSeconds) .Values.shutdownTimeoutSeconds (int $need)) -}}
{{- else -}}
{{- int .Values.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end }}

{{/*
kfan's environment, as a YAML map: every name is an option of `kfan serve`
(proxy/config.py OPTIONS, KFAN_<FLAG>) or KFAN_CONFIG (the config file).
The chart sets the first group ($owned) from its values; extraEnv may add the
second group and any non-KFAN_ name, nothing else. The two listen addresses
are flags in the container's args, not environment: `kfan serve --workers N`
starts its workers with the parent's environment, and a worker that inherits
KFAN_METRICS_LISTEN binds the parent's metrics port and dies.
*/}}
{{- define "kfan.env" -}}
{{- $owned := dict
  "KFAN_BOOTSTRAP" "kafka.bootstrap"
  "KFAN_LISTEN" "containerPorts.kafka"
  "KFAN_ADVERTISE" "advertise"
  "KFAN_NODE_ID" "nodeId"
  "KFAN_METRICS_LISTEN" "containerPorts.metrics"
  "KFAN_WORKERS" "workers"
  "KFAN_SHUTDOWN_TIMEOUT" "shutdownTimeoutSeconds"
  "KFAN_LOG_LEVEL" "logLevel"
  "KFAN_LOG_JSON" "logJson"
  "KFAN_CONFIG" "configFile"
-}}
{{- $extraAllowed := list "KFAN_MAX_FRAME_BYTES" "KFAN_MAX_INFLIGHT" "KFAN_MAX_CONNECTION_BYTES" "KFAN_MAX_BUFFERED_BYTES" "KFAN_MAX_CONNECTIONS" "KFAN_MAX_HOLD" "KFAN_IDLE_TIMEOUT" "KFAN_FRAME_TIMEOUT" "KFAN_REQUEST_TIMEOUT" "KFAN_METADATA_REFRESH" "KFAN_CAPTURE" "KFAN_CAPTURE_SAMPLE" "KFAN_CAPTURE_RECORDS" -}}
{{- $env := dict
  "KFAN_BOOTSTRAP" (include "kfan.bootstrap" .)
  "KFAN_ADVERTISE" (include "kfan.advertise" .)
  "KFAN_NODE_ID" (toString (int .Values.nodeId))
  "KFAN_WORKERS" (toString (int .Values.workers))
  "KFAN_SHUTDOWN_TIMEOUT" (toString .Values.shutdownTimeoutSeconds)
  "KFAN_LOG_LEVEL" .Values.logLevel
  "KFAN_LOG_JSON" (ternary "true" "false" (.Values.logJson | default false))
-}}
{{- with .Values.configFile }}
{{- $_ := set $env "KFAN_CONFIG" "/etc/kfan/config/kfan.toml" }}
{{- $key := regexFind "(?m)^[ \t]*(bootstrap|listen|advertise|node[-_]id|metrics[-_]listen|workers|shutdown[-_]timeout|log[-_]level|log[-_]json)[ \t]*=" . }}
{{- if $key }}
{{- fail (printf "configFile: %q is set by the chart from its values; leave it out of the file" (trimSuffix "=" $key | trim)) }}
{{- end }}
{{- end }}
{{- range $k, $v := .Values.extraEnv }}
{{- if hasKey $owned $k }}
{{- fail (printf "extraEnv.%s: the chart sets %s from the value %s; set that instead" $k $k (get $owned $k)) }}
{{- else if and (hasPrefix "KFAN_" $k) (not (has $k $extraAllowed)) }}
{{- fail (printf "extraEnv.%s: not an option of kfan serve; the KFAN_* names extraEnv takes are %s" $k (join ", " $extraAllowed)) }}
{{- end }}
{{- $_ := set $env $k (toString $v) }}
{{- end }}
{{- toYaml $env }}
{{- end }}
