{{/* The name every object of the release carries. */}}
{{- define "bloodraven.fullname" -}}
{{- if contains "bloodraven" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-bloodraven" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the operator's Pods. */}}
{{- define "bloodraven.selectorLabels" -}}
app.kubernetes.io/name: bloodraven
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "bloodraven.labels" -}}
{{ include "bloodraven.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: bloodraven
{{- end -}}

{{- define "bloodraven.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
The combinations the schema cannot express. The deploy API is served only on the TLS listener,
whose certificate comes from auxiliary.escrowTLS.
*/}}
{{- define "bloodraven.validate" -}}
{{- if and .Values.auxiliary.deployAPI.enabled (not .Values.auxiliary.escrowTLS.enabled) -}}
{{- fail "auxiliary.deployAPI.enabled requires auxiliary.escrowTLS.enabled with auxiliary.escrowTLS.existingSecret (a kubernetes.io/tls Secret): the deploy API is served only over TLS on :8443" -}}
{{- end -}}
{{- if and .Values.auxiliary.escrowTLS.enabled (not .Values.auxiliary.escrowTLS.existingSecret) -}}
{{- fail "auxiliary.escrowTLS.enabled requires auxiliary.escrowTLS.existingSecret: the name of a kubernetes.io/tls Secret (tls.crt, tls.key) in the release's namespace" -}}
{{- end -}}
{{- end -}}
