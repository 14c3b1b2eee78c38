{{- define "greeter.labels" -}}
app.kubernetes.io/name: greeter
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
