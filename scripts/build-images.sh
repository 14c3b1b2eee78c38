#!/usr/bin/env bash
# Builds the agent and hub images here, on a machine that reaches Debian's packages and PyPI but
# no container registry: the base image is made from Debian packages (mmdebstrap + podman
# import), then deploy/images/<name>.Containerfile, unchanged, is built on it with buildah.
#
#   scripts/build-images.sh [agent|hub|all] [--tools auto|none|bundled] [--base IMAGE]
#
# --tools  auto (default): bundle helm and kustomize when the pinned builds are in
#          ~/.cache/fleetlet/tools/<name>-<version>/<name> (python3 -m tests.realenv.binaries),
#          else build without them and say so; bundled: require them; none: leave them out.
# --base   build on IMAGE instead of the Debian one (e.g. python:3.11-slim where a registry is
#          reachable).
#
# Each image is tagged localhost/fleetlet-<name>:<version> and :src-<hash>, where <hash> covers
# everything the build reads (Containerfile, lock, sources, tools, base image, build args); an
# image whose :src-<hash> exists is not built again. The last line on stdout is, per image,
# "<name> <reference>"; sizes go to stderr. Needs root (or rootless podman set up), podman,
# buildah, mmdebstrap.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."

log() { printf '[build-images] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

which=all tools=auto base=""
while [ $# -gt 0 ]; do
  case "$1" in
    agent|hub|all) which=$1 ;;
    --tools) tools=${2:?--tools needs a value}; shift ;;
    --tools=*) tools=${1#--tools=} ;;
    --base) base=${2:?--base needs a value}; shift ;;
    --base=*) base=${1#--base=} ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
  shift
done
case "$tools" in auto|none|bundled) ;; *) die "--tools must be auto, none or bundled" ;; esac
for tool in podman buildah; do
  command -v "$tool" >/dev/null || die "$tool is not installed (apt-get install podman buildah)"
done

# What made podman and buildah run on these machines (docs/operations.md, "Building the
# images"): crun cannot raise RLIMIT_NOFILE past the hard limit and refuses hybrid cgroups.
if [ -z "${CONTAINERS_CONF:-}" ]; then
  export CONTAINERS_CONF="${XDG_CACHE_HOME:-$HOME/.cache}/fleetlet/containers.conf"
  mkdir -p "$(dirname "$CONTAINERS_CONF")"
  cat >"$CONTAINERS_CONF" <<'CONF'
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
CONF
fi

version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
lockdir="${XDG_CACHE_HOME:-$HOME/.cache}/fleetlet"
mkdir -p "$lockdir"
exec 9>"$lockdir/build-images.lock"
flock 9  # one build at a time (tests and people may start it together)

# --- the base: Debian packages only ----------------------------------------------------------
DEBIAN_BASE=localhost/fleetlet-base:bookworm
if [ -z "$base" ]; then
  base=$DEBIAN_BASE
  if ! podman image exists "$base"; then
    command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (apt-get install mmdebstrap)"
    log "making $base from Debian bookworm packages (mmdebstrap, about 40 s)"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # essential + python3: no apt, no perl; merged /usr without the usrmerge package (and so
    # without perl); no documentation, manuals or translations.
    mmdebstrap --quiet --variant=essential \
      --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
      --include=python3,python3-venv,ca-certificates,passwd \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      bookworm "$tmp/base.tar" >&2
    podman import --quiet \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["/usr/bin/python3"]' \
      "$tmp/base.tar" "$base" >/dev/null
    rm -rf "$tmp"
    trap - EXIT
  fi
fi
base_id=$(podman image inspect --format '{{.Id}}' "$base" 2>/dev/null) \
  || die "base image $base is not in local storage (podman pull it first)"

# --- helm and kustomize, from the pinned builds -------------------------------------------------
stage_tools() {
  local dest=deploy/images/tools found=0 name path
  rm -f "$dest/helm" "$dest/kustomize"
  for name in helm kustomize; do
    path=$(tool_path "$name") || continue
    install -m 0755 "$path" "$dest/$name"
    found=$((found + 1))
  done
  [ "$found" -eq 2 ]
}
tool_path() {
  # The pinned release when agent.render.tools says which, else the one release in the cache.
  local name=$1 version candidates
  version=$(python3 -c "from agent.render.tools import PINNED_TOOLS; print(PINNED_TOOLS['$name'])" \
    2>/dev/null) || version='*'
  # shellcheck disable=SC2206
  candidates=( ${FLEETLET_CACHE:-$HOME/.cache/fleetlet}/tools/$name-$version/$name )
  [ "${#candidates[@]}" -eq 1 ] && [ -x "${candidates[0]}" ] && echo "${candidates[0]}"
}
tools_arg=none
if [ "$which" != hub ]; then
  case "$tools" in
    none) rm -f deploy/images/tools/helm deploy/images/tools/kustomize ;;
    bundled) stage_tools || die "--tools bundled: helm and kustomize are not both in the cache (python3 -m tests.realenv.binaries)"; tools_arg=bundled ;;
    auto)
      if stage_tools; then tools_arg=bundled
      else log "helm/kustomize not in the cache: building the agent WITHOUT them (plain format only; --tools bundled requires them)"
      fi ;;
  esac
fi

# --- build ---------------------------------------------------------------------------------------
context_hash() {
  local containerfile=$1
  {
    printf 'base=%s tools=%s version=%s\n' "$base_id" "$tools_arg" "$version"
    find pyproject.toml README.md requirements agent hub fleetlet deploy/images/tools "$containerfile" \
      -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 \
      | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
}

# A network that inspects TLS: pip inside the build trusts what pip here trusts.
secret=()
ca=${PIP_CERT:-${SSL_CERT_FILE:-}}
[ -n "$ca" ] && [ -s "$ca" ] && secret=(--secret "id=pip-ca,src=$ca")

build() {
  local name=$1 file=deploy/images/$1.Containerfile hash ref started
  hash=$(context_hash "$file")
  ref=localhost/fleetlet-$name:src-$hash
  if podman image exists "$ref"; then
    log "$ref is up to date (cached by content)"
  else
    log "building $ref on $base"
    started=$(date +%s)
    buildah bud --quiet --isolation chroot --layers --network host "${secret[@]}" \
      --build-arg "BASE=$base" --build-arg "TOOLS=$tools_arg" --build-arg "VERSION=$version" \
      -f "$file" -t "$ref" -t "localhost/fleetlet-$name:$version" . >&2
    log "built $ref in $(( $(date +%s) - started )) s"
  fi
  local size
  size=$(podman image inspect --format '{{.Size}}' "$ref")
  log "$ref: $((size / 1000000)) MB uncompressed"
  echo "$name $ref"
}

case "$which" in
  agent|hub) build "$which" ;;
  all) build agent; build hub ;;
esac
