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
{{- $drain := ternary (add (int (ceil .Values.drainPeriodSeconds)) 1) 0 (gt (float64 .Values.drainPeriodSeconds) 0.0) -}}
{{- $need := add (int .Values.preStopSleepSeconds) $drain (int (ceil .Values.shutdownTimeoutSeconds)) 5 -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds -}}
{{- $need -}}
{{- else if lt (int .Values.terminationGracePeriodSeconds) (int $need) -}}
{{- fail (printf "terminationGracePeriodSeconds %d is shorter than kfan's shutdown: preStopSleepSeconds (%d) + drainPeriodSeconds (%v, rounded up, + 1 when set) + shutdownTimeoutSeconds (%v, rounded up) + 5 = %d; raise it, lower shutdownTimeoutSeconds, or leave it empty to have it computed" (int .Values.terminationGracePeriodSeconds) (int .Values.preStopSleepSeconds) .Values.drainPeriodSeconds .Values.shutdownTimeoutSeconds (int $need)) -}}
{{- else -}}
{{- int .Values.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end }}

{{/*
"MOUNTPATH/FILE": where a file of a mounted Secret appears. Takes (list mountPath file).
*/}}
{{- define "kfan.path" -}}
{{- printf "%s/%s" (trimSuffix "/" (index . 0)) (index . 1) -}}
{{- end }}

{{/*
Every Secret the kfan container mounts, as a YAML list of {name, secretName,
mountPath, files}: one volume per Secret, read-only, projecting only the keys
kfan reads (each key is also its file name). Nothing secret ever goes through
the ConfigMap: it holds the paths below, never their contents. The volumes
are mounted whole (no subPath), so the kubelet's updates of a rotated Secret
reach kfan, which re-reads the files.
*/}}
{{- define "kfan.secretVolumes" -}}
{{- include "kfan.checkSecurity" . -}}
{{- $v := list -}}
{{- $tls := .Values.tls -}}
{{- if $tls.enabled -}}
{{- $v = append $v (dict "name" "tls" "secretName" $tls.secretName "mountPath" $tls.mountPath "files" (list $tls.certFile $tls.keyFile)) -}}
{{- if $tls.clientCA.enabled -}}
{{- $v = append $v (dict "name" "client-ca" "secretName" (default $tls.secretName $tls.clientCA.secretName) "mountPath" $tls.clientCA.mountPath "files" (list $tls.clientCA.file)) -}}
{{- end -}}
{{- end -}}
{{- $btls := .Values.brokerTls -}}
{{- if $btls.enabled -}}
{{- with $btls.ca -}}
{{- if .secretName -}}
{{- $v = append $v (dict "name" "broker-ca" "secretName" .secretName "mountPath" .mountPath "files" (list .file)) -}}
{{- end -}}
{{- end -}}
{{- with $btls.clientCert -}}
{{- if .secretName -}}
{{- $v = append $v (dict "name" "broker-tls" "secretName" .secretName "mountPath" .mountPath "files" (list .certFile .keyFile)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $sasl := .Values.brokerSasl -}}
{{- if eq $sasl.mechanism "OAUTHBEARER" -}}
{{- $v = append $v (dict "name" "broker-sasl-token" "secretName" $sasl.token.secretName "mountPath" $sasl.token.mountPath "files" (list $sasl.token.file)) -}}
{{- else if $sasl.mechanism -}}
{{- $v = append $v (dict "name" "broker-sasl-password" "secretName" $sasl.password.secretName "mountPath" $sasl.password.mountPath "files" (list $sasl.password.file)) -}}
{{- end -}}
{{- $authz := .Values.authorization -}}
{{- if and (eq $authz.authorizer "acls") $authz.aclSecret.secretName -}}
{{- $v = append $v (dict "name" "acls" "secretName" $authz.aclSecret.secretName "mountPath" $authz.aclSecret.mountPath "files" (list $authz.aclSecret.file)) -}}
{{- end -}}
{{- $auth := .Values.clientAuth -}}
{{- if eq $auth.mode "sasl" -}}
{{- with $auth.users -}}
{{- if .secretName -}}
{{- $v = append $v (dict "name" "client-users" "secretName" .secretName "mountPath" .mountPath "files" (list .file)) -}}
{{- end -}}
{{- end -}}
{{- with $auth.oauth.jwks -}}
{{- if .secretName -}}
{{- $v = append $v (dict "name" "client-oauth-jwks" "secretName" .secretName "mountPath" .mountPath "files" (list .file)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $paths := dict -}}
{{- range $v -}}
{{- if hasKey $paths .mountPath -}}
{{- fail (printf "the Secrets of %s and %s are both mounted at %s; give them different mountPath values" (get $paths .mountPath) .name .mountPath) -}}
{{- end -}}
{{- $_ := set $paths .mountPath .name -}}
{{- end -}}
{{- toYaml $v -}}
{{- end }}

{{/*
Security values that do not fit together are refused here, with the value
names, before kfan would refuse them at start-up (proxy/server/security_options.py).
Per-value checks (enums, a secretName where one is needed) are in
values.schema.json.
*/}}
{{- define "kfan.checkSecurity" -}}
{{- $tls := .Values.tls -}}
{{- $btls := .Values.brokerTls -}}
{{- $sasl := .Values.brokerSasl -}}
{{- $auth := .Values.clientAuth -}}
{{- if and $tls.clientCA.enabled (not $tls.enabled) -}}
{{- fail "tls.clientCA.enabled needs tls.enabled: client certificates come with TLS" -}}
{{- end -}}
{{- if and (not $btls.enabled) (or $btls.serverName $btls.ca.secretName $btls.clientCert.secretName) -}}
{{- fail "brokerTls.ca, brokerTls.clientCert and brokerTls.serverName need brokerTls.enabled" -}}
{{- end -}}
{{- if not $sasl.mechanism -}}
{{- if or $sasl.username $sasl.password.secretName $sasl.token.secretName -}}
{{- fail "brokerSasl.username, brokerSasl.password and brokerSasl.token need brokerSasl.mechanism" -}}
{{- end -}}
{{- else if eq $sasl.mechanism "OAUTHBEARER" -}}
{{- if $sasl.password.secretName -}}
{{- fail "brokerSasl.password is for PLAIN and SCRAM; OAUTHBEARER logs in with brokerSasl.token" -}}
{{- end -}}
{{- else if $sasl.token.secretName -}}
{{- fail (printf "brokerSasl.token is for OAUTHBEARER; %s logs in with brokerSasl.username and brokerSasl.password" $sasl.mechanism) -}}
{{- end -}}
{{- if eq $auth.mode "mtls" -}}
{{- if not $tls.clientCA.enabled -}}
{{- fail "clientAuth.mode mtls needs tls.enabled and tls.clientCA.enabled: kfan checks client certificates against that CA" -}}
{{- end -}}
{{- end -}}
{{- if ne $auth.mode "sasl" -}}
{{- if or $auth.users.secretName $auth.oauth.jwks.secretName $auth.mechanisms -}}
{{- fail "clientAuth.users, clientAuth.oauth.jwks and clientAuth.mechanisms need clientAuth.mode sasl" -}}
{{- end -}}
{{- end -}}
{{- if and (or $auth.oauth.issuer $auth.oauth.audience) (not $auth.oauth.jwks.secretName) -}}
{{- fail "clientAuth.oauth.issuer and clientAuth.oauth.audience need clientAuth.oauth.jwks: kfan checks tokens against its keys" -}}
{{- end -}}
{{- $carry := eq $sasl.identity "client" -}}
{{- if $carry -}}
{{- if ne $auth.mode "sasl" -}}
{{- fail "brokerSasl.identity client needs clientAuth.mode sasl: kfan carries the credentials a client logs in with" -}}
{{- end -}}
{{- if not $sasl.mechanism -}}
{{- fail "brokerSasl.identity client needs brokerSasl.mechanism too: kfan's own requests (metadata) log in as kfan" -}}
{{- end -}}
{{- range $auth.mechanisms -}}
{{- if hasPrefix "SCRAM-" . -}}
{{- fail (printf "clientAuth.mechanisms: %s cannot be offered with brokerSasl.identity client, SCRAM credentials cannot be replayed to the brokers (offer PLAIN or OAUTHBEARER)" .) -}}
{{- end -}}
{{- end -}}
{{- else if and (eq $auth.mode "sasl") (not $auth.users.secretName) (not $auth.oauth.jwks.secretName) -}}
{{- fail "clientAuth.mode sasl needs clientAuth.users (PLAIN, SCRAM) or clientAuth.oauth.jwks (OAUTHBEARER)" -}}
{{- end -}}
{{- if eq $auth.mode "sasl" -}}
{{- range $auth.mechanisms -}}
{{- if and (eq . "OAUTHBEARER") (not $auth.oauth.jwks.secretName) -}}
{{- fail "clientAuth.mechanisms: OAUTHBEARER needs clientAuth.oauth.jwks" -}}
{{- else if and (hasPrefix "SCRAM-" .) (not $auth.users.secretName) -}}
{{- fail (printf "clientAuth.mechanisms: %s needs clientAuth.users" .) -}}
{{- else if and (eq . "PLAIN") (not $auth.users.secretName) (not $carry) -}}
{{- fail "clientAuth.mechanisms: PLAIN needs clientAuth.users (or brokerSasl.identity client, where the brokers check the password)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
kfan's environment, as a YAML map: every name is an option of `kfan serve`
(proxy/server/config.py OPTIONS, KFAN_<FLAG>) or KFAN_CONFIG (the config file).
The chart sets the first group ($owned) from its values; extraEnv may add the
second group and any non-KFAN_ name, nothing else. Every security option is
in the first group whether it is used or not: those come from the values and
their Secrets, and a password set through extraEnv or configFile would sit in
a ConfigMap. Only paths into the Secrets' mounts go into this map, never
their contents. The two listen addresses
are flags in the container's args, not environment: `kfan serve --workers N`
starts its workers with the parent's environment, and a worker that inherits
KFAN_METRICS_LISTEN binds the parent's metrics port and dies.
*/}}
{{- /* The files kfan reads from the chart's own ConfigMap (mounted at /etc/kfan/config): "true" when there is one. */ -}}
{{- define "kfan.hasConfigFiles" -}}
{{- if or .Values.configFile .Values.telemetry.subscriptions .Values.quotas (and (eq .Values.authorization.authorizer "acls") .Values.authorization.acls) -}}
true
{{- end -}}
{{- end }}

{{- define "kfan.env" -}}
{{- $owned := dict
  "KFAN_BOOTSTRAP" "kafka.bootstrap"
  "KFAN_LISTEN" "containerPorts.kafka"
  "KFAN_ADVERTISE" "advertise"
  "KFAN_NODE_ID" "nodeId"
  "KFAN_BROKER_IDS" "brokerIds"
  "KFAN_BROKER_PORT_BASE" "brokerPortBase"
  "KFAN_METRICS_LISTEN" "containerPorts.metrics"
  "KFAN_WORKERS" "workers"
  "KFAN_SHUTDOWN_TIMEOUT" "shutdownTimeoutSeconds"
  "KFAN_DRAIN_PERIOD" "drainPeriodSeconds"
  "KFAN_LOG_LEVEL" "logLevel"
  "KFAN_LOG_JSON" "logJson"
  "KFAN_RACK" "rack (or rackFromNodeZone)"
  "KFAN_CONFIG" "configFile"
  "KFAN_TELEMETRY_SUBSCRIPTIONS" "telemetry.subscriptions"
  "KFAN_AUTHORIZER" "authorization.authorizer"
  "KFAN_QUOTA_FILE" "quotas"
  "KFAN_ACL_FILE" "authorization.acls (or authorization.aclSecret)"
  "KFAN_AUTHORIZER_LOG" "authorization.log"
  "KFAN_AUDIT_LOG" "audit.log"
  "KFAN_AUDIT_TOPIC" "audit.topic"
  "KFAN_AUDIT_APIS" "audit.apis"
  "KFAN_AUDIT_OVERFLOW" "audit.overflow"
  "KFAN_TLS_CERT" "tls"
  "KFAN_TLS_KEY" "tls"
  "KFAN_TLS_CLIENT_CA" "tls.clientCA"
  "KFAN_BROKER_TLS" "brokerTls.enabled"
  "KFAN_BROKER_TLS_CA" "brokerTls.ca"
  "KFAN_BROKER_TLS_CERT" "brokerTls.clientCert"
  "KFAN_BROKER_TLS_KEY" "brokerTls.clientCert"
  "KFAN_BROKER_TLS_SERVER_NAME" "brokerTls.serverName"
  "KFAN_BROKER_SASL_MECHANISM" "brokerSasl.mechanism"
  "KFAN_BROKER_SASL_USERNAME" "brokerSasl.username"
  "KFAN_BROKER_SASL_PASSWORD_FILE" "brokerSasl.password"
  "KFAN_BROKER_SASL_PASSWORD" "brokerSasl.password (a Secret, mounted as the file KFAN_BROKER_SASL_PASSWORD_FILE: a password never goes into the ConfigMap)"
  "KFAN_BROKER_SASL_TOKEN_FILE" "brokerSasl.token"
  "KFAN_BROKER_IDENTITY" "brokerSasl.identity"
  "KFAN_CLIENT_AUTH" "clientAuth.mode"
  "KFAN_CLIENT_SASL_MECHANISMS" "clientAuth.mechanisms"
  "KFAN_CLIENT_USERS" "clientAuth.users"
  "KFAN_CLIENT_OAUTH_JWKS" "clientAuth.oauth.jwks"
  "KFAN_CLIENT_OAUTH_ISSUER" "clientAuth.oauth.issuer"
  "KFAN_CLIENT_OAUTH_AUDIENCE" "clientAuth.oauth.audience"
  "KFAN_CLIENT_OAUTH_CLOCK_SKEW" "clientAuth.oauth.clockSkewSeconds"
  "KFAN_CLIENT_SESSION_LIFETIME" "clientAuth.sessionLifetimeSeconds"
  "KFAN_CLIENT_AUTH_FAILURE_DELAY" "clientAuth.failureDelaySeconds"
  "KFAN_CLIENT_AUTH_MAX_RECEIVE_BYTES" "clientAuth.maxReceiveBytes"
  "KFAN_CLIENT_AUTH_TIMEOUT" "clientAuth.timeoutSeconds"
-}}
{{- $extraAllowed := list "KFAN_MAX_FRAME_BYTES" "KFAN_MAX_INFLIGHT" "KFAN_MAX_CONNECTION_BYTES" "KFAN_MAX_BUFFERED_BYTES" "KFAN_MAX_CONNECTIONS" "KFAN_MAX_HOLD" "KFAN_IDLE_TIMEOUT" "KFAN_FRAME_TIMEOUT" "KFAN_REQUEST_TIMEOUT" "KFAN_METADATA_REFRESH" "KFAN_CAPTURE" "KFAN_CAPTURE_SAMPLE" "KFAN_CAPTURE_RECORDS" "KFAN_VALIDATE_RECORDS" "KFAN_FETCH_AHEAD_BYTES" "KFAN_READ_REPLICA_MAX_AGE" "KFAN_MAX_UNAUTHENTICATED_PER_ADDRESS" "KFAN_MAX_UNAUTHENTICATED_BYTES" "KFAN_TELEMETRY_MAX_BYTES" "KFAN_TELEMETRY_MAX_CLIENT_INSTANCES" "KFAN_ACL_FILE_CHECK" "KFAN_AUDIT_QUEUE_EVENTS" "KFAN_CONNECTION_MAX_AGE" "KFAN_CONNECTION_MAX_AGE_JITTER" "KFAN_REUSE_PORT" -}}
{{- $env := dict
  "KFAN_BOOTSTRAP" (include "kfan.bootstrap" .)
  "KFAN_ADVERTISE" (include "kfan.advertise" .)
  "KFAN_NODE_ID" (toString (int .Values.nodeId))
  "KFAN_BROKER_IDS" .Values.brokerIds
  "KFAN_BROKER_PORT_BASE" (toString (int .Values.brokerPortBase))
  "KFAN_WORKERS" (toString (int .Values.workers))
  "KFAN_SHUTDOWN_TIMEOUT" (toString .Values.shutdownTimeoutSeconds)
  "KFAN_DRAIN_PERIOD" (toString .Values.drainPeriodSeconds)
  "KFAN_LOG_LEVEL" .Values.logLevel
  "KFAN_LOG_JSON" (ternary "true" "false" (.Values.logJson | default false))
-}}
{{- if and .Values.rack .Values.rackFromNodeZone }}
{{- fail "rack and rackFromNodeZone: set one (a fixed zone, or the Pod's own zone label), not both" }}
{{- end }}
{{- with .Values.rack }}
{{- $_ := set $env "KFAN_RACK" (toString .) }}
{{- end }}
{{- /* Limits and timeouts: (variable, value's name, value, int or seconds).
Set only when given: null leaves kfan's own default in force, kept in one
place (proxy/server/config.py). A value given owns its option from then on, so
extraEnv and configFile may not set it as well (two places, one silently
winning). Byte counts go through int64, not toString of the float64 Helm
reads numbers as, which would write 1 GiB as 1.073741824e+09 and kfan's
int() refuses that. */}}
{{- $l := .Values.limits }}
{{- $tuning := list
  (list "KFAN_MAX_FRAME_BYTES" "limits.maxFrameBytes" $l.maxFrameBytes "int")
  (list "KFAN_MAX_INFLIGHT" "limits.maxInflight" $l.maxInflight "int")
  (list "KFAN_MAX_CONNECTION_BYTES" "limits.maxConnectionBytes" $l.maxConnectionBytes "int")
  (list "KFAN_MAX_BUFFERED_BYTES" "limits.maxBufferedBytes" $l.maxBufferedBytes "int")
  (list "KFAN_FETCH_AHEAD_BYTES" "limits.fetchAheadBytes" $l.fetchAheadBytes "int")
  (list "KFAN_MAX_CONNECTIONS" "limits.maxConnections" $l.maxConnections "int")
  (list "KFAN_MAX_UNAUTHENTICATED_PER_ADDRESS" "limits.maxUnauthenticatedPerAddress" $l.maxUnauthenticatedPerAddress "int")
  (list "KFAN_MAX_UNAUTHENTICATED_BYTES" "limits.maxUnauthenticatedBytes" $l.maxUnauthenticatedBytes "int")
  (list "KFAN_REQUEST_TIMEOUT" "limits.requestTimeoutSeconds" $l.requestTimeoutSeconds "seconds")
  (list "KFAN_MAX_HOLD" "limits.maxHoldSeconds" $l.maxHoldSeconds "seconds")
  (list "KFAN_IDLE_TIMEOUT" "limits.idleTimeoutSeconds" $l.idleTimeoutSeconds "seconds")
  (list "KFAN_FRAME_TIMEOUT" "limits.frameTimeoutSeconds" $l.frameTimeoutSeconds "seconds")
  (list "KFAN_CONNECTION_MAX_AGE" "limits.connectionMaxAgeSeconds" $l.connectionMaxAgeSeconds "seconds")
  (list "KFAN_CONNECTION_MAX_AGE_JITTER" "limits.connectionMaxAgeJitterSeconds" $l.connectionMaxAgeJitterSeconds "seconds")
  (list "KFAN_METADATA_REFRESH" "kafka.metadataRefreshSeconds" .Values.kafka.metadataRefreshSeconds "seconds")
  (list "KFAN_READ_REPLICA_MAX_AGE" "readReplicaMaxAgeSeconds" .Values.readReplicaMaxAgeSeconds "seconds")
  (list "KFAN_TELEMETRY_MAX_BYTES" "telemetry.maxBytes" .Values.telemetry.maxBytes "int")
  (list "KFAN_TELEMETRY_MAX_CLIENT_INSTANCES" "telemetry.maxClientInstances" .Values.telemetry.maxClientInstances "int")
  (list "KFAN_ACL_FILE_CHECK" "authorization.checkSeconds" .Values.authorization.checkSeconds "seconds")
  (list "KFAN_AUDIT_QUEUE_EVENTS" "audit.queueEvents" .Values.audit.queueEvents "int")
}}
{{- $tuned := dict }}
{{- range $tuning }}
{{- $value := index . 2 }}
{{- if not (kindIs "invalid" $value) }}
{{- $_ := set $tuned (index . 0) (index . 1) }}
{{- $_ := set $owned (index . 0) (index . 1) }}
{{- $_ := set $env (index . 0) (ternary (toString (int64 $value)) (toString $value) (eq (index . 3) "int")) }}
{{- end }}
{{- end }}
{{- include "kfan.checkSecurity" . }}
{{- $tls := .Values.tls }}
{{- if $tls.enabled }}
{{- $_ := set $env "KFAN_TLS_CERT" (include "kfan.path" (list $tls.mountPath $tls.certFile)) }}
{{- $_ := set $env "KFAN_TLS_KEY" (include "kfan.path" (list $tls.mountPath $tls.keyFile)) }}
{{- if $tls.clientCA.enabled }}
{{- $_ := set $env "KFAN_TLS_CLIENT_CA" (include "kfan.path" (list $tls.clientCA.mountPath $tls.clientCA.file)) }}
{{- end }}
{{- end }}
{{- $btls := .Values.brokerTls }}
{{- if $btls.enabled }}
{{- $_ := set $env "KFAN_BROKER_TLS" "true" }}
{{- with $btls.serverName }}
{{- $_ := set $env "KFAN_BROKER_TLS_SERVER_NAME" . }}
{{- end }}
{{- if $btls.ca.secretName }}
{{- $_ := set $env "KFAN_BROKER_TLS_CA" (include "kfan.path" (list $btls.ca.mountPath $btls.ca.file)) }}
{{- end }}
{{- if $btls.clientCert.secretName }}
{{- $_ := set $env "KFAN_BROKER_TLS_CERT" (include "kfan.path" (list $btls.clientCert.mountPath $btls.clientCert.certFile)) }}
{{- $_ := set $env "KFAN_BROKER_TLS_KEY" (include "kfan.path" (list $btls.clientCert.mountPath $btls.clientCert.keyFile)) }}
{{- end }}
{{- end }}
{{- $sasl := .Values.brokerSasl }}
{{- if $sasl.mechanism }}
{{- $_ := set $env "KFAN_BROKER_SASL_MECHANISM" $sasl.mechanism }}
{{- with $sasl.username }}
{{- $_ := set $env "KFAN_BROKER_SASL_USERNAME" . }}
{{- end }}
{{- if eq $sasl.mechanism "OAUTHBEARER" }}
{{- $_ := set $env "KFAN_BROKER_SASL_TOKEN_FILE" (include "kfan.path" (list $sasl.token.mountPath $sasl.token.file)) }}
{{- else }}
{{- $_ := set $env "KFAN_BROKER_SASL_PASSWORD_FILE" (include "kfan.path" (list $sasl.password.mountPath $sasl.password.file)) }}
{{- end }}
{{- end }}
{{- if eq $sasl.identity "client" }}
{{- $_ := set $env "KFAN_BROKER_IDENTITY" "client" }}
{{- end }}
{{- $auth := .Values.clientAuth }}
{{- if ne $auth.mode "none" }}
{{- $_ := set $env "KFAN_CLIENT_AUTH" $auth.mode }}
{{- end }}
{{- if eq $auth.mode "sasl" }}
{{- with $auth.mechanisms }}
{{- $_ := set $env "KFAN_CLIENT_SASL_MECHANISMS" (join "," .) }}
{{- end }}
{{- if $auth.users.secretName }}
{{- $_ := set $env "KFAN_CLIENT_USERS" (include "kfan.path" (list $auth.users.mountPath $auth.users.file)) }}
{{- end }}
{{- if $auth.oauth.jwks.secretName }}
{{- $_ := set $env "KFAN_CLIENT_OAUTH_JWKS" (include "kfan.path" (list $auth.oauth.jwks.mountPath $auth.oauth.jwks.file)) }}
{{- with $auth.oauth.issuer }}
{{- $_ := set $env "KFAN_CLIENT_OAUTH_ISSUER" . }}
{{- end }}
{{- with $auth.oauth.audience }}
{{- $_ := set $env "KFAN_CLIENT_OAUTH_AUDIENCE" . }}
{{- end }}
{{- $_ := set $env "KFAN_CLIENT_OAUTH_CLOCK_SKEW" (toString $auth.oauth.clockSkewSeconds) }}
{{- end }}
{{- $_ := set $env "KFAN_CLIENT_SESSION_LIFETIME" (toString $auth.sessionLifetimeSeconds) }}
{{- $_ := set $env "KFAN_CLIENT_AUTH_FAILURE_DELAY" (toString $auth.failureDelaySeconds) }}
{{- $_ := set $env "KFAN_CLIENT_AUTH_MAX_RECEIVE_BYTES" (toString (int $auth.maxReceiveBytes)) }}
{{- $_ := set $env "KFAN_CLIENT_AUTH_TIMEOUT" (toString $auth.timeoutSeconds) }}
{{- end }}
{{- $authz := .Values.authorization }}
{{- if eq $authz.authorizer "acls" }}
{{- if and $authz.acls $authz.aclSecret.secretName }}
{{- fail "authorization: set acls (inline, a ConfigMap) or aclSecret (a Secret), not both" }}
{{- else if $authz.acls }}
{{- $_ := set $env "KFAN_ACL_FILE" "/etc/kfan/config/acls.toml" }}
{{- else if $authz.aclSecret.secretName }}
{{- $_ := set $env "KFAN_ACL_FILE" (include "kfan.path" (list $authz.aclSecret.mountPath $authz.aclSecret.file)) }}
{{- else }}
{{- fail "authorization.authorizer acls needs the ACLs: authorization.acls (TOML) or authorization.aclSecret.secretName" }}
{{- end }}
{{- $_ := set $env "KFAN_AUTHORIZER" "acls" }}
{{- $_ := set $env "KFAN_AUTHORIZER_LOG" $authz.log }}
{{- end }}
{{- $audit := .Values.audit }}
{{- if and $audit.log $audit.topic }}
{{- fail "audit: set log (a file, or - for stdout) or topic, not both" }}
{{- end }}
{{- if or $audit.log $audit.topic }}
{{- with $audit.log }}
{{- $_ := set $env "KFAN_AUDIT_LOG" . }}
{{- end }}
{{- with $audit.topic }}
{{- $_ := set $env "KFAN_AUDIT_TOPIC" . }}
{{- end }}
{{- $_ := set $env "KFAN_AUDIT_APIS" (join "," $audit.apis) }}
{{- $_ := set $env "KFAN_AUDIT_OVERFLOW" $audit.overflow }}
{{- end }}
{{- if .Values.telemetry.subscriptions }}
{{- $_ := set $env "KFAN_TELEMETRY_SUBSCRIPTIONS" "/etc/kfan/config/telemetry.toml" }}
{{- end }}
{{- if .Values.quotas }}
{{- $_ := set $env "KFAN_QUOTA_FILE" "/etc/kfan/config/quotas.toml" }}
{{- end }}
{{- with .Values.configFile }}
{{- $_ := set $env "KFAN_CONFIG" "/etc/kfan/config/kfan.toml" }}
{{- $names := list }}
{{- range $k, $_ := $owned }}
{{- if ne $k "KFAN_CONFIG" }}
{{- $names = append $names ($k | trimPrefix "KFAN_" | lower | replace "_" "[-_]") }}
{{- end }}
{{- end }}
{{- $key := regexFind (printf "(?m)^[ \t]*[\"']?(%s)[\"']?[ \t]*=" (join "|" $names)) . }}
{{- if $key }}
{{- fail (printf "configFile: %q is set by the chart from its values; leave it out of the file" (trimSuffix "=" $key | trim | trimAll "\"'")) }}
{{- end }}
{{- end }}
{{- range $k, $v := .Values.extraEnv }}
{{- if hasKey $tuned $k }}
{{- fail (printf "extraEnv.%s: the value %s sets %s already; keep one of them (the value, which the schema checks)" $k (get $tuned $k) $k) }}
{{- else if hasKey $owned $k }}
{{- fail (printf "extraEnv.%s: the chart sets %s from the value %s; set that instead" $k $k (get $owned $k)) }}
{{- else if and (hasPrefix "KFAN_" $k) (not (has $k $extraAllowed)) }}
{{- fail (printf "extraEnv.%s: not an option of kfan serve; the KFAN_* names extraEnv takes are %s" $k (join ", " $extraAllowed)) }}
{{- end }}
{{- $_ := set $env $k (toString $v) }}
{{- end }}
{{- toYaml $env }}
{{- end }}

{{/*
The budgets of one pod that the dashboard and the alerts compare usage with,
as a YAML map {bufferedBytes, connections}: the per-process limit times
workers (each worker has its own). A limit left null is kfan's own default
(proxy/server/config.py), restated here because kfan exports its usage but not its
limits; the ConfigMap never passes these defaults to kfan, and
tests/test_chart_observability.py keeps them equal to kfan's.
*/}}
{{- define "kfan.budgets" -}}
{{- $l := .Values.limits -}}
{{- $buffered := ternary 536870912 $l.maxBufferedBytes (kindIs "invalid" $l.maxBufferedBytes) -}}
{{- $connections := ternary 10000 $l.maxConnections (kindIs "invalid" $l.maxConnections) -}}
bufferedBytes: {{ mul (int64 .Values.workers) (int64 $buffered) }}
connections: {{ mul (int64 .Values.workers) (int64 $connections) }}
{{- end }}

{{/*
PromQL label matchers for this release's kfan series: the ones the chart's
ServiceMonitor gives them (job is the Service's name), unless
prometheusRule.selector replaces them.
*/}}
{{- define "kfan.promSelector" -}}
{{- default (printf "namespace=%q, job=%q" .Release.Namespace (include "kfan.fullname" .)) .Values.prometheusRule.selector -}}
{{- end }}

{{/*
The broker ports the chart exposes (brokerPortIds), as a list of {name, port}: checked to fit together with
brokerIds and brokerPortBase, which kfan itself listens by.
*/}}
{{- define "kfan.brokerPorts" -}}
{{- $ports := list -}}
{{- if .Values.brokerPortIds -}}
{{- if or (ne .Values.brokerIds "cluster") (not .Values.brokerPortBase) -}}
{{- fail "brokerPortIds needs brokerIds cluster and brokerPortBase: kfan listens on BASE+N only then" -}}
{{- end -}}
{{- range .Values.brokerPortIds -}}
{{- $port := add $.Values.brokerPortBase . -}}
{{- if gt (int $port) 65535 -}}
{{- fail (printf "brokerPortBase %d + broker id %d is past port 65535" (int $.Values.brokerPortBase) (int .)) -}}
{{- end -}}
{{- $ports = append $ports (dict "name" (printf "broker-%d" (int .)) "port" (int $port)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $ports -}}
{{- end -}}
