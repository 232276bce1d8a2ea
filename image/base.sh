#!/usr/bin/env bash
# The project's own base image: Debian bookworm (minbase, Python 3.11) made with debootstrap from
# the Debian mirror this host's apt already uses, imported with `docker import`. No registry image
# is needed. The mirror is read from the host's apt sources when this runs; the image keeps no apt
# source (the final image installs nothing with apt).
#
#   image/base.sh            makes $BASE_IMAGE unless it exists, and prints its name
#
# The tag is this script's hash: a change to what the base holds makes a new base.
set -euo pipefail
DOCKER=${DOCKER:-docker}
BASE_IMAGE=${BASE_IMAGE:-macaron-base:bookworm-$(sha256sum "$0" | cut -c1-12)}

if "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  echo "$BASE_IMAGE"
  exit 0
fi

# The first Debian mirror of the host's apt configuration (deb822 .sources files or sources.list).
mirror=$(
  { cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ && !/security/ {print $2; exit}'; } ||
  true
)
if [ -z "$mirror" ]; then
  mirror=$(awk '$1 == "deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
fi
[ -n "$mirror" ] || { echo "error: no Debian mirror in this host's apt sources" >&2; exit 1; }

root=$(mktemp -d /tmp/macaron-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "debootstrap bookworm (minbase + python3) ..." >&2
# libnuma1: vLLM's CPU kernels link it. g++: torch's inductor compiles a few of vLLM's CPU ops at
# their first use (the sampler's logprob ranks): without a compiler the first request that asks for
# logprobs kills the engine (InvalidCxxCompiler). redis-server: the chart's Redis pod runs this image
# where no registry image can be pulled (macaron_ray/cluster/containers.py).
debootstrap --variant=minbase \
  --include=python3,python3-venv,python3-dev,ca-certificates,procps,iproute2,libnuma1,g++,redis-server \
  bookworm "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
rm -f "$root.log"
# No package source, no apt lists, no caches in the image.
rm -rf "$root"/etc/apt/sources.list "$root"/etc/apt/sources.list.d/* "$root"/var/lib/apt/lists/* \
  "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | "$DOCKER" import \
  --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
echo "made $BASE_IMAGE" >&2
echo "$BASE_IMAGE"
