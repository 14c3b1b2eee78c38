#!/usr/bin/env bash
# Installs everything fleetlet's tests and demo need on a fresh Debian machine of this kind:
# Debian packages, the project with its extras, the Kubernetes/etcd/kwok binaries (taken from
# KUBEBUILDER_ASSETS or the cache, else built once from the Go module proxy), the pinned helm
# and kustomize fleetlet renders with, and the sops, cosign, gitsign and notation the tests
# encrypt and sign with (same machinery, ~/.cache/fleetlet/tools/<name>-<version>/).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[install] %s\n' "$*" >&2; }

need_apt=()
command -v docker-registry >/dev/null || need_apt+=(docker-registry)
command -v htpasswd >/dev/null || need_apt+=(apache2-utils)
command -v git >/dev/null || need_apt+=(git)
[ -x /usr/lib/git-core/git-http-backend ] || need_apt+=(git)
# Signed fleet commits are checked with ssh-keygen -Y (tests/test_signed_commits.py).
command -v ssh-keygen >/dev/null || need_apt+=(openssh-client)
# The dashboard's browser tests drive Debian's chromium (Playwright never downloads one).
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
# The image tests build the agent image on a Debian base and run it (tests/test_image.py).
for tool in podman buildah mmdebstrap runc; do
  command -v "$tool" >/dev/null || need_apt+=("$tool")
done
command -v newuidmap >/dev/null || need_apt+=(uidmap)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# The locked versions (requirements/ci.txt, made by scripts/lock.sh), the same ones the images
# install, exactly as locked (--no-deps: the lock names every dependency with its hash, and pip
# 23's resolver otherwise reaches for a newer release to satisfy an extra, such as
# sigstore-rekor-types' pydantic[email], and refuses it as unpinned); then the project itself,
# without resolving anything again.
log "pip install --require-hashes --no-deps -r requirements/ci.txt; pip install --no-deps -e ."
python3 -m pip install -q --disable-pip-version-check --require-hashes --no-deps -r requirements/ci.txt
python3 -m pip install -q --disable-pip-version-check --no-deps -e .

# The example format plugin (its own distribution, with the jsonnet bindings from PyPI):
# the plugin tests render and deploy with it.
log "pip install ./examples/fleetlet-jsonnet"
python3 -m pip install -q --disable-pip-version-check ./examples/fleetlet-jsonnet

log "Kubernetes control-plane binaries, helm and kustomize, and the sops, cosign, gitsign and notation the tests encrypt and sign with, built side by side (a cold build from the Go module proxy takes about 15 minutes on two cores; seconds when cached)"
python3 -m tests.realenv.binaries
