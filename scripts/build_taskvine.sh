#!/usr/bin/env bash
# Build TaskVine (cctools) from Debian's cctools source package into a prefix inside the
# project, against the project's own Python.
#
#   scripts/build_taskvine.sh [--prefix DIR [--link]] [--python PY] [--stock]
#   scripts/build_taskvine.sh --check-series   # does the series apply to what the mirror has?
#
# - The orig tarball is fetched with apt's own downloader from the Debian mirror that is
#   already configured in this machine's apt sources (never a hard-coded host), and its
#   SHA-256 is checked against the pins below, which match Debian's source indices.
# - Versions are tried newest first (sid 7.15.x, then trixie 7.14.x: the series applies to
#   7.15.9 only, scripts/patches/cctools/README.md says which patch stops the others).
# - Only what datavine needs is built: dttools, batch_job (vine_factory), taskvine,
#   resource_monitor and poncho; chirp, parrot, makeflow and friends are skipped.
# - Patches: scripts/patches/cctools/*.patch are applied in name order (patch -p1); each
#   says at its top why (what was measured) and its upstream status.
# - Idempotent: a prefix whose stamp matches (version, checksum, python, bindings, and a
#   hash of the patches' bodies: their headers are documentation) is reused; changing,
#   adding or removing a patch rebuilds. Either way it prints the source and the patches.
# - A .pth file makes `ndcctools.taskvine` importable from the python's environment: for
#   the project's prefix (build/cctools), or another `--prefix` given with `--link`. Without
#   `--link` another prefix leaves the python's TaskVine as it was (say: a second build for a
#   comparison would silently switch every test and run of that environment to it) and
#   prints how to use it (DATAVINE_CCTOOLS and PYTHONPATH, as the stock lane does).
# - The Python bindings are generated with `swig -threads`: every TaskVine call, above all
#   `Manager.wait`, releases the GIL, so the client's other threads (datavine's watchdog,
#   the progress bar) run while the manager waits on a worker (see release_gil below).
# - --stock: TaskVine as released, the same source with no patch and the bindings as
#   upstream generates them (the GIL held), into build/cctools-stock by default and never
#   linked into the python (no .pth: the stock lane puts it first on PYTHONPATH, with
#   DATAVINE_CCTOOLS, see scripts/test.sh). What datavine loses on it: `datavine doctor`.
# - --check-series: fetch every cctools version the mirror's source indices list (sid,
#   testing, experimental, trixie; checksums from the signed indices) and say, patch by
#   patch, whether the series applies to each (scripts/check_patch_series.sh); builds nothing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MAIN_PREFIX="$ROOT/build/cctools"
PREFIX=""
PYTHON="$ROOT/.venv/bin/python"
STOCK=0 CHECK=0 LINK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) PREFIX=$2; shift 2 ;;
    --link) LINK=1; shift ;;
    --python) PYTHON=$2; shift 2 ;;
    --stock) STOCK=1; shift ;;
    --check-series) CHECK=1; shift ;;
    *) echo "build_taskvine: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ "$STOCK" = 1 ]; then
  PREFIX=${PREFIX:-$ROOT/build/cctools-stock}
else
  PREFIX=${PREFIX:-$MAIN_PREFIX}
fi
PREFIX=$(realpath -m "$PREFIX")  # build/cctools and $ROOT/build/cctools are one prefix
mkdir -p "$(dirname "$PREFIX")"
PREFIX=$(cd "$(dirname "$PREFIX")" && pwd)/$(basename "$PREFIX")
if [ "$STOCK" = 1 ] && [ "$PREFIX" = "$MAIN_PREFIX" ]; then
  echo "build_taskvine: --stock never builds into $MAIN_PREFIX (the patched build)" >&2; exit 2
fi

# version  suite  sha256 of cctools_<version>.orig.tar.xz (from Debian's Sources index)
PINS=(
  "7.15.9 sid b9a2ee0be80354d124ee3f9835926d94c4d995c43b7d426ea7b91ba06e010f87"
  "7.14.5 trixie ce84eb9fdfa4dccc2dc9d9bab7f745906135aa33d6382496dfe4d3c76dc05027"
)

die() { echo "build_taskvine: $*" >&2; exit 1; }
log() { echo "build_taskvine: $*" >&2; }

[ -x "$PYTHON" ] || die "python '$PYTHON' not found (create the venv first: scripts/setup.sh)"
PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")  # the build changes directory
PYVER=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
PYBASE=$("$PYTHON" -c 'import sys; print(sys.base_prefix)')
PURELIB=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
STAMP="$PREFIX/.datavine-build"
WORK="$ROOT/build/work-$(basename "$PREFIX")"  # this prefix's source tree and logs
PATCH_DIR="$ROOT/scripts/patches/cctools"
if [ "$STOCK" = 1 ]; then
  BINDINGS="bindings=swig"  # as upstream generates them: every call holds the GIL
  PATCH_FILES=()
else
  BINDINGS="bindings=swig-threads"  # in the stamp: older builds held the GIL in every call
  PATCH_FILES=("$PATCH_DIR"/*.patch)
  [ -f "${PATCH_FILES[0]}" ] || die "no patch in $PATCH_DIR"
fi
# Stamps written before the hash left the patches' headers out: the series they stand for.
LEGACY_SERIES=(
  "patches=a66b4ece71540238e23ad12188be2e8d6e211a7daaeb0c943f312d51cd75e1a5 patch-bodies=8a3b722a4c9efedff612d27c8a40cfc9bedfa8406f02cbe49bac9921d95f001c"
)

patch_body() {  # a patch from its first diff line on: its header is documentation
  awk 'body || /^(diff |--- |Index: )/ {body = 1; print}' "$1"
}

patch_series() {  # "patch-bodies=<sha256>": each patch's name and body, in the order applied
  local p
  for p in "${PATCH_FILES[@]}"; do
    printf '%s\n' "$(basename "$p")"
    patch_body "$p"
  done | sha256sum | awk '{print "patch-bodies=" $1}'
}
PATCHES=$(patch_series)
SERIES_NAMES=$(for p in "${PATCH_FILES[@]}"; do basename "$p" .patch | cut -d- -f1; done \
  | paste -sd, -)
SERIES="series=${SERIES_NAMES:-none}"

stamp_matches() {  # the prefix holds this python's build of this series
  [ -f "$STAMP" ] && [ -x "$PREFIX/bin/vine_worker" ] || return 1
  grep -qx "python=$PYBASE" "$STAMP" && grep -qx "$BINDINGS" "$STAMP" || return 1
  grep -qx "$PATCHES" "$STAMP" && return 0
  local legacy
  for legacy in "${LEGACY_SERIES[@]}"; do
    [ "${legacy#* }" = "$PATCHES" ] && grep -qx "${legacy%% *}" "$STAMP" && return 0
  done
  return 1
}

say_used() {  # $1: built / reusing; the source and the patches this prefix holds
  log "$1 $PREFIX: $(head -1 "$STAMP"); $BINDINGS; patches ${SERIES_NAMES:-none (stock)}"
}

link_python() {
  local site="$PREFIX/lib/python$PYVER/site-packages"
  [ -d "$site/ndcctools" ] || die "no ndcctools under $site after the build"
  if [ "$PREFIX" != "$MAIN_PREFIX" ] && [ "$LINK" = 0 ]; then
    log "$PYTHON's TaskVine left as it was (--link to make it this one); to use this build:" \
      "DATAVINE_CCTOOLS=$PREFIX PYTHONPATH=$site"
    return 0
  fi
  echo "$site" > "$PURELIB/datavine-cctools.pth"
  "$PYTHON" -c 'import ndcctools.taskvine' || die "ndcctools.taskvine does not import in $PYTHON"
}

release_gil() {  # in the unpacked source: SWIG wraps every call in Py_BEGIN_ALLOW_THREADS
  local dir=taskvine/src/bindings/python3
  sed -i 's/ -python -I/ -python -threads -I/' "$dir/Makefile"
  grep -q -- '-python -threads' "$dir/Makefile" || die "cannot add -threads to $dir/Makefile"
  # The one wrapped function that builds a Python object must keep the GIL.
  if grep -q 'PyObject \*vine_file_contents_as_bytes' "$dir/taskvine.i"; then
    sed -i '0,/^%inline %{/s//%nothread vine_file_contents_as_bytes;\n%inline %{/' "$dir/taskvine.i"
    grep -q '^%nothread vine_file_contents_as_bytes;' "$dir/taskvine.i" \
      || die "cannot mark vine_file_contents_as_bytes %nothread in $dir/taskvine.i"
  fi
}

if [ "$CHECK" = 0 ] && stamp_matches; then
  say_used "reusing"
  [ "$STOCK" = 1 ] || link_python
  exit 0
fi

# --- find the Debian mirror configured on this machine ---------------------------------
mirror=""
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  m=$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i ~ /debian\/?$/) {print $i; exit}}' "$f")
  [ -n "$m" ] && { mirror=$m; break; }
done
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^(https?|ftp):\/\/.*debian\/?$/) {print $i; exit}}' \
    /etc/apt/sources.list)
fi
[ -n "$mirror" ] || die "no Debian mirror found in /etc/apt/sources.list{,.d}; cannot fetch cctools"
mirror=${mirror%/}

# --- ask the mirror which versions it has (a private apt state, the system's is untouched) --
APTDIR="$ROOT/build/apt-src"
mkdir -p "$APTDIR/lists/partial" "$ROOT/build/downloads"
: > "$APTDIR/sources.list"
SUITES=()
for pin in "${PINS[@]}"; do read -r _ suite _ <<<"$pin"; SUITES+=("$suite"); done
[ "$CHECK" = 1 ] && SUITES+=(testing experimental)  # anything newer than the pins
for suite in "${SUITES[@]}"; do
  echo "deb-src $mirror $suite main" >> "$APTDIR/sources.list"
done
APTOPT=(-o "Dir::Etc::SourceList=$APTDIR/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$APTDIR/lists" -o Acquire::Languages=none)
apt-get "${APTOPT[@]}" update >"$APTDIR/update.log" 2>&1 \
  || log "apt-get update of the source indices failed (see $APTDIR/update.log); trying cached tarballs"
available=$(apt-cache "${APTOPT[@]}" showsrc cctools 2>/dev/null | awk '/^Version:/ {print $2}' || true)
directory=$(apt-cache "${APTOPT[@]}" showsrc cctools 2>/dev/null | awk '/^Directory:/ {print $2; exit}' || true)
directory=${directory:-pool/main/c/cctools}

fetch() {  # fetch VERSION SHA256: the verified orig tarball's path on stdout, or fail
  local version=$1 sha=$2 file="$ROOT/build/downloads/cctools_$1.orig.tar.xz"
  if [ -f "$file" ] && echo "$sha  $file" | sha256sum -c --quiet - 2>/dev/null; then
    echo "$file"; return 0
  fi
  if ! grep -q "^\([0-9]*:\)\?$version-" <<<"$available"; then
    log "cctools $version is not in the mirror's index"
    return 1
  fi
  log "fetching cctools $version from $mirror"
  if /usr/lib/apt/apt-helper download-file "$mirror/$directory/cctools_$version.orig.tar.xz" \
       "$file.part" "SHA256:$sha" >"$APTDIR/fetch-$version.log" 2>&1 \
     && echo "$sha  $file.part" | sha256sum -c --quiet -; then
    mv "$file.part" "$file"; echo "$file"; return 0
  fi
  rm -f "$file.part"
  log "cctools $version: download or checksum failed (see $APTDIR/fetch-$version.log)"
  return 1
}

if [ "$CHECK" = 1 ]; then  # every upstream version the indices list, newest first
  listed=$(apt-cache "${APTOPT[@]}" showsrc cctools 2>/dev/null | awk '
    /^Version:/ {v = $2; sub(/^[0-9]+:/, "", v); sub(/-[^-]*$/, "", v)}
    /^Checksums-Sha256:/ {sums = 1; next}
    sums && /^ / {if ($3 == "cctools_" v ".orig.tar.xz") print v, $1; next}
    {sums = 0}' | sort -u | sort -rV)
  [ -n "$listed" ] || die "the mirror's source indices list no cctools (see $APTDIR/update.log)"
  log "cctools versions in the mirror's source indices (${SUITES[*]}): $(cut -d' ' -f1 \
    <<<"$listed" | paste -sd' ' -); the newest is $(head -1 <<<"$listed" | cut -d' ' -f1)"
  tarballs=()
  while read -r version sha; do
    file=$(fetch "$version" "$sha") && tarballs+=("$file")
  done <<<"$listed"
  [ ${#tarballs[@]} -gt 0 ] || die "no listed cctools version could be fetched and verified"
  exec bash "$ROOT/scripts/check_patch_series.sh" "${tarballs[@]}"
fi

tarball=""
for pin in "${PINS[@]}"; do
  read -r version suite sha <<<"$pin"
  tarball=$(fetch "$version" "$sha") && break
  log "cctools $version ($suite) cannot be used; trying the next version"
  tarball=""
done
[ -n "$tarball" ] || die "no supported cctools version could be fetched and verified (tried: ${PINS[*]%% *})"
version=$(basename "$tarball" | sed 's/cctools_\(.*\)\.orig\.tar\.xz/\1/')
sha=$(sha256sum "$tarball" | cut -d' ' -f1)

# --- build -------------------------------------------------------------------------------
command -v swig >/dev/null || die "swig is missing (apt-get install swig)"
SRC="$WORK/src"
rm -rf "$SRC" && mkdir -p "$SRC"
tar -C "$SRC" -xf "$tarball"
cd "$SRC/cctools-$version"
log "source: cctools $version ($tarball, sha256 $sha)"
for p in "${PATCH_FILES[@]}"; do
  log "applying $(basename "$p")"
  patch -p1 --silent < "$p" || die "patch $(basename "$p") does not apply to cctools $version" \
    "(scripts/patches/cctools/README.md: the versions the series applies to)"
done
[ "$STOCK" = 1 ] && log "stock: no patch, bindings as upstream generates them" || release_gil
log "configuring cctools $version for $PYBASE (log: $WORK/configure.log)"
./configure --prefix "$PREFIX" --with-python3-path "$PYBASE" --with-perl-path no \
  --without-system-chirp --without-system-parrot --without-system-makeflow \
  --without-system-grow --without-system-ftp-lite --without-system-doc \
  >"$WORK/configure.log" 2>&1 || die "configure failed (see $WORK/configure.log)"
log "building (log: $WORK/make.log)"
make -j"$(nproc)" >"$WORK/make.log" 2>&1 || die "make failed (see $WORK/make.log)"
rm -rf "$PREFIX"
make install >>"$WORK/make.log" 2>&1 || die "make install failed (see $WORK/make.log)"
printf 'cctools %s sha256=%s\npython=%s\n%s\n%s\n%s\n' "$version" "$sha" "$PYBASE" \
  "$BINDINGS" "$PATCHES" "$SERIES" > "$STAMP"
rm -rf "$SRC"
[ "$STOCK" = 1 ] || link_python
say_used "installed into"
