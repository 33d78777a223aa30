#!/bin/sh
# AWS EFA support for NCCL, from release tarballs whose SHA-256 the caller supplies (build arguments; see
# docker/efa.args). Used by docker/Dockerfile only when EFA_INSTALLER_VERSION is set.
#
#   install-efa.sh VERSION SHA256                    the AWS EFA installer, userspace only: libfabric with the efa
#                                                    provider in /opt/amazon/efa and its rdma-core (replacing
#                                                    Ubuntu's); no kernel module, no limits.conf, no MPI
#   install-efa.sh --ofi-nccl VERSION SHA256 PREFIX  build the aws-ofi-nccl plugin (NCCL's libfabric net plugin)
#                                                    against /opt/amazon/efa and CUDA into PREFIX (builder stage)
set -eu

fail() { echo "install-efa.sh: $*" >&2; exit 2; }

fetch() {  # URL SHA256 OUT: download and verify, or fail naming the missing build argument
    [ -n "$2" ] || fail "no SHA-256 given for $1 (set the matching *_SHA256 build argument)"
    wget -q -O "$3" "$1"
    echo "$2  $3" | sha256sum -c - >/dev/null || fail "SHA-256 mismatch for $1"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ "${1:-}" = "--ofi-nccl" ]; then
    version=${2:-}; sum=${3:-}; prefix=${4:?prefix}
    [ -n "$version" ] || fail "AWS_OFI_NCCL_VERSION is required together with EFA_INSTALLER_VERSION"
    fetch "https://github.com/aws/aws-ofi-nccl/releases/download/v${version}-aws/aws-ofi-nccl-${version}.tar.gz" \
        "$sum" "$tmp/ofi.tar.gz"
    tar -xzf "$tmp/ofi.tar.gz" -C "$tmp"
    cd "$tmp/aws-ofi-nccl-${version}"
    ./configure --prefix="$prefix" --with-libfabric=/opt/amazon/efa --with-cuda=/usr/local/cuda \
        --enable-platform-aws --disable-tests
    make -j"$(nproc)"
    make install
    exit 0
fi

version=${1:-}; sum=${2:-}
[ -n "$version" ] || fail "usage: install-efa.sh VERSION SHA256"
fetch "https://efa-installer.amazonaws.com/aws-efa-installer-${version}.tar.gz" "$sum" "$tmp/efa.tar.gz"
tar -xzf "$tmp/efa.tar.gz" -C "$tmp"
apt-get update
# the installer brings its own rdma-core (with the efa provider); Ubuntu's packages of the same libraries go first
apt-get purge -y ibverbs-providers ibverbs-utils libibverbs1 librdmacm1 || true
cd "$tmp/aws-efa-installer"
./efa_installer.sh -y --minimal --skip-kmod --skip-limit-conf --no-verify
rm -rf /var/lib/apt/lists/*
test -e /opt/amazon/efa/lib/libfabric.so || fail "the EFA installer left no /opt/amazon/efa/lib/libfabric.so"
