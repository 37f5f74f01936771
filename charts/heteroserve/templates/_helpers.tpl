{{- define "heteroserve.fullname" -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "heteroserve.labels" -}}
app.kubernetes.io/name: heteroserve-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "heteroserve.selectorLabels" -}}
app.kubernetes.io/name: heteroserve-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
