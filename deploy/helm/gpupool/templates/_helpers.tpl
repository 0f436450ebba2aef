{{/* The names and labels every object shares, as `helm create` lays them out. */}}

{{- define "gpupool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release name, or release-chart where the release name lacks the chart's (63: a DNS label). */}}
{{- define "gpupool.fullname" -}}
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

{{- define "gpupool.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Only name and instance select pods: the other labels change between upgrades, a selector cannot. */}}
{{- define "gpupool.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpupool.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpupool.labels" -}}
helm.sh/chart: {{ include "gpupool.chart" . }}
{{ include "gpupool.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: control-plane
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gpupool.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpupool.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the store's URL and password: the one named, or the one this chart makes. */}}
{{- define "gpupool.dbSecretName" -}}
{{- if .Values.database.existingSecret }}
{{- .Values.database.existingSecret }}
{{- else }}
{{- printf "%s-db" (include "gpupool.fullname" .) }}
{{- end }}
{{- end }}

{{/* Rules the schema cannot say, refused with what to change. Included by every template that depends on them. */}}
{{- define "gpupool.validate" -}}
{{- if and (not .Values.database.existingSecret) (not .Values.database.url) }}
{{- fail "database: set database.existingSecret (a Secret with the store's url and password) or database.url (and database.password) for the chart to make one" }}
{{- end }}
{{- if and (not .Values.database.existingSecret) .Values.database.url (not .Values.database.password) }}
{{- fail "database: database.password is empty: give it with database.url (the server takes the password from a file, never from the URL)" }}
{{- end }}
{{- if regexMatch "^[^/]*://[^/@]*:[^/@]*@" .Values.database.url }}
{{- fail "database: database.url holds a password, which the server refuses (a URL travels in the environment and in logs): give it as database.password" }}
{{- end }}
{{- if and .Values.database.existingSecret .Values.database.url }}
{{- fail "database: database.url is set but database.existingSecret is too, and the existing Secret would win: set database.existingSecret to \"\" to have the chart make the Secret from database.url" }}
{{- end }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if and $pdb.enabled (not (kindIs "string" $pdb.minAvailable)) (ge (int .Values.replicaCount) 1) (ge (int $pdb.minAvailable) (int .Values.replicaCount)) }}
{{- fail (printf "podDisruptionBudget.minAvailable (%d) must be below replicaCount (%d): no node holding a replica could be drained. Raise replicaCount or set podDisruptionBudget.enabled=false" (int $pdb.minAvailable) (int .Values.replicaCount)) }}
{{- end }}
{{- end }}
