{{- define "common.labels" -}}
app.kubernetes.io/part-of: {{ .Release.Name }}
{{- end -}}
