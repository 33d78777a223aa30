#!/bin/sh
# AWS EFA software for NCCL, from the AWS EFA installer, which bundles the aws-ofi-nccl plugin: libfabric with the efa
# provider in /opt/amazon/efa, its rdma-core, and the plugin in /opt/amazon/ofi-nccl (EC2 user guide, "Get started
# with EFA and NCCL": "Libfabric is installed in the /opt/amazon/efa directory. The aws-ofi-nccl plugin is installed
# in the /opt/amazon/ofi-nccl directory"). Used by docker/Dockerfile when EFA_INSTALLER_VERSION is set
# (docker/efa.args, `make image EFA=1`).
#
#   install-efa.sh VERSION GPG_FINGERPRINT [SHA256]
#       download aws-efa-installer-VERSION.tar.gz, its signature (.sig) and AWS's public key, verify them (below),
#       then install the userspace parts only (no kernel module, no limits.conf: the node has them), with the flags
#       of AWS's verl-on-EKS recipe, and check that libfabric and the plugin are where NCCL will look
#   install-efa.sh --verify TARBALL SIGNATURE KEY GPG_FINGERPRINT [SHA256]
#       the verification step alone. It passes only when KEY's fingerprint is GPG_FINGERPRINT (the one AWS publishes
#       in the EC2 user guide), SIGNATURE is a good signature of that key over TARBALL, and -- when SHA256 is given --
#       TARBALL's SHA-256 is SHA256. Anything else exits 2 naming what failed, and nothing is installed: there is no
#       way to install the EFA software unverified.
set -eu

fail() { echo "install-efa.sh: $*" >&2; exit 2; }

verify() {  # TARBALL SIGNATURE KEY GPG_FINGERPRINT [SHA256]
    tarball=$1 sig=$2 key=$3 sum=${5:-}
    want=$(printf '%s' "$4" | tr -d ' ' | tr 'abcdef' 'ABCDEF')
    [ -n "$want" ] || fail "no GPG fingerprint given (EFA_INSTALLER_GPG_FINGERPRINT): the EFA installer is not installed unverified"
    for f in "$tarball" "$sig" "$key"; do
        [ -s "$f" ] || fail "$f is missing or empty"
    done
    command -v gpg >/dev/null || fail "gpg is needed to verify the EFA installer's signature"
    home=$(mktemp -d)
    gpg --homedir "$home" --batch --quiet --import "$key" 2>/dev/null || { rm -rf "$home"; fail "$key is not an OpenPGP public key"; }
    got=$(gpg --homedir "$home" --batch --with-colons --fingerprint 2>/dev/null | awk -F: '$1 == "fpr" {print $10; exit}')
    if [ "$got" != "$want" ]; then
        rm -rf "$home"
        fail "the signing key's fingerprint ${got:-(none)} is not the one AWS publishes, $want"
    fi
    # VALIDSIG: a good signature; its last field is the fingerprint of the signing key's primary key
    signer=$(gpg --homedir "$home" --batch --status-fd 1 --verify "$sig" "$tarball" 2>/dev/null \
        | awk '$2 == "VALIDSIG" {print $NF}') || true
    rm -rf "$home"
    [ "$signer" = "$want" ] || fail "$sig is not a good signature of $tarball by AWS's key $want"
    if [ -n "$sum" ]; then
        echo "$sum  $tarball" | sha256sum -c - >/dev/null 2>&1 || fail "SHA-256 of $tarball is not $sum"
    fi
    echo "install-efa.sh: $tarball verified (GPG signature by $want${sum:+, SHA-256 $sum})"
}

if [ "${1:-}" = "--verify" ]; then
    [ $# -ge 5 ] || fail "usage: install-efa.sh --verify TARBALL SIGNATURE KEY GPG_FINGERPRINT [SHA256]"
    verify "$2" "$3" "$4" "$5" "${6:-}"
    exit 0
fi

version=${1:-}; fingerprint=${2:-}; sum=${3:-}
[ -n "$version" ] || fail "usage: install-efa.sh VERSION GPG_FINGERPRINT [SHA256]"
[ -n "$fingerprint" ] || fail "no GPG fingerprint given (EFA_INSTALLER_GPG_FINGERPRINT): the EFA installer is not installed unverified"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
base=https://efa-installer.amazonaws.com
wget -q -O "$tmp/efa.tar.gz" "$base/aws-efa-installer-${version}.tar.gz"
wget -q -O "$tmp/efa.tar.gz.sig" "$base/aws-efa-installer-${version}.tar.gz.sig"
wget -q -O "$tmp/aws-efa-installer.key" "$base/aws-efa-installer.key"
verify "$tmp/efa.tar.gz" "$tmp/efa.tar.gz.sig" "$tmp/aws-efa-installer.key" "$fingerprint" "$sum"
tar -xzf "$tmp/efa.tar.gz" -C "$tmp"
apt-get update
# the installer brings its own rdma-core (with the efa provider); Ubuntu's packages of the same libraries go first
apt-get purge -y ibverbs-providers ibverbs-utils libibverbs1 librdmacm1 || true
cd "$tmp/aws-efa-installer"
# AWS's verl recipe (awsome-distributed-training 3.test_cases/pytorch/verl/kubernetes/rlvr/Dockerfile). Not
# --minimal: that installs neither libfabric nor the plugin (EC2 user guide: "without Libfabric and Open MPI").
./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify
rm -rf /var/lib/apt/lists/*
test -e /opt/amazon/efa/lib/libfabric.so || fail "the EFA installer left no /opt/amazon/efa/lib/libfabric.so"
plugin=$(find /opt/amazon/ofi-nccl -name 'libnccl-net*.so' 2>/dev/null | sort | head -n 1)
[ -n "$plugin" ] || fail "the EFA installer ${version} left no aws-ofi-nccl plugin (libnccl-net*.so) under /opt/amazon/ofi-nccl"
echo "install-efa.sh: EFA installer ${version}: libfabric in /opt/amazon/efa/lib, aws-ofi-nccl at ${plugin}"
