{{/* The chart's objects are named <release>-runwatch-<part>, or <release>-<part> when the release's name holds "runwatch". */}}
{{- define "runwatch.fullname" -}}
{{- if contains "runwatch" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-runwatch" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The stack's release label, required: without it the stack's Prometheus and Alertmanager ignore the object. */}}
{{- define "runwatch.stackRelease" -}}
{{- required "stack.release: the kube-prometheus-stack release name is required (its Prometheus selects rules and monitors by release: <name>): --set stack.release=<name>" .Values.stack.release -}}
{{- end -}}

{{- define "runwatch.labels" -}}
app.kubernetes.io/name: runwatch
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Labels of the objects the stack's operator selects: the chart's, plus release: <stack release>. */}}
{{- define "runwatch.stackLabels" -}}
{{ include "runwatch.labels" . }}
release: {{ include "runwatch.stackRelease" . }}
{{- end -}}

{{- define "runwatch.selector" -}}
app.kubernetes.io/name: runwatch
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* kube-prometheus-stack's own fullname ("<release>-kube-prometheus-stack", cut to 26), which prefixes its Services. */}}
{{- define "runwatch.stackFullname" -}}
{{- $r := include "runwatch.stackRelease" . -}}
{{- if contains "kube-prometheus-stack" $r -}}
{{- $r | trunc 26 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-kube-prometheus-stack" $r | trunc 26 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "runwatch.prometheusURL" -}}
{{- .Values.stack.prometheusURL | default (printf "http://%s-prometheus.%s.svc:9090" (include "runwatch.stackFullname" .) .Values.stack.namespace) -}}
{{- end -}}

{{- define "runwatch.alertmanagerURL" -}}
{{- .Values.stack.alertmanagerURL | default (printf "http://%s-alertmanager.%s.svc:9093" (include "runwatch.stackFullname" .) .Values.stack.namespace) -}}
{{- end -}}

{{- define "runwatch.pagerURL" -}}
{{- printf "http://%s-pager.%s.svc:%d" (include "runwatch.fullname" .) .Release.Namespace (int .Values.pager.port) -}}
{{- end -}}

{{- define "runwatch.runbookBaseURL" -}}
{{- .Values.runbookBaseURL | default (printf "%s/runbooks" (include "runwatch.pagerURL" .)) | trimSuffix "/" -}}
{{- end -}}

{{- define "runwatch.image" -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}

{{/* The run's id: trainer.runId, else <incident>-<seed> (runwatch's own default without the live -HHMMSS). */}}
{{- define "runwatch.runId" -}}
{{- .Values.trainer.runId | default (printf "%s-%d" .Values.trainer.incident (int .Values.trainer.seed)) -}}
{{- end -}}

{{/* The pod and container security of every runwatch container: the image's user 10001, nothing more. */}}
{{- define "runwatch.podSecurity" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}
{{- define "runwatch.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* The Secret holding the pager's token (key `token`): pager.tokenSecret, else the chart's own. */}}
{{- define "runwatch.pagerTokenSecret" -}}
{{- .Values.pager.tokenSecret | default (printf "%s-pager-token" (include "runwatch.fullname" .)) -}}
{{- end -}}

{{/* The label by which the fleet's PrometheusAgent selects its monitors (fleet.shards > 1). */}}
{{- define "runwatch.fleetAgentSelector" -}}
runwatch/scraped-by: {{ include "runwatch.fullname" . }}-fleet
{{- end -}}

{{/* The agent's ServiceAccount: fleet.agent.serviceAccountName, else the stack's Prometheus's (its RBAC lists pods, services and endpoints in every namespace). */}}
{{- define "runwatch.fleetAgentServiceAccount" -}}
{{- .Values.fleet.agent.serviceAccountName | default (printf "%s-prometheus" (include "runwatch.stackFullname" .)) -}}
{{- end -}}
