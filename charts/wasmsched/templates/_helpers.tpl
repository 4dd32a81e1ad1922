{{/* The chart's names and labels, shared by every manifest. */}}
{{- define "wasmsched.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "wasmsched.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "wasmsched.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "wasmsched.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "wasmsched.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "wasmsched.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* NATS flags shared by the scheduler and the agent. */}}
{{- define "wasmsched.natsArgs" -}}
{{- if .Values.nats.url }}
- --nats={{ .Values.nats.url }}
- --cluster={{ .Values.nats.cluster }}
{{- if .Values.nats.credentialsSecret }}
- --nats-creds=/etc/wasmsched/nats/creds
{{- end }}
{{- end }}
{{- end -}}
