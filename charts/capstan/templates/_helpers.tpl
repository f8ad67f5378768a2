{{/* The release's base name: <release>-capstan, or the release name when it already says capstan. */}}
{{- define "capstan.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of a namespaced object of one component: (dict "root" $ "component" "nodeslo-controller"). */}}
{{- define "capstan.componentName" -}}
{{- printf "%s-%s" (include "capstan.fullname" .root) .component -}}
{{- end -}}

{{/* Name of a cluster-scoped object: also carries the release namespace (same release name elsewhere). */}}
{{- define "capstan.clusterName" -}}
{{- printf "%s-%s-%s" .root.Release.Namespace (include "capstan.fullname" .root) .component -}}
{{- end -}}

{{/*
Name of a namespaced object of one component in namespace .namespace: outside the release namespace
it also carries the release namespace (the same release name installed elsewhere writes there too).
*/}}
{{- define "capstan.nameIn" -}}
{{- if eq .namespace .root.Release.Namespace -}}
{{- include "capstan.componentName" . -}}
{{- else -}}
{{- include "capstan.clusterName" . -}}
{{- end -}}
{{- end -}}

{{- define "capstan.selectorLabels" -}}
app.kubernetes.io/name: {{ default .root.Chart.Name .root.Values.nameOverride }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The recommended labels, on every object: (dict "root" $ "component" NAME). */}}
{{- define "capstan.labels" -}}
{{ include "capstan.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: capstan
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "capstan.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The namespace machineclass-controller works in. */}}
{{- define "capstan.machineNamespace" -}}
{{- (index .Values.controllers "machineclass-controller").namespace | default .Release.Namespace -}}
{{- end -}}

{{/*
The namespace machineset-controller works in: its own namespace, else machineclass-controller's, so
that by default the Machines one creates are the Machines the other brings up.
*/}}
{{- define "capstan.machineSetNamespace" -}}
{{- (index .Values.controllers "machineset-controller").namespace | default (include "capstan.machineNamespace" .) -}}
{{- end -}}

{{/* Where nodeslo-controller reads slo-controller-config: configNamespace, else the release's. */}}
{{- define "capstan.sloConfigNamespace" -}}
{{- (index .Values.controllers "nodeslo-controller").configNamespace | default .Release.Namespace -}}
{{- end -}}

{{/* A preferred anti-affinity spreading one component's replicas over nodes. */}}
{{- define "capstan.defaultAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "capstan.selectorLabels" . | nindent 12 }}
{{- end -}}

{{/* ServiceAccount + RoleBinding/ClusterRoleBinding subject of one component. */}}
{{- define "capstan.subject" -}}
- kind: ServiceAccount
  name: {{ include "capstan.componentName" . }}
  namespace: {{ .root.Release.Namespace }}
{{- end -}}

{{/*
One sidecar container: (dict "root" $ "kind" "router"|"gateway"). The binary and flags follow the
sidecar's --help. The kernel backend changes routes and qdiscs through netlink, which needs
CAP_NET_ADMIN, so its container runs as UID 0 with NET_ADMIN the only capability (all others
dropped), no privilege escalation and a read-only root. It cannot stay UID 65532: Kubernetes sets
no ambient capabilities, so a non-root process loses an added capability at execve
(kubernetes/kubernetes#56374), and allowPrivilegeEscalation: false (no_new_privs) also ignores
file capabilities; as 65532 every netlink change fails with EPERM (the sidecar then refuses to
start, naming CAP_NET_ADMIN). tests/chart_sidecar_kernel.rs runs both binaries under exactly these
credentials. The memory backend keeps UID 65532 and no capability at all.
*/}}
{{- define "capstan.sidecar.container" -}}
{{- $s := index .root.Values.sidecars .kind -}}
{{- $binary := ternary "router-sidecar" "gw-sidecar" (eq .kind "router") -}}
- name: {{ $binary }}
  image: {{ include "capstan.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command: ["/usr/local/bin/{{ $binary }}"]
  args:
    - --backend={{ $s.backend }}
    - --grpc-port={{ $s.grpcPort }}
    - --metrics-addr=0.0.0.0:{{ $s.metricsPort }}
    - --log-format={{ .root.Values.common.logFormat }}
    - --log-level={{ .root.Values.common.logLevel }}
    {{- with $s.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: POD_NAMESPACE
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    {{- with $s.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - {name: {{ ternary "router-grpc" "gw-grpc" (eq .kind "router") }}, containerPort: {{ $s.grpcPort }}}
    - {name: {{ ternary "router-metrics" "gw-metrics" (eq .kind "router") }}, containerPort: {{ $s.metricsPort }}}
  readinessProbe:
    httpGet: {path: /readyz, port: {{ $s.metricsPort }}}
  resources:
    {{- toYaml $s.resources | nindent 4 }}
  securityContext:
    {{- if eq $s.backend "kernel" }}
    runAsUser: 0
    runAsNonRoot: false
    {{- end }}
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: [ALL]
      {{- if eq $s.backend "kernel" }}
      add: [NET_ADMIN]
      {{- end }}
{{- end -}}

{{- define "capstan.routerSidecar.container" -}}
{{- include "capstan.sidecar.container" (dict "root" .root "kind" "router") -}}
{{- end -}}

{{- define "capstan.gwSidecar.container" -}}
{{- include "capstan.sidecar.container" (dict "root" .root "kind" "gateway") -}}
{{- end -}}
