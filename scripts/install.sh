#!/bin/sh
# Installs sandbox-agent from a release tarball (README.md, "Install script"):
#
#   sh install.sh [--prefix DIR] [--sha256 HEX] TARBALL
#
# TARBALL   a path or an http(s) URL of
#           sandbox-agent-<version>-x86_64-unknown-linux-gnu.tar.gz
#           (scripts/dist makes it).
# --sha256  the tarball's expected SHA-256 (64 hex digits); without it, the
#           TARBALL.sha256 beside it (sha256sum's format) is the expectation.
# --prefix  installs DIR/bin/sandbox-agent (default /usr/local).
#
# A checksum that does not match stops it before anything is unpacked:
# exit 1, nothing installed. The tarball is unpacked in a temporary folder,
# the binary is run once (`--version`: it must run on this machine), then
# copied beside its destination and renamed over it, so a running server
# keeps its file and the next start gets the new one whole.
#
# Needs only sh, tar (with gzip), sha256sum, and curl or wget for a URL
# (plus mkdir, mktemp, cp, mv, rm, chmod, tr).
set -eu

prefix=/usr/local
expected=
source=

die() {
    echo "install.sh: $*" >&2
    exit 1
}

usage() {
    echo "usage: sh install.sh [--prefix DIR] [--sha256 HEX] TARBALL (a path or an http(s) URL)"
}

while [ "$#" -gt 0 ]; do
    case $1 in
        --prefix)
            [ "$#" -ge 2 ] || die "--prefix needs a folder"
            prefix=$2
            shift 2
            ;;
        --prefix=*)
            prefix=${1#--prefix=}
            shift
            ;;
        --sha256)
            [ "$#" -ge 2 ] || die "--sha256 needs 64 hex digits"
            expected=$2
            shift 2
            ;;
        --sha256=*)
            expected=${1#--sha256=}
            shift
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        -*)
            usage >&2
            die "unknown option $1"
            ;;
        *)
            [ -z "$source" ] || die "one tarball only (got $source and $1)"
            source=$1
            shift
            ;;
    esac
done
if [ -z "$source" ]; then
    usage >&2
    exit 2
fi
[ -n "$prefix" ] || die "--prefix is empty"

# 64 hex digits, lowercase (sha256sum's output).
checked_hex() {
    case $1 in
        *[!0-9a-fA-F]* | "") return 1 ;;
    esac
    [ "${#1}" -eq 64 ] || return 1
    printf '%s\n' "$1" | tr 'A-F' 'a-f'
}
if [ -n "$expected" ]; then
    expected=$(checked_hex "$expected") || die "--sha256 wants 64 hex digits, got '$expected'"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/sandbox-agent-install.XXXXXX")
staged=
cleanup() {
    rm -rf "$work"
    if [ -n "$staged" ]; then rm -f "$staged"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

download() { # URL FILE
    if command -v curl >/dev/null 2>&1; then
        curl --fail --silent --show-error --location --proto '=http,https' --output "$2" "$1"
    elif command -v wget >/dev/null 2>&1; then
        wget --quiet --output-document="$2" "$1"
    else
        die "curl or wget is needed to download $1"
    fi
}

# The tarball (and its .sha256, unless --sha256 gave the expectation) into
# the temporary folder: what is checked is what is unpacked.
case $source in
    http://* | https://*)
        download "$source" "$work/tarball" || die "cannot download $source"
        if [ -z "$expected" ]; then
            download "$source.sha256" "$work/sha256" ||
                die "cannot download $source.sha256 (or give --sha256 HEX)"
        fi
        ;;
    *)
        [ -f "$source" ] || die "no such file: $source"
        cp "$source" "$work/tarball" || die "cannot read $source"
        if [ -z "$expected" ]; then
            [ -f "$source.sha256" ] || die "no $source.sha256 beside it (or give --sha256 HEX)"
            cp "$source.sha256" "$work/sha256" || die "cannot read $source.sha256"
        fi
        ;;
esac
if [ -z "$expected" ]; then
    listed=
    # (A last line without a newline still fills `listed`.)
    read -r listed _ <"$work/sha256" || :
    expected=$(checked_hex "$listed") || die "$source.sha256 does not start with a SHA-256 (64 hex digits)"
fi

actual=$(sha256sum "$work/tarball") || die "sha256sum failed"
actual=${actual%% *}
if [ "$actual" != "$expected" ]; then
    echo "install.sh: checksum mismatch for $source" >&2
    echo "  expected $expected" >&2
    echo "  actual   $actual" >&2
    die "refusing to install it; nothing was installed"
fi

mkdir "$work/unpacked"
tar -xzf "$work/tarball" -C "$work/unpacked" || die "cannot unpack $source (not a .tar.gz?)"
set -- "$work"/unpacked/sandbox-agent-*/sandbox-agent
if [ "$#" -ne 1 ] || [ ! -f "$1" ] || [ -L "$1" ]; then
    die "$source holds no sandbox-agent-<version>-<target>/sandbox-agent file"
fi
binary=$1
chmod 0755 "$binary"
version=$("$binary" -V 2>&1) || die "the binary does not run on this machine: $version"

mkdir -p "$prefix/bin" || die "cannot create $prefix/bin"
destination="$prefix/bin/sandbox-agent"
# Copied beside the destination (same file system), then renamed over it.
staged="$prefix/bin/.sandbox-agent.install.$$"
cp "$binary" "$staged" || die "cannot write $staged"
chmod 0755 "$staged"
mv -f "$staged" "$destination" || die "cannot move the binary to $destination"
staged=
echo "installed $version to $destination"
