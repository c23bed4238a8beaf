#!/usr/bin/env bash
# Fetch the ONNX Runtime C/C++ headers (they ship in no Python wheel) from Debian trixie's
# libonnxruntime-dev package into DEST (default: ~/.cache/ort-mtp/ort-headers) and print the
# include directory. Uses a private apt sources list and lists directory, so it works on any
# Debian/Ubuntu machine (bookworm has no such package) without touching the system's apt state.
# Only the headers are kept; nothing is installed.
set -euo pipefail
dest=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/ort-mtp/ort-headers}
if [ -f "$dest/include/onnxruntime_cxx_api.h" ]; then echo "$dest/include"; exit 0; fi
command -v apt-get >/dev/null || { echo "fetch_ort_headers: apt-get not found; set ORT_INCLUDE_DIR to a directory holding onnxruntime_cxx_api.h (from libonnxruntime-dev or an ONNX Runtime release archive)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
mkdir -p "$tmp/lists/partial" "$tmp/parts" "$tmp/deb"
echo "deb http://deb.debian.org/debian trixie main" > "$tmp/sources.list"
ao=(-o "Dir::Etc::sourcelist=$tmp/sources.list" -o "Dir::Etc::sourceparts=$tmp/parts"
    -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o Debug::NoLocking=1
    -o APT::Sandbox::User=root)
apt-get "${ao[@]}" update -qq >&2 || { echo "fetch_ort_headers: apt-get update from deb.debian.org failed" >&2; exit 1; }
(cd "$tmp/deb" && apt-get "${ao[@]}" download libonnxruntime-dev >&2) || { echo "fetch_ort_headers: could not download libonnxruntime-dev" >&2; exit 1; }
dpkg-deb -x "$tmp"/deb/libonnxruntime-dev_*.deb "$tmp/x"
mkdir -p "$dest.partial/include"
cp -r "$tmp/x/usr/include/onnxruntime/." "$dest.partial/include/"
rm -rf "$dest" && mv "$dest.partial" "$dest"
echo "$dest/include"
