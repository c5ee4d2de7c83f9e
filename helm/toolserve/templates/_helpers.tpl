{{- define "toolserve.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "toolserve.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "toolserve.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The Serve config of the RayService: what `cluster/launch/kubernetes.py`
     serve_config builds for the same profile (a test holds them equal). */}}
{{- define "toolserve.serveConfig" -}}
{{- $_ := required "values: profile is required (-f profiles/<name>.yaml)" .Values.profile.name -}}
{{- $config := .Values.profile -}}
{{- if and $config.server.api_keys_file (not .Values.apiKeysSecret) -}}
{{- fail "values: the profile reads API keys from server.api_keys_file; set apiKeysSecret to the Secret holding them" -}}
{{- end -}}
proxy_location: EveryNode
http_options:
  host: 0.0.0.0
  port: {{ required "profile.server.port" $config.server.port }}
{{- with $config.server.request_timeout_s }}
  request_timeout_s: {{ . }}
{{- end }}
applications:
- name: {{ $config.name }}
  route_prefix: /
  import_path: deployments.app:serve_application
  args:
    config: {{ toJson $config }}
{{- end -}}

{{- define "toolserve.container" -}}
image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
imagePullPolicy: {{ .Values.image.pullPolicy }}
workingDir: /app
{{- with .Values.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .Values.apiKeysSecret }}
volumeMounts:
- name: api-keys
  mountPath: /etc/toolserve
  readOnly: true
{{- end }}
{{- end -}}

{{- define "toolserve.volumes" -}}
{{- if .Values.apiKeysSecret }}
volumes:
- name: api-keys
  secret:
    secretName: {{ .Values.apiKeysSecret }}
{{- end }}
{{- end -}}
