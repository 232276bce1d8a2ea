{{/*
Names. The RayService name is also the prefix of what KubeRay creates for it (`<name>-head-svc`,
`<name>-serve-svc`, clusters `<name>-xxxxx`), and KubeRay refuses one longer than 47 characters or
not a DNS-1035 label, so the full name is cut at 47 and must start with a letter.
*/}}
{{- define "macaron.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "macaron.fullname" -}}
{{- $name := "" -}}
{{- if .Values.fullnameOverride -}}
{{- $name = .Values.fullnameOverride -}}
{{- else if contains (include "macaron.name" .) .Release.Name -}}
{{- $name = .Release.Name -}}
{{- else -}}
{{- $name = printf "%s-%s" .Release.Name (include "macaron.name" .) -}}
{{- end -}}
{{- $name = $name | trunc 47 | trimSuffix "-" -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "the name %q is not a DNS-1035 label (KubeRay names the RayService and its Services after it): start the release name with a letter, or set fullnameOverride" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{- define "macaron.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "macaron.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: macaron-ray
{{- end -}}

{{- define "macaron.selectorLabels" -}}
app.kubernetes.io/name: {{ include "macaron.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
What the chart's own selectors find the Ray pods by (PodMonitors, disruption budgets, the Redis
NetworkPolicy), across both clusters of an upgrade. Not app.kubernetes.io/name: the Ray pods leave
it to KubeRay (`kuberay`), because the head Service KubeRay makes for the RayService
(<fullname>-head-svc; common/service.go BuildHeadServiceForRayService) selects
app.kubernetes.io/name=kuberay whatever the pod template says: a name of the chart's there would
leave that Service, the dashboard's, without endpoints.
*/}}
{{- define "macaron.rayPodSelectorLabels" -}}
macaron.ai/rayservice: {{ include "macaron.fullname" . }}
{{- end -}}

{{/* The Serve application this chart manages (the profiles' import_path). */}}
{{- define "macaron.importPath" -}}macaron_ray.serve:build_app{{- end -}}

{{/* The port Serve's HTTP proxies listen on; KubeRay's serve Service targets the container port named `serve`. */}}
{{- define "macaron.servePort" -}}8000{{- end -}}
{{- define "macaron.redisPort" -}}6379{{- end -}}

{{/*
The profile file, deployments/<profile>.yaml, as the chart carries it (profiles/ links to deployments/).
*/}}
{{- define "macaron.profileText" -}}
{{- $available := list -}}
{{- range $path, $_ := .Files.Glob "profiles/*.yaml" -}}
{{- $available = append $available (base $path | trimSuffix ".yaml") -}}
{{- end -}}
{{- if not .Values.profile -}}
{{- fail (printf "set profile to one of %s (deployments/<profile>.yaml), or install with -f values-<name>.yaml" (join ", " $available)) -}}
{{- end -}}
{{- $text := .Files.Get (printf "profiles/%s.yaml" .Values.profile) -}}
{{- if not $text -}}
{{- fail (printf "profile %q: no deployments/%s.yaml; the profiles are %s" .Values.profile .Values.profile (join ", " $available)) -}}
{{- end -}}
{{- $text -}}
{{- end -}}

{{/*
The env var the API keys reach the ingress replicas through: the profile's own
`ingress.api_keys_env`, else MACARON_API_KEYS (set in the app's args when keys are configured).
Empty when no keys are configured and the profile asks for none.
*/}}
{{- define "macaron.apiKeysEnv" -}}
{{- $doc := include "macaron.profileText" . | fromYaml -}}
{{- $profileEnv := "" -}}
{{- range $doc.applications -}}
{{- if eq .import_path (include "macaron.importPath" $) -}}
{{- $profileEnv = dig "ingress" "api_keys_env" "" .args | default $profileEnv -}}
{{- end -}}
{{- end -}}
{{- $keys := .Values.api.keys -}}
{{- if and $keys.existingSecret $keys.inline -}}
{{- fail "api.keys: set existingSecret or inline, not both" -}}
{{- end -}}
{{- if or $keys.existingSecret $keys.inline -}}
{{- default "MACARON_API_KEYS" $profileEnv -}}
{{- else if $profileEnv -}}
{{- fail (printf "profile %s reads API keys from %s: set api.keys.existingSecret (a Secret whose api.keys.secretKey holds the keys file: one `<tenant> sha256:<salt>:<hash>` line per key, as `macaron keys new` prints it) or api.keys.inline" .Values.profile $profileEnv) -}}
{{- end -}}
{{- end -}}

{{- define "macaron.apiKeysSecret" -}}
{{- .Values.api.keys.existingSecret | default (printf "%s-api-keys" (include "macaron.fullname" .)) -}}
{{- end -}}

{{/*
The conversation store. Unless store.mode is `profile`, the app reads the Redis URL from the env
var MACARON_STORE_URL (args.store.url_env), which every Ray container takes from a Secret: the URL
(and the password in it) is never written into the RayService.
*/}}
{{- define "macaron.storeUrlEnv" -}}
{{- if ne .Values.store.mode "profile" -}}MACARON_STORE_URL{{- end -}}
{{- end -}}

{{/* The Secret the chart makes for the internal Redis (password and url), unless redis.auth.existingSecret. */}}
{{- define "macaron.redisAuthSecret" -}}
{{- .Values.redis.auth.existingSecret | default (printf "%s-redis-auth" (include "macaron.fullname" .)) -}}
{{- end -}}

{{/*
The internal Redis's password: the one of the Secret in the cluster (`helm upgrade` keeps it; with
redis.auth.existingSecret, yours), else, for the Secret the chart makes, a new random one. Made
once per render and kept in .Values, so the Secret and the checksums below agree on it. Empty when
the chart cannot know it (an existingSecret and no cluster to read it from: `helm template`).
*/}}
{{- define "macaron.redisPassword" -}}
{{- $auth := .Values.redis.auth -}}
{{- if not (hasKey $auth "_password") -}}
{{- $live := lookup "v1" "Secret" .Release.Namespace (include "macaron.redisAuthSecret" .) | default dict -}}
{{- $password := get ($live.data | default dict) "password" | default "" | b64dec -}}
{{- if and (not $password) (not $auth.existingSecret) -}}
{{- $password = randAlphaNum 32 -}}
{{- end -}}
{{- $_ := set $auth "_password" $password -}}
{{- end -}}
{{- $auth._password -}}
{{- end -}}

{{/*
A checksum of the Redis password for the pod templates of Redis and of every Ray group. Pods read
a Secret only when they start: with a new password, the changed template restarts Redis (its
StatefulSet) and makes KubeRay start a new Ray cluster, whose pods get the new URL. Empty where the
password is not known (see macaron.redisPassword) or the store is not the chart's Redis.
*/}}
{{- define "macaron.redisAuthChecksum" -}}
{{- if eq .Values.store.mode "internal" -}}
{{- with include "macaron.redisPassword" . -}}{{ sha256sum . }}{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Secret the chart makes from store.externalUrl. */}}
{{- define "macaron.externalStoreSecret" -}}
{{- printf "%s-store" (include "macaron.fullname" .) -}}
{{- end -}}

{{/*
The Secret and key MACARON_STORE_URL comes from, as YAML {name, key}; empty for store.mode profile.
*/}}
{{- define "macaron.storeUrlSecretRef" -}}
{{- $store := .Values.store -}}
{{- if eq $store.mode "internal" -}}
name: {{ include "macaron.redisAuthSecret" . }}
key: url
{{- else if eq $store.mode "external" -}}
{{- $existing := dig "existingSecret" "name" "" $store -}}
{{- if and $existing $store.externalUrl -}}
{{- fail "store: set existingSecret.name or externalUrl, not both" -}}
{{- else if $existing -}}
name: {{ $existing }}
key: {{ dig "existingSecret" "key" "url" $store }}
{{- else if $store.externalUrl -}}
name: {{ include "macaron.externalStoreSecret" . }}
key: url
{{- else -}}
{{- fail "store.mode external needs store.existingSecret.name (a Secret holding the Redis URL, redis://[:PASSWORD@]host:port/db, under store.existingSecret.key) or store.externalUrl" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The Serve config KubeRay deploys (serveConfigV2): the profile file itself, parsed, with exactly
these changes (tests/unit/test_k8s_chart.py recomputes them and compares):
  - http_options.host 0.0.0.0 and port 8000: the proxies must be reachable from the Services;
  - in every application of macaron_ray.serve:build_app:
    - args.store: {kind: redis, url_env: MACARON_STORE_URL} unless store.mode is `profile`;
    - args.ingress.num_replicas: api.replicas, when set;
    - args.ingress.api_keys_env: the env var the keys Secret is mounted as, when keys are configured.
*/}}
{{- define "macaron.serveConfig" -}}
{{- $doc := include "macaron.profileText" . | fromYaml -}}
{{- if hasKey $doc "Error" -}}
{{- fail (printf "profiles/%s.yaml is not YAML: %s" .Values.profile $doc.Error) -}}
{{- end -}}
{{- $http := $doc.http_options | default dict -}}
{{- $_ := set $http "host" "0.0.0.0" -}}
{{- $_ := set $http "port" (int (include "macaron.servePort" .)) -}}
{{- $_ := set $doc "http_options" $http -}}
{{- $storeEnv := include "macaron.storeUrlEnv" . -}}
{{- /* Fails here on store values that give the Ray containers no URL. */ -}}
{{- $_ := include "macaron.storeUrlSecretRef" . -}}
{{- $keysEnv := include "macaron.apiKeysEnv" . -}}
{{- $found := false -}}
{{- range $doc.applications -}}
{{- if eq .import_path (include "macaron.importPath" $) -}}
{{- $found = true -}}
{{- $args := .args -}}
{{- if $storeEnv -}}
{{- $_ := set $args "store" (dict "kind" "redis" "url_env" $storeEnv) -}}
{{- end -}}
{{- $ingress := $args.ingress | default dict -}}
{{- if not (kindIs "invalid" $.Values.api.replicas) -}}
{{- $_ := set $ingress "num_replicas" (int $.Values.api.replicas) -}}
{{- end -}}
{{- if $keysEnv -}}
{{- $_ := set $ingress "api_keys_env" $keysEnv -}}
{{- end -}}
{{- if $ingress -}}
{{- $_ := set $args "ingress" $ingress -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $found -}}
{{- fail (printf "profiles/%s.yaml has no application of %s" .Values.profile (include "macaron.importPath" .)) -}}
{{- end -}}
{{- toYaml $doc -}}
{{- end -}}

{{/* The first macaron application's args, after the chart's changes (YAML). */}}
{{- define "macaron.appArgs" -}}
{{- $doc := include "macaron.serveConfig" . | fromYaml -}}
{{- $args := dict -}}
{{- range $doc.applications -}}
{{- if and (not $args) (eq .import_path (include "macaron.importPath" $)) -}}
{{- $args = .args -}}
{{- end -}}
{{- end -}}
{{- toYaml $args -}}
{{- end -}}

{{/*
The Ray cluster the profile runs on: cluster/<args.cluster>.yaml (clusters/ links to cluster/),
with each group's Kubernetes settings from nodeGroups.<group name> checked against its groups.
*/}}
{{- define "macaron.clusterText" -}}
{{- $args := include "macaron.appArgs" . | fromYaml -}}
{{- if not $args.cluster -}}
{{- fail (printf "profile %s names no cluster: the chart lays out the Ray cluster from cluster/<args.cluster>.yaml" .Values.profile) -}}
{{- end -}}
{{- $text := .Files.Get (printf "clusters/%s.yaml" $args.cluster) -}}
{{- if not $text -}}
{{- fail (printf "profile %s names cluster %q; there is no cluster/%s.yaml" .Values.profile $args.cluster $args.cluster) -}}
{{- end -}}
{{- $cluster := $text | fromYaml -}}
{{- $names := list $cluster.head.name -}}
{{- range $cluster.workers -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- range $name, $_ := .Values.nodeGroups -}}
{{- if not (has $name $names) -}}
{{- fail (printf "nodeGroups.%s: cluster %s has no group %q (its groups: %s)" $name $args.cluster $name (join ", " $names)) -}}
{{- end -}}
{{- end -}}
{{- $text -}}
{{- end -}}

{{/*
One Ray group's rayStartParams, from the cluster file: the same numbers
`NodeGroup.ray_start_args()` renders for `ray start` (labels go in the group's `labels` field:
KubeRay refuses them in rayStartParams). Custom resources are one JSON object in single quotes,
as KubeRay itself writes them into the `ray start` command line.
*/}}
{{- define "macaron.rayStartParams" -}}
{{- $g := .group -}}
{{- if .head -}}
dashboard-host: "0.0.0.0"
{{ end -}}
num-cpus: {{ int64 $g.num_cpus | toString | quote }}
num-gpus: {{ int64 ($g.num_gpus | default 0) | toString | quote }}
object-store-memory: {{ int64 $g.object_store_memory_bytes | toString | quote }}
metrics-export-port: "8080"
{{- if $g.resources }}
resources: {{ printf "'%s'" (toJson $g.resources) | quote }}
{{- end }}
{{- end -}}

{{/*
The pod template of one Ray group. `group` is the cluster file's group, `overrides` its
nodeGroups entry, `head` whether it is the head.
*/}}
{{- define "macaron.podTemplate" -}}
{{- $root := .root -}}
{{- $g := .group -}}
{{- $o := .overrides | default dict -}}
{{- $c := merge (dict) ($g.container | default dict) -}}
{{- $oc := $o.container | default dict -}}
{{- if hasKey $oc "cpu" }}{{ $_ := set $c "cpu" $oc.cpu }}{{ end -}}
{{- if hasKey $oc "memoryGiB" }}{{ $_ := set $c "memory_gib" $oc.memoryGiB }}{{ end -}}
{{- if hasKey $oc "sharedMemoryGiB" }}{{ $_ := set $c "shared_memory_gib" $oc.sharedMemoryGiB }}{{ end -}}
{{- if not (and $c.cpu $c.memory_gib $c.shared_memory_gib) -}}
{{- fail (printf "group %s: the cluster file gives no container resources; set nodeGroups.%s.container {cpu, memoryGiB, sharedMemoryGiB}" $g.name $g.name) -}}
{{- end -}}
{{- if ge (int64 $c.shared_memory_gib) (int64 $c.memory_gib) -}}
{{- fail (printf "group %s: sharedMemoryGiB (%d) must leave memory for the processes (memoryGiB %d)" $g.name (int64 $c.shared_memory_gib) (int64 $c.memory_gib)) -}}
{{- end -}}
{{- if gt (int64 $g.object_store_memory_bytes) (mul (int64 $c.shared_memory_gib) 1073741824) -}}
{{- fail (printf "group %s: the object store (%d bytes) does not fit in /dev/shm (%d GiB)" $g.name (int64 $g.object_store_memory_bytes) (int64 $c.shared_memory_gib)) -}}
{{- end -}}
{{- $gpus := int64 ($g.num_gpus | default 0) -}}
{{- /* What KubeRay's cluster hash (utils GenerateHashWithoutReplicasAndWorkersToDelete) leaves out:
the group's sizes (the autoscaler's to change) and the pods' tolerations. Without them in what it
hashes, `helm upgrade` of either changes nothing: no in-place update, no new cluster. Replicas stay
out with the autoscaler on, which owns them. */ -}}
{{- $unhashed := dict "tolerations" ($o.tolerations | default list) -}}
{{- range $k, $v := .sizes | default dict -}}
{{- if not (and (eq $k "replicas") $root.Values.rayService.autoscaling) }}{{ $_ := set $unhashed $k $v }}{{ end -}}
{{- end -}}
{{- $redisChecksum := include "macaron.redisAuthChecksum" $root -}}
{{- $userEnv := list -}}
{{- range $root.Values.env }}{{ $userEnv = append $userEnv .name }}{{ end -}}
{{- $keysEnv := include "macaron.apiKeysEnv" $root -}}
{{- $storeEnv := include "macaron.storeUrlEnv" $root -}}
{{- $storeRef := include "macaron.storeUrlSecretRef" $root | fromYaml -}}
metadata:
  labels:
    {{- include "macaron.rayPodSelectorLabels" $root | nindent 4 }}
    app.kubernetes.io/instance: {{ $root.Release.Name }}
    app.kubernetes.io/part-of: macaron-ray
    app.kubernetes.io/component: {{ ternary "ray-head" "ray-worker" .head }}
    macaron.ai/node-type: {{ $g.node_type }}
  annotations:
    # The group's sizes and tolerations, which KubeRay's cluster hash leaves out: a change of them
    # rolls out a new cluster (rayService.upgradeStrategy) like any other change of this template.
    checksum/scaling: {{ toJson $unhashed | sha256sum }}
    {{- with $redisChecksum }}
    # The Redis password in MACARON_STORE_URL: a new one rolls out a new cluster, whose pods read it.
    checksum/redis-auth: {{ . }}
    {{- end }}
    {{- with $o.annotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- with $root.Values.image.pullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $o.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with $o.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $o.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $o.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    # KubeRay takes the first container for Ray's.
    - name: {{ ternary "ray-head" "ray-worker" .head }}
      image: {{ printf "%s:%s" (required "image.repository is required" $root.Values.image.repository) (required "image.tag is required" $root.Values.image.tag) | quote }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      ports:
        {{- if .head }}
        - {name: gcs, containerPort: 6379}
        - {name: dashboard, containerPort: 8265}
        - {name: client, containerPort: 10001}
        {{- end }}
        - {name: serve, containerPort: {{ include "macaron.servePort" $root }}}
        - {name: metrics, containerPort: 8080}
        # NIXL's side channel (VLLM_NIXL_SIDE_CHANNEL_PORT's default): where decode engines ask a
        # prefill engine for its KV blocks' layout before pulling them.
        - {name: nixl, containerPort: 5600}
        {{- if .head }}
        - {name: dash-metrics, containerPort: 44227}
        {{- if $root.Values.rayService.autoscaling }}
        - {name: as-metrics, containerPort: 44217}
        {{- end }}
        {{- end }}
      env:
        # The address each vLLM engine's NIXL side channel listens on and advertises to the engines
        # that pull its KV cache: the pod's own (the default, localhost, is unreachable from others).
        - name: VLLM_NIXL_SIDE_CHANNEL_HOST
          valueFrom:
            fieldRef:
              fieldPath: status.podIP
        {{- if $keysEnv }}
        # MoLIngress replicas read the keys from the environment (AppArgs.ingress.api_keys_env).
        - name: {{ $keysEnv }}
          valueFrom:
            secretKeyRef:
              name: {{ include "macaron.apiKeysSecret" $root }}
              key: {{ $root.Values.api.keys.secretKey }}
        {{- end }}
        {{- if $storeEnv }}
        # MoLIngress replicas, on any node, open the conversation store at this URL (AppArgs.store.url_env).
        - name: {{ $storeEnv }}
          valueFrom:
            secretKeyRef:
              name: {{ $storeRef.name }}
              key: {{ $storeRef.key }}
        {{- end }}
        {{- with $root.Values.models.hfHome }}
        - name: HF_HOME
          value: {{ . | quote }}
        {{- if not (has "HF_HUB_OFFLINE" $userEnv) }}
        # The cache is mounted read-only and complete: the ingress replicas load the base's
        # tokenizer from it too (outside the engines' runtime_env, which sets this itself), and a
        # Hub lookup would stall their start or try to write to it.
        - name: HF_HUB_OFFLINE
          value: "1"
        {{- end }}
        {{- end }}
        {{- with $root.Values.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      # Requests equal limits: KubeRay reads the limits as the node's Ray resources, and engines
      # that lose memory or GPUs to a neighbour fail mid-stream.
      {{- $resources := dict "cpu" (int64 $c.cpu | toString) "memory" (printf "%dGi" (int64 $c.memory_gib)) }}
      {{- if $gpus }}{{ $_ := set $resources "nvidia.com/gpu" ($gpus | toString) }}{{ end }}
      {{- range $k, $v := $o.extraResources }}{{ $_ := set $resources $k ($v | toString) }}{{ end }}
      resources:
        requests:
          {{- toYaml $resources | nindent 10 }}
        limits:
          {{- toYaml $resources | nindent 10 }}
      {{- with $o.securityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      lifecycle:
        preStop:
          exec:
            command: ["/bin/sh", "-c", "ray stop"]
      volumeMounts:
        # Ray's object store lives in /dev/shm; sized by the cluster file, not the container's memory.
        - {name: shared-mem, mountPath: /dev/shm}
        {{- if $root.Values.models.volume }}
        - {name: models, mountPath: {{ $root.Values.models.mountPath | quote }}, readOnly: true}
        {{- end }}
  volumes:
    - name: shared-mem
      emptyDir:
        medium: Memory
        sizeLimit: {{ printf "%dGi" (int64 $c.shared_memory_gib) }}
    {{- if $root.Values.models.volume }}
    - name: models
      {{- toYaml $root.Values.models.volume | nindent 6 }}
    {{- end }}
{{- end -}}
