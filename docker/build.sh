#!/usr/bin/env bash
# Build (and optionally push) one of the bundle's images with BuildKit. Used by `make image` / `make image-eval`.
#
#   docker/build.sh --file docker/Dockerfile --tag ghcr.io/dapo-k8s/dapo:0.1.0-verl0.9.1 [--args docker/repro.args]
#                   [--push [--digest-file FILE]] [--platform linux/amd64] [-- <extra docker buildx build flags>]
#
# Relative paths are relative to the repository root.
# --args FILE   KEY=VALUE lines (comments with #, values may contain spaces), each passed as --build-arg
# --push        push to the registry named in --tag (log in first: docker login ghcr.io); default: --load locally
# --digest-file FILE  with --push: write the pushed image's digest (sha256:<64 hex>) to FILE, read from the build's
#               metadata (docker buildx build --metadata-file: containerimage.digest), and print it
# The OCI labels version/revision/source are filled from pyproject.toml and git.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
file="" tag="" args_file="" output="--load" platform="linux/amd64" digest_file=""
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --file) file="$2"; shift 2 ;;
        --tag) tag="$2"; shift 2 ;;
        --args) args_file="$2"; shift 2 ;;
        --push) output="--push"; shift ;;
        --digest-file) digest_file="$2"; shift 2 ;;
        --platform) platform="$2"; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        *) echo "build.sh: unknown option '$1' (see the header of $0)" >&2; exit 2 ;;
    esac
done
if [ -z "$file" ] || [ -z "$tag" ]; then
    echo "build.sh: --file and --tag are required" >&2; exit 2
fi
metadata=()
if [ -n "$digest_file" ]; then
    if [ "$output" != "--push" ]; then
        echo "build.sh: --digest-file needs --push (an image has a registry digest once it is pushed)" >&2; exit 2
    fi
    meta_file="$(mktemp)"
    trap 'rm -f "$meta_file"' EXIT
    metadata=(--metadata-file "$meta_file")
fi
case "$file" in /*) ;; *) file="$root/$file" ;; esac
case "$tag" in
    *:latest|*:) echo "build.sh: refusing tag '$tag': images are tagged with their pinned stack, never 'latest'" >&2; exit 2 ;;
    *:*) ;;
    *) echo "build.sh: tag '$tag' has no version (expected REPOSITORY:TAG)" >&2; exit 2 ;;
esac

build_args=()
if [ -n "$args_file" ]; then
    case "$args_file" in /*) ;; *) args_file="$root/$args_file" ;; esac
    [ -f "$args_file" ] || { echo "build.sh: build-argument file '$args_file' not found" >&2; exit 2; }
    while IFS= read -r line || [ -n "$line" ]; do
        case "$line" in ''|'#'*) continue ;; esac
        case "$line" in
            *=*) build_args+=(--build-arg "$line") ;;
            *) echo "build.sh: $args_file: line '$line' is not KEY=VALUE" >&2; exit 2 ;;
        esac
    done < "$args_file"
fi

version="$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$root/pyproject.toml" | head -n 1)"
revision="$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
if [ "$revision" != unknown ] && [ -n "$(git -C "$root" status --porcelain 2>/dev/null)" ]; then
    revision="${revision}-dirty"
fi

set -x
docker buildx build \
    --file "$file" \
    --platform "$platform" \
    --tag "$tag" \
    --build-arg "VERSION=$version" \
    --build-arg "REVISION=$revision" \
    ${build_args[@]+"${build_args[@]}"} \
    "$output" \
    ${metadata[@]+"${metadata[@]}"} \
    ${extra[@]+"${extra[@]}"} \
    "$root"
{ set +x; } 2>/dev/null
if [ -n "$digest_file" ]; then
    digest="$(tr -d '\n' < "$meta_file" | sed -n 's/.*"containerimage\.digest" *: *"\(sha256:[0-9a-f]\{64\}\)".*/\1/p')"
    if [ -z "$digest" ]; then
        echo "build.sh: the build metadata has no containerimage.digest; was $tag pushed?" >&2; exit 1
    fi
    mkdir -p "$(dirname "$digest_file")"
    printf '%s\n' "$digest" > "$digest_file"
    echo "build.sh: pushed $tag as ${tag%:*}@$digest"
fi
