#!/usr/bin/env bash
# Installs khub's build and test dependencies from Debian's packages.
# Idempotent: does nothing (and needs no network) when everything is present.
set -euo pipefail

PKGS=(build-essential cmake pkg-config clang libclang-rt-14-dev clang-format
      libcurl4-openssl-dev libarchive-dev zlib1g-dev libcjson-dev libssl-dev
      libelf-dev libmicrohttpd-dev python3 python3-pip curl
      libopenmpi-dev openmpi-bin) # MPI: khub run --tp N under mpirun (optional at build time)

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#PKGS[@]} packages present"
    exit 0
fi

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
