#!/usr/bin/env bash
# `make image`: builds macaron-ray:<version>-cpu from image/cpu.Dockerfile on the project's own base.
#
# Package sources come from this host's own pip configuration, as build secrets: a pip.conf made
# here from `pip config list` (its index, certificate and find-links), the certificate bundle it
# names, and each local find-links folder served on loopback for the build (the build runs on the
# host's network). None of it is in the repository, the build context or any layer of the image.
#
#   image/build.sh              docker.io, debootstrap and dockerd as needed, the base, the image
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(python3 -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])")
# What the image installs, as `make install` does: the dependencies and the `cpu` extra.
REQUIREMENTS=$(python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print(' '.join(p['dependencies'] + p['optional-dependencies']['cpu']))")
IMAGE=${IMAGE:-macaron-ray:$VERSION-cpu}
# Debian's docker.io client (20.10) builds with BuildKit inside dockerd, no buildx plugin needed.
DOCKER=${DOCKER:-/usr/bin/docker}
export DOCKER

need_debian() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] || { echo "error: install ${missing[*]} (as root)" >&2; exit 1; }
  echo "installing Debian packages: ${missing[*]}"
  timeout 600 apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
    || { timeout 300 apt-get update -q >/dev/null 2>&1 && timeout 600 apt-get install -y -q "${missing[@]}" >/dev/null; }
}
need_debian docker.io debootstrap

if ! "$DOCKER" info >/dev/null 2>&1; then
  # A daemon that was killed (the end of a session) leaves pid files that stop the next one.
  for pidfile in /var/run/docker.pid /var/run/docker/containerd/containerd.pid; do
    if [ -f "$pidfile" ] && ! ps -p "$(cat "$pidfile")" -o comm= 2>/dev/null | grep -q "dockerd\|containerd"; then
      rm -f "$pidfile"
    fi
  done
  echo "starting dockerd"
  (setsid dockerd >/var/log/macaron-dockerd.log 2>&1 &)
  for _ in $(seq 60); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 1; done
  "$DOCKER" info >/dev/null 2>&1 || { tail -20 /var/log/macaron-dockerd.log >&2; exit 1; }
fi

BASE_IMAGE=$(image/base.sh)

secrets=$(mktemp -d /tmp/macaron-image.XXXXXX)
servers=()
cleanup() { for pid in "${servers[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$secrets"; }
trap cleanup EXIT

# This host's pip configuration, as one pip.conf for the build.
python3 - "$secrets" <<'PY' >"$secrets/folders"
import os, subprocess, sys
out = sys.argv[1]
settings = {}
for line in subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout.splitlines():
    key, _, value = line.partition("=")
    name = key.split(".", 1)[-1]
    settings[name] = value.strip().strip("'\"")
for env, name in (("PIP_INDEX_URL", "index-url"), ("PIP_EXTRA_INDEX_URL", "extra-index-url"),
                  ("PIP_FIND_LINKS", "find-links"), ("PIP_CERT", "cert"), ("PIP_TRUSTED_HOST", "trusted-host")):
    if os.environ.get(env):
        settings[name] = os.environ[env]
conf = {k: v for k, v in settings.items() if k in ("index-url", "extra-index-url", "trusted-host", "timeout",
                                                  "default-timeout", "retries")}
folders = [p for p in settings.get("find-links", "").split() if os.path.isdir(p)]
links = [p for p in settings.get("find-links", "").split() if not os.path.isdir(p)]
for i, _ in enumerate(folders):
    links.append(f"http://127.0.0.1:{{PORT{i}}}/")
if folders:
    conf["trusted-host"] = " ".join(filter(None, [conf.get("trusted-host", ""), "127.0.0.1"]))
if links:
    conf["find-links"] = " ".join(links)
if settings.get("cert") and os.path.isfile(settings["cert"]):
    conf["cert"] = "/run/secrets/pipca"
    with open(os.path.join(out, "pipca"), "wb") as f, open(settings["cert"], "rb") as src:
        f.write(src.read())
else:
    open(os.path.join(out, "pipca"), "w").close()
with open(os.path.join(out, "pip.conf.in"), "w") as f:
    f.write("[global]\n" + "".join(f"{k} = {v}\n" for k, v in conf.items()))
print("\n".join(folders))
PY

cp "$secrets/pip.conf.in" "$secrets/pip.conf"
i=0
while IFS= read -r folder; do
  [ -n "$folder" ] || continue
  port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  (cd "$folder" && exec python3 -m http.server "$port" --bind 127.0.0.1 >/dev/null 2>&1) &
  servers+=($!)
  sed -i "s/{PORT$i}/$port/" "$secrets/pip.conf"
  i=$((i + 1))
done <"$secrets/folders"

echo "building $IMAGE"
started=$(date +%s)
DOCKER_BUILDKIT=1 "$DOCKER" build --network host --progress plain \
  --secret id=pipconf,src="$secrets/pip.conf" --secret id=pipca,src="$secrets/pipca" \
  --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg REQUIREMENTS="$REQUIREMENTS" \
  -f image/cpu.Dockerfile -t "$IMAGE" . >"$secrets/build.log" 2>&1 \
  || { tail -40 "$secrets/build.log" >&2; exit 1; }
echo "built $IMAGE in $(( $(date +%s) - started )) s"
# Earlier builds of the image, untagged now, hold gigabytes each: remove them (the base stays tagged).
"$DOCKER" image prune -f >/dev/null
