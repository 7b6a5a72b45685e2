{{/* The chart's name, or nameOverride (63 characters at most: a label value). */}}
{{- define "reaplet.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' name: fullnameOverride, else the release name when it holds the chart's
name (`helm install reaplet` names everything "reaplet"), else "<release>-<name>". */}}
{{- define "reaplet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "reaplet.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The selector: never changes across upgrades of a release. */}}
{{- define "reaplet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "reaplet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Every object's labels. */}}
{{- define "reaplet.labels" -}}
{{ include "reaplet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The ServiceAccount's name (identity serviceAccount). */}}
{{- define "reaplet.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "reaplet.fullname" .) -}}
{{- end -}}

{{/* The identity, checked: node or serviceAccount. */}}
{{- define "reaplet.serviceAccount" -}}
{{- if eq .Values.identity "serviceAccount" -}}
true
{{- else if ne .Values.identity "node" -}}
{{- fail (printf "identity: %q must be node or serviceAccount" .Values.identity) -}}
{{- end -}}
{{- end -}}
