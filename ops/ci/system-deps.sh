#!/bin/bash
# System packages the multi-host tests (tests/test_multihost*.py) use: network namespaces
# (iproute2), sshd per namespace host (openssh-server), Slurm (slurm-wlm, munge) and Prometheus.
# Idempotent and quiet: installs only what is missing. Needs root and apt; without them it says
# so and exits 0, and those tests skip with their reason.
set -euo pipefail
PACKAGES=(iproute2 openssh-server openssh-client slurm-wlm munge prometheus rsync)
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "system-deps.sh: not root or no apt-get; the multi-host tests will skip" >&2
    exit 0
fi
missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    # --no-install-recommends: slurm-wlm recommends a desktop's worth; policy-rc.d: start no daemon
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then  # ours only: a container's own one stays
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
