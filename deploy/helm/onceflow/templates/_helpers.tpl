{{/* The release's name prefix: <release>-onceflow, or the release name when it says onceflow already. */}}
{{- define "onceflow.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "onceflow.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: onceflow
{{- end -}}

{{/* Selector labels of one component (a service, kafka, redis, console, topics): (dict "root" $ "component" NAME). */}}
{{- define "onceflow.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* A service's image: (dict "root" $ "name" SERVICE). */}}
{{- define "onceflow.image" -}}
{{- printf "%s%s:%s" .root.Values.image.prefix .name (.root.Values.image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}

{{/* The Secret with the tokens: the user's own, or the chart's (which needs an admin token). */}}
{{- define "onceflow.secretName" -}}
{{- if .Values.secrets.existingSecret -}}
{{- .Values.secrets.existingSecret -}}
{{- else -}}
{{- include "onceflow.fullname" . }}-secrets
{{- end -}}
{{- end -}}

{{- define "onceflow.kafkaBootstrap" -}}
{{- if .Values.kafka.bootstrap -}}
{{- .Values.kafka.bootstrap -}}
{{- else if .Values.kafka.enabled -}}
{{- printf "%s-kafka:9092" (include "onceflow.fullname" .) -}}
{{- else -}}
{{- fail "kafka.bootstrap is required: the address of your Kafka (host:port[,host:port]), or kafka.enabled=true for a single-node Kafka in the release" -}}
{{- end -}}
{{- end -}}

{{- define "onceflow.redisUrl" -}}
{{- if .Values.redis.url -}}
{{- .Values.redis.url -}}
{{- else if .Values.redis.enabled -}}
{{- printf "redis://%s-redis:6379/0" (include "onceflow.fullname" .) -}}
{{- else -}}
{{- fail "redis.url is required: the address of your Redis (redis://host:6379/0, rediss://, redis+sentinel://), or redis.enabled=true for a Redis in the release" -}}
{{- end -}}
{{- end -}}

{{/* The pod-level settings every onceflow pod shares: pull secrets, security, scheduling. */}}
{{- define "onceflow.podCommon" -}}
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The writable places of a read-only root filesystem, and the tokens as files:
(dict "root" $ "pod" NAME). The emptyDirs are named after the pod: podman 4.3's kube play makes
an emptyDir a named volume called as the volume is, shared by every pod that names it alike. */}}
{{- define "onceflow.volumes" -}}
- name: {{ .pod }}-tmp
  emptyDir:
    sizeLimit: {{ .root.Values.tmpSizeLimit }}
- name: {{ .pod }}-home
  emptyDir: {}
- name: secrets
  secret:
    secretName: {{ include "onceflow.secretName" .root }}
    defaultMode: 0440
    # Kubernetes' default, spelt out: podman 4.3's kube play crashes on a secret volume without it.
    optional: false
{{- end -}}

{{- define "onceflow.volumeMounts" -}}
- name: {{ .pod }}-tmp
  mountPath: /tmp
- name: {{ .pod }}-home
  mountPath: /var/lib/onceflow
- name: secrets
  mountPath: /etc/onceflow/secrets
  readOnly: true
{{- end -}}

{{/* The tokens' and passwords' _FILE settings, for the keys the chart's Secret has. With
secrets.existingSecret only admin-token is assumed; point settings.ONCEFLOW_READ_TOKEN_FILE (...)
at /etc/onceflow/secrets/<key> for the others. */}}
{{- define "onceflow.secretEnv" -}}
- name: ONCEFLOW_ADMIN_TOKEN_FILE
  value: /etc/onceflow/secrets/admin-token
{{- if .Values.secrets.readToken }}
- name: ONCEFLOW_READ_TOKEN_FILE
  value: /etc/onceflow/secrets/read-token
{{- end }}
{{- if .Values.secrets.redisPassword }}
- name: ONCEFLOW_REDIS_PASSWORD_FILE
  value: /etc/onceflow/secrets/redis-password
{{- end }}
{{- if .Values.secrets.kafkaSaslPassword }}
- name: ONCEFLOW_KAFKA_SASL_PASSWORD_FILE
  value: /etc/onceflow/secrets/kafka-sasl-password
{{- end }}
{{- end -}}
